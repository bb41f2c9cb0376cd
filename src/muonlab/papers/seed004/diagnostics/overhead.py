"""Seed 004 Table 27 (App. J.9): optimizer-state memory and step time of Hybrid Muon, Sign and AF-Muon
on one setting (a preset of any seed-004 family).

- State bytes, analytic: the model built on the meta device at the preset's shape and vocabulary, each
  arm's optimizer with every state tensor created as its first step creates it, counted (one fp32
  buffer per tensor for Sign / AF-Muon; AdamW's two on Hybrid's table and vectors). Nothing is allocated,
  so the paper's shapes (up to Llama-3.2-1B) cost nothing.
- Step time and peak memory, measured (`measure`): the arms run one after another as the paper's (each
  its own model from the same seed, `warmup` steps then the median of `steps`), a full optimizer step
  each (the preset's micro-batches of random tokens: forward, backward, clipping, the optimizer), with
  `torch.cuda.max_memory_allocated` after resetting the peak on CUDA (not measured elsewhere).
The paper's Table 27 is beside the four settings it has; its NanoGPT and SmolLM2 state sizes do not
follow from one fp32 buffer per tensor (seed 004 App. J.9 gives no formula): both numbers are shown, and the difference.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from muonlab.optim.af_muon import state_bytes
from muonlab.settings import integer_at_least
from muonlab.diagnostics import Command, DEVICE_OPTIONS

ARMS = ("t1_hybrid", "t1_sign", "t1_afmuon")
GIB = 2**30
# seed 004 Table 27: optimizer state (GiB) Hybrid -> Sign/AF, step time (s) H / S / AF, peak allocated (GiB) H -> AF
PAPER_TABLE27 = {
    "nanogpt-124m": {"state_gib": (0.63, 0.49), "step_s": (6.306, 6.331, 6.386), "peak_gib": (18.603, 18.461)},
    "smollm2-135m": {"state_gib": (0.55, 0.45), "step_s": (11.858, 11.864, 11.928), "peak_gib": (25.000, 24.895)},
    "qwen2.5-0.5b": {"state_gib": (2.35, 1.84), "step_s": (24.193, 24.245, 24.459), "peak_gib": (23.260, 22.752)},
    "llama-3.2-1b": {"state_gib": (5.58, 4.60), "step_s": (16.330, 16.395, 16.486), "peak_gib": (74.766, 73.787)},
}


def default_vocab(preset_name: str) -> int:
    """The table the preset trains (muonlab.lab.paper.cost.default_vocab)."""
    from muonlab.config import preset
    from muonlab.lab.paper.cost import default_vocab as of_config

    return of_config(preset(preset_name))


def _build(arm: str, preset_name: str, vocab: int, device: torch.device, overrides: dict | None = None):
    from muonlab.arms import resolve_config
    from muonlab.device import Runtime
    from muonlab.train.build import build_model, build_optimizer

    cfg = resolve_config(arm, preset_name, {"runtime.device": str(device), **(overrides or {})})
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, vocab, Runtime(device, "fp32"))
    return cfg, model, build_optimizer(model, cfg, compile_step=False)


def analytic_state(preset_name: str, vocab: int | None = None, arms=ARMS) -> dict[str, int]:
    """Each arm's optimizer-state bytes at the preset's shape, built on the meta device."""
    vocab = vocab or default_vocab(preset_name)
    out = {}
    for arm in arms:
        _, model, opt = _build(arm, preset_name, vocab, torch.device("meta"))
        _first_step_state(opt)
        out[arm] = state_bytes(opt)
    return out


def _first_step_state(opt) -> None:
    """Create every state tensor as the first step would (AFMuon.init_state; torch AdamW by its own rule)."""
    if hasattr(opt, "init_state"):
        opt.init_state()
        return
    for group in opt.param_groups:  # torch.optim.AdamW: exp_avg, exp_avg_sq (fp32 like the parameter), step
        for p in group["params"]:
            opt.state[p].update(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))


def random_batch(cfg, vocab: int, device: torch.device, generator: torch.Generator):
    """One micro-batch of uniform random ids shaped as the family's loader shapes it: (x, y); the T5
    family's x is [source | decoder input] (S + T ids)."""
    B, T = cfg.train.device_batch_size, cfg.train.sequence_len
    S = (getattr(cfg.model, "source_len", None) or T) if cfg.family == "t5" else 0
    x = torch.randint(0, vocab, (B, S + T), generator=generator).to(device)
    y = torch.randint(0, vocab, (B, T), generator=generator).to(device)
    return x, y


class ArmStepper:
    """One arm's model and optimizer on the preset, taking full optimizer steps on random batches."""

    def __init__(self, arm: str, preset_name: str, vocab: int, device: torch.device, precision: str = "fp32",
                 micro_steps: int | None = None):
        from muonlab.device import autocast_context

        self.arm = arm
        self.cfg, self.model, self.optimizer = _build(arm, preset_name, vocab, device)
        self.device, self.vocab = device, vocab
        self.micro_steps = micro_steps or self.cfg.train.accum_steps_per_rank(1)
        self.autocast = (lambda: autocast_context(device, "bf16")) if precision == "bf16" else contextlib.nullcontext
        self.generator = torch.Generator().manual_seed(self.cfg.seed)

    def step(self) -> float:
        """Seconds of one optimizer step (synchronised on CUDA)."""
        batches = [random_batch(self.cfg, self.vocab, self.device, self.generator) for _ in range(self.micro_steps)]
        _sync(self.device)
        t0 = time.perf_counter()
        for x, y in batches:
            with self.autocast():
                loss = self.model(x, y) / self.micro_steps
            loss.backward()
        if self.cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        _sync(self.device)
        return time.perf_counter() - t0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(preset_name: str, device: str = "cpu", precision: str = "fp32", steps: int = 30, warmup: int = 5,
            micro_steps: int | None = None, vocab: int | None = None, arms=ARMS) -> dict:
    """Table 27 for one preset: analytic state bytes, and per arm (run one after another, as the paper's)
    the median step time and, on CUDA, the peak allocated memory."""
    from muonlab.errors import UsageError

    if steps < 0 or warmup < 0:
        raise UsageError(f"need --steps >= 0 and --warmup >= 0, got {steps} and {warmup}")
    from muonlab.config import all_presets

    family = all_presets().get(preset_name, {}).get("family")
    if family in ("autoresearch", "reuse"):  # before the Table-1 arms' optimizer meets a family without it
        raise UsageError(f"overhead compares seed 004's Table-1 optimizers on a tied-vocabulary preset; {preset_name} "
                         f"is a preset of the {family} family (--preset tied-cpu, hf-cpu, nanogpt-124m, ...)")
    dev = torch.device(device)
    vocab = vocab or default_vocab(preset_name)
    state = analytic_state(preset_name, vocab, arms)
    rows = {arm: {"state_bytes": state[arm], "measured_state_bytes": None, "step_s": None, "peak_gib": None}
            for arm in arms}
    for arm in arms if steps else ():  # --steps 0: the analytic state only (any shape, on any machine)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        stepper = ArmStepper(arm, preset_name, vocab, dev, precision, micro_steps)
        times = [stepper.step() for _ in range(warmup + steps)][warmup:]
        rows[arm] = {"state_bytes": state[arm], "measured_state_bytes": state_bytes(stepper.optimizer),
                     "step_s": statistics.median(times),
                     "peak_gib": torch.cuda.max_memory_allocated(dev) / GIB if dev.type == "cuda" else None}
        del stepper
    return _result(preset_name, device, precision, steps, warmup, micro_steps, vocab, rows)


def _result(preset_name, device, precision, steps, warmup, micro_steps, vocab, rows) -> dict:
    hybrid, af = rows.get("t1_hybrid"), rows.get("t1_afmuon")
    ratios = {}
    if hybrid and af:
        ratios = {"state_ratio": af["state_bytes"] / hybrid["state_bytes"],
                  "state_saved": 1 - af["state_bytes"] / hybrid["state_bytes"]}
        if af["step_s"] is not None:
            ratios["step_ratio"] = af["step_s"] / hybrid["step_s"]
    paper = PAPER_TABLE27.get(preset_name)
    if paper:
        (h, a) = paper["state_gib"]
        paper = {**paper, "state_saved": 1 - a / h, "step_ratio": paper["step_s"][2] / paper["step_s"][0]}
    return {"preset": preset_name, "device": device, "precision": precision, "steps": steps, "warmup": warmup,
            "micro_steps": micro_steps, "vocab": vocab, "arms": rows, **ratios, "paper": paper}


def format_table(res: dict) -> str:
    lines = [f"Optimizer state and step time on {res['preset']} (vocabulary {res['vocab']:,}; {res['device']} "
             f"{res['precision']}; median of {res['steps']} steps after {res['warmup']})",
             f"{'arm':<12} {'state GiB':>10} {'step s':>10} {'peak GiB':>10}"]
    for arm, r in res["arms"].items():
        peak = "n/a" if r["peak_gib"] is None else f"{r['peak_gib']:.3f}"
        step = "n/a" if r["step_s"] is None else f"{r['step_s']:.4f}"
        lines.append(f"{arm:<12} {r['state_bytes'] / GIB:>10.3f} {step:>10} {peak:>10}")
    if "state_ratio" in res:
        step = f", step {res['step_ratio']:.3f}x" if "step_ratio" in res else ""
        lines.append(f"AF-Muon / Hybrid: state {res['state_ratio']:.3f} (saved {100 * res['state_saved']:.1f}%){step}")
    if res["paper"]:
        p = res["paper"]
        lines.append(f"paper (Table 27): state {p['state_gib'][0]} -> {p['state_gib'][1]} GiB (saved "
                     f"{100 * p['state_saved']:.1f}%), step {p['step_ratio']:.3f}x, peak {p['peak_gib'][0]} -> "
                     f"{p['peak_gib'][1]} GiB")
        if "state_saved" in res:
            lines.append(f"saved: measured {100 * res['state_saved']:.1f}% vs paper {100 * p['state_saved']:.1f}% "
                         f"({100 * (res['state_saved'] - p['state_saved']):+.1f} points)")
    return "\n".join(lines)


COMMAND = Command(
    'overhead', "seed 004 Table 27: optimizer-state bytes (analytic) and step time / peak memory "
    "(measured) of Hybrid, Sign and AF-Muon on a seed-004 preset",
    options=(("--preset", dict(required=True, help="the setting (a seed-004 preset: tied-cpu, nanogpt-124m, "
        "smollm2-135m, t5gemma2, ...)")),
        ("--steps", dict(type=integer_at_least(0), default=30, help="timed steps per arm (paper 30; 0: state only)")),
        ("--warmup", dict(type=integer_at_least(0), default=5, help="untimed steps first (paper 5)")),
        ("--micro-steps", dict(type=integer_at_least(1), default=None,
        help="micro-batches a step (default: the preset's accumulation)")),
        ("--vocab", dict(type=integer_at_least(1), default=None, help="table rows (default: the preset's setting's)")),
        *DEVICE_OPTIONS),
    run=lambda a: measure(a.preset, device=a.device, precision=a.precision, steps=a.steps,
        warmup=a.warmup, micro_steps=a.micro_steps, vocab=a.vocab),
    format=format_table)
