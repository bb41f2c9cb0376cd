"""Seed 002's steps 0..11 trajectory audit of the six step-0 modes (§4.5 item 2), and the
harness both step-0 diagnostics (this and `step0_audit`) use: a run's first optimizer steps taken
exactly as `muonlab train` takes them.

Harness (`first_steps`), the same code path as training (muonlab.train.run._train_and_evaluate):
the config of a preset, arm and seed (muonlab.arms.resolve_config with `settings` on top) or of a
run directory (its config.json); the family's data (prepare_data); torch.manual_seed(seed) (and
the CUDA seed and "high" fp32 matmuls on CUDA), build_model, build_optimizer, torch.compile when
the run would compile, the train loader with the run's seed; then the training loop itself
(muonlab.train.loop.train_loop: the family's step hooks, Step0Control included, the schedule, the
micro-batches, the optimizer step), stopped through its `stop_requested` after `steps` steps, so
the schedule stays the full run's. Nothing of the loop is copied; it is observed through hooks:
- a post-accumulate-grad hook per scalar family: the gradient backprop produced ("grad");
- the optimizer's step pre-hook (after the control's before_step): the values, the gradient the
  optimizer sees ("grad_seen", None where the control removed it), the group's lr, betas, eps and
  weight decay after the schedule;
- its post-hook: values and state after the optimizer's update, before the control's after_step;
- on_step (after the control): values, state['step'], exp_avg, exp_avg_sq, the loss the run logs
  (the last micro-batch's, as upstream).
The global RNG (CPU and CUDA) is forked: the caller's stream is untouched.

Checks (`mode_checks`), each with a "passed" flag:
- replay: every step, mode and family, AdamW's update recomputed in float64 from the state before
  it, the gradient seen, lr, betas, eps and weight decay equals the recorded state['step'],
  exp_avg, exp_avg_sq and displacement (no gradient: nothing changes);
- step-0 semantics of seed 002 §4.5 item 2 / muonlab.optim.step0 on the controlled families (the
  others: the control leaves them as the optimizer left them), and step 1's t;
- disp_stepcount_nomom's step-1 multiplier sqrt(1 + b2) / (1 + b1) (0.7125 at betas 0.96, 0.95)
  and disp_only_nomom's 1.0000, where |g1| >= 1e4 eps (else eps, not the counter, sets it);
- every mode shares step 0's loss and gradients bitwise (the controls act after backprop).
Paper (d6, ClimbMix, compiled bf16 on GPU; seed 002 §4.5 item 2): step-11 losses of 12do_full, dcnt, nostep0_all
and "dcnt tracks 12do_full within 4e-4 over steps 1..11" are printed beside the measured values;
they compare in value only under that protocol.

Choices (the paper is silent): the displacement is taken after the optimizer's update and after
the control; a run's `num_steps` below `steps` is refused (the schedule would end early).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from muonlab.settings import integer_at_least
from muonlab.errors import UsageError
from muonlab.optim.step0 import ALL_FAMILIES, STEP0_MODES, Step0Control, family_params
from muonlab.diagnostics import Command, STEP0_RUN_OPTIONS

DEFAULT_PRESET, DEFAULT_ARM = "cpu-tiny", "12do_oe_decoupled_x0_out"  # seed 002's 12do, on the CPU preset
DEFAULT_STEPS = 12  # steps 0..11 (seed 002 §4.5)
SHORT = {"resid_lambdas": "resid", "x0_lambdas": "x0", "wte_lambdas": "wte", "out_lambdas": "out"}
# seed 002 §4.5 item 2: step-11 training loss per seed, d6 ClimbMix, compiled bf16
PAPER_STEP11_LOSS = {"none": {41: 5.4021, 42: 5.2774, 47: 5.4080},
                     "disp_stepcount_nomom": {41: 5.4020, 42: 5.2772, 47: 5.4080},
                     "nostep0_all": {41: 5.3296, 42: 5.3246, 47: 5.3194}}
PAPER_DCNT_TRACKS_FULL = 4e-4  # |loss(dcnt) - loss(12do_full)| over steps 1..11, every seed


def parse_settings(items: list[str] | None) -> dict[str, str]:
    """--set KEY=VALUE items (flag names, e.g. oe-m=1009) as config overrides."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects KEY=VALUE (a setting's flag name), got {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def cli_args(args) -> dict[str, Any]:
    """The harness's keyword arguments from `muonlab diagnose step0 ...` options."""
    return dict(run=args.run, preset=args.preset, arm=args.arm, seed=args.seed, settings=parse_settings(args.set),
                device=args.device, precision=args.precision)


@dataclass
class Setup:
    """What a run is built from: its config (device and precision applied), runtime and data."""
    cfg: Any  # RunConfig
    runtime: Any  # muonlab.device.Runtime
    data: Any  # the family's prepared data
    source: dict[str, Any]

    def describe(self) -> dict[str, Any]:
        from muonlab.train.run import use_compile  # noqa: PLC0415 (training's own decision)

        c = self.cfg
        return {**self.source, "preset_or_run": self.source.get("preset") or self.source.get("run"),
                "arm": c.arm, "seed": c.seed, "device": str(self.runtime.device), "precision": self.runtime.precision,
                "compile": use_compile(c, self.runtime), "depth": c.model.depth, "width": c.model.model_dim,
                "vocab": self.data.vocab_size, "sequence_len": c.train.sequence_len,
                "micro_batch": c.train.device_batch_size, "accum": c.train.accum_steps_per_rank(1),
                "num_steps": c.train.num_steps, "data_source": c.data.source, "step0_mode": c.optim.step0_mode,
                "oe_m": c.model.oe.m, "routing": c.model.routing.kind, "routing_out": c.model.routing.out,
                "routing_eps": c.model.routing.eps}


def setup(run: str | Path | None = None, preset: str | None = None, arm: str | None = None, seed: int | None = None,
          settings: dict[str, Any] | None = None, device: str | None = None, precision: str | None = None,
          log: Callable[[str], None] | None = None) -> Setup:
    """The run's config (a run directory's, or preset -> arm -> settings, seed), device, data.
    Defaults: preset cpu-tiny, arm 12do_oe_decoupled_x0_out, the arm's first paper seed; device and
    precision the config's (a run's `--device` / `--precision` when given)."""
    from muonlab.arms import get_arm, resolve_config  # noqa: PLC0415
    from muonlab.config import apply_overrides  # noqa: PLC0415
    from muonlab.diagnostics.runs import run_config  # noqa: PLC0415
    from muonlab.device import Runtime, detect_device, resolve_precision  # noqa: PLC0415
    from muonlab.families import get_family  # noqa: PLC0415

    runtime_over = {k: v for k, v in (("device", device), ("precision", precision)) if v is not None}
    if run is not None:
        if preset is not None or arm is not None or seed is not None or settings:
            raise UsageError("--run reads the run's own config: give --preset/--arm/--seed/--set without --run")
        cfg = apply_overrides(run_config(run), {**runtime_over, "quiet": True})
        source: dict[str, Any] = {"run": str(run)}
    else:
        preset, arm = preset or DEFAULT_PRESET, arm or DEFAULT_ARM
        seeds = get_arm(arm).seeds
        seed = seed if seed is not None else (seeds[0] if seeds else None)
        extra = {**(settings or {}), **runtime_over, "quiet": True, **({} if seed is None else {"seed": seed})}
        cfg = resolve_config(arm, preset, extra)
        source = {"preset": preset}
    if cfg.family != "autoresearch":
        raise UsageError(f"the step-0 audits are about the autoresearch GPT's residual scalars (seed 002); this "
                         f"config is of the {cfg.family!r} family")
    dev = detect_device(cfg.runtime.device)
    runtime = Runtime(dev, resolve_precision(cfg.runtime.precision, dev))
    data = get_family(cfg.family).prepare_data(cfg, log=log or (lambda _: None))
    return Setup(cfg, runtime, data, source)


def _values(t: torch.Tensor | None) -> list[float] | None:
    return None if t is None else t.detach().double().cpu().flatten().tolist()


def _state(state: dict) -> dict[str, Any]:
    step = state.get("step")
    return {"state_step": None if step is None else float(step), "exp_avg": _values(state.get("exp_avg")),
            "exp_avg_sq": _values(state.get("exp_avg_sq"))}


class _Tap:
    """The loader as the loop sees it; keeps copies of its first `keep` batches (step 0's micro-batches)."""

    def __init__(self, loader, keep: int):
        self.loader, self.keep, self.batches = loader, keep, []

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        batch = next(self.loader)
        if len(self.batches) < self.keep:
            self.batches.append((batch[0].detach().clone(), batch[1].detach().clone()))
        return batch


class _Recorder:
    """Per optimizer step and scalar family: what the module docstring lists."""

    def __init__(self, model, optimizer, steps: int):
        self.params, self.optimizer, self.steps = family_params(model), optimizer, steps
        self.groups = {name: next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
                       for name, p in self.params.items()}
        self.records: list[dict[str, Any]] = []
        self.taken = 0
        self._grad: dict[str, torch.Tensor] = {}
        self._current: dict[str, Any] = {}
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad(n)) for n, p in self.params.items()]
        self._handles += [optimizer.register_step_pre_hook(self._pre), optimizer.register_step_post_hook(self._post)]

    def _on_grad(self, name: str):
        def hook(p: torch.Tensor) -> None:  # after each micro-step: the last holds the accumulated gradient
            self._grad[name] = p.grad.detach().clone()
        return hook

    def _pre(self, optimizer, args, kwargs) -> None:
        fams = {}
        for name, p in self.params.items():
            g = self.groups[name]
            fams[name] = dict(value_before=_values(p), grad=_values(self._grad.get(name)), grad_seen=_values(p.grad),
                              lr=float(g["lr"]), betas=[float(b) for b in g["betas"]], eps=float(g["eps"]),
                              weight_decay=float(g["weight_decay"]))
        self._current = {"step": len(self.records), "families": fams}

    def _post(self, optimizer, args, kwargs) -> None:
        for name, p in self.params.items():
            f = self._current["families"][name]
            f["value_after_update"] = _values(p)
            f["after_update"] = _state(optimizer.state.get(p, {}))
        self.taken += 1

    def on_step(self, rec: dict) -> None:
        cur = self._current
        cur.update(loss=rec["loss"], lrm=rec.get("lrm"))
        for name, p in self.params.items():
            cur["families"][name].update(value=_values(p), **_state(self.optimizer.state.get(p, {})))
        self.records.append(cur)
        self._grad = {}

    def done(self) -> bool:
        return self.taken >= self.steps

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@dataclass
class Steps:
    """A run's first steps: per-step records, the initial model and step 0's micro-batches."""
    cfg: Any
    records: list[dict[str, Any]]
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    controlled: tuple[str, ...]
    init: Any = None  # a copy of the model as built (keep_init)


@contextlib.contextmanager
def _as_training(runtime) -> Iterator[None]:
    """Training's global settings for the block (fp32 matmul precision "high" on CUDA), restored after."""
    previous = torch.get_float32_matmul_precision()
    if runtime.device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def first_steps(s: Setup, steps: int, step0_mode: str | None = None, keep_init: bool = False) -> Steps:
    """Build as `muonlab train` builds (seeded), run its loop for `steps` optimizer steps, record them."""
    from muonlab.config import apply_overrides  # noqa: PLC0415
    from muonlab.train.build import build_model, build_optimizer  # noqa: PLC0415
    from muonlab.train.loop import RunInterrupted, train_loop  # noqa: PLC0415
    from muonlab.train.run import use_compile  # noqa: PLC0415

    cfg = s.cfg if step0_mode is None else apply_overrides(s.cfg, {"step0_mode": step0_mode})
    if cfg.train.num_steps is not None and cfg.train.num_steps < steps:
        raise UsageError(f"{steps} steps asked, but the run has num_steps {cfg.train.num_steps}")
    rt = s.runtime
    cuda = rt.device.type == "cuda"
    forked = [rt.device.index if rt.device.index is not None else torch.cuda.current_device()] if cuda else []
    with torch.random.fork_rng(devices=forked), _as_training(rt):
        torch.manual_seed(cfg.seed)
        if cuda:
            torch.cuda.manual_seed(cfg.seed)
        compile_on = use_compile(cfg, rt)
        model = build_model(cfg, s.data.vocab_size, rt)
        optimizer = build_optimizer(model, cfg, compile_step=compile_on)
        init = copy.deepcopy(model) if keep_init else None
        train_model = torch.compile(model, dynamic=False) if compile_on else model
        loader = _Tap(s.data.loader(cfg.train.device_batch_size, cfg.train.sequence_len, "train", device=rt.device,
                                    rank=0, world_size=1, seed=cfg.seed), keep=cfg.train.accum_steps_per_rank(1))
        rec = _Recorder(model, optimizer, steps)
        try:
            train_loop(cfg, train_model, optimizer, loader, rt, model.estimate_flops(), on_step=rec.on_step,
                       stop_requested=rec.done)
        except RunInterrupted:  # the loop stops after `steps` steps, as after a signal (no checkpoint)
            pass
        finally:
            rec.remove()
    controlled = Step0Control(cfg.optim.step0_mode, family_params(model)).families
    return Steps(cfg, rec.records, loader.batches, controlled, init)


# ---------------------------------------------------------------------------------------------- checks

def adamw_predict(p0: float, g: float, state: dict[str, Any], lr: float, betas: list[float], eps: float,
                  wd: float) -> tuple[float, float, float, float]:
    """(t, m, v, displacement) of one AdamW step (muonlab.optim.steps.adamw_step) in float64,
    from the state before it (fresh when it has no step)."""
    b1, b2 = betas
    t = (state.get("state_step") or 0.0) + 1.0
    m0 = 0.0 if state.get("exp_avg") is None else state["exp_avg"]
    v0 = 0.0 if state.get("exp_avg_sq") is None else state["exp_avg_sq"]
    m, v = b1 * m0 + (1 - b1) * g, b2 * v0 + (1 - b2) * g * g
    step = -(lr / (1 - b1 ** t)) * m / (math.sqrt(v / (1 - b2 ** t)) + eps)
    return t, m, v, -lr * wd * p0 + step


def adamw_scales(p0: float, g: float, state: dict[str, Any], lr: float, betas: list[float], eps: float,
                 wd: float) -> tuple[float, float, float]:
    """Magnitudes the fp32 rounding of (m, v, displacement) is relative to: the sums of the terms'
    absolute values (m and the displacement can cancel to near 0; their rounding error does not)."""
    b1, b2 = betas
    t = (state.get("state_step") or 0.0) + 1.0
    m0 = 0.0 if state.get("exp_avg") is None else state["exp_avg"]
    v0 = 0.0 if state.get("exp_avg_sq") is None else state["exp_avg_sq"]
    m_scale, v = b1 * abs(m0) + (1 - b1) * abs(g), b2 * v0 + (1 - b2) * g * g
    d_scale = abs(p0) + lr * wd * abs(p0) + (lr / (1 - b1 ** t)) * m_scale / (math.sqrt(v / (1 - b2 ** t)) + eps)
    return m_scale, v, d_scale


REL = 32 * 2.0**-23  # 32 fp32 ulp: the replay's tolerance relative to adamw_scales


def _close(a: float, b: float, scale: float, rel: float = 2e-6) -> bool:
    return abs(a - b) <= rel * scale + 1e-30


def _check(out: list, mode: str, name: str, passed: bool, detail: str = "") -> None:
    out.append({"mode": mode, "check": name, "passed": bool(passed), "detail": detail})


def _replay(records: list[dict]) -> tuple[bool, str]:
    """Every step's AdamW update recomputed from the state before it (see the module docstring)."""
    worst, where = 0.0, ""
    prior: dict[str, dict] = {}
    for r in records:
        for name, f in r["families"].items():
            before = prior.get(name, {})
            upd = f["after_update"]
            for i, p0 in enumerate(f["value_before"]):
                moved = f["value_after_update"][i] - p0
                if f["grad_seen"] is None:
                    errs = [abs(moved), float(upd["state_step"] != before.get("state_step"))]
                else:
                    sub = {k: (None if before.get(k) is None else (before[k][i] if isinstance(before[k], list)
                                                                    else before[k])) for k in before}
                    args = (p0, f["grad_seen"][i], sub, f["lr"], f["betas"], f["eps"], f["weight_decay"])
                    t, m, v, d = adamw_predict(*args)
                    sm, sv, sd = adamw_scales(*args)
                    errs = [abs(moved - d) / (REL * sd + 1e-30), float(upd["state_step"] != t),
                            abs(upd["exp_avg"][i] - m) / (REL * sm + 1e-30),
                            abs(upd["exp_avg_sq"][i] - v) / (REL * sv + 1e-30)]
                if max(errs) > worst:
                    worst, where = max(errs), f"step {r['step']} {name}[{i}]"
            prior[name] = {k: f[k] for k in ("state_step", "exp_avg", "exp_avg_sq")}
    return worst <= 1.0, f"worst {worst:.3g} x tolerance at {where}" if where else "exact"


def _step0_semantics(mode: str, records: list[dict], controlled: tuple[str, ...]) -> list[tuple[str, bool, str]]:
    """seed 002 §4.5 item 2 at step 0 (after the control) and step 1's t, per family."""
    r0, r1 = records[0]["families"], records[1]["families"]
    rows = []
    for name, f in r0.items():
        u, after = f["after_update"], {k: f[k] for k in ("state_step", "exp_avg", "exp_avg_sq")}
        moved = any(a != b for a, b in zip(f["value_after_update"], f["value_before"]))
        t1 = r1[name]["state_step"]
        if name not in controlled or mode == "none":
            ok = f["grad_seen"] == f["grad"] and after == u and f["value"] == f["value_after_update"] and t1 == 2.0
            rows.append((f"{name}: step 0 as the optimizer left it (state kept, t = 1), step 1 at t = 2", ok,
                         f"t0={f['state_step']}, t1={t1}"))
        elif mode in ("nostep0", "nostep0_all"):
            ok = (f["grad"] is not None and f["grad_seen"] is None and f["state_step"] is None and not moved
                  and f["value"] == f["value_before"] and t1 == 1.0)
            rows.append((f"{name}: grad removed, no state, no displacement; step 1 at t = 1", ok,
                         f"grad_seen={f['grad_seen'] is not None}, t0={f['state_step']}, t1={t1}"))
        elif mode == "mom_only_nodisp":
            m_expect = [(1 - f["betas"][0]) * g for g in f["grad"]]
            ok = (f["value"] == f["value_before"] and f["state_step"] == 1.0 and f["exp_avg"] == u["exp_avg"]
                  and f["exp_avg_sq"] == u["exp_avg_sq"]
                  and all(_close(a, b, abs(b)) for a, b in zip(f["exp_avg"], m_expect))
                  and moved == any(g != 0 for g in f["grad"]) and t1 == 2.0)
            rows.append((f"{name}: values restored, m0 = (1-b1) g0, v0 and t = 1 kept; step 1 at t = 2", ok,
                         f"t0={f['state_step']}, t1={t1}, restored={f['value'] == f['value_before']}"))
        elif mode == "disp_only_nomom":
            ok = (f["value"] == f["value_after_update"] and f["state_step"] is None and f["exp_avg"] is None
                  and t1 == 1.0)
            rows.append((f"{name}: displacement kept, state cleared (moments and counter); step 1 at t = 1", ok,
                         f"t0={f['state_step']}, t1={t1}"))
        elif mode == "disp_stepcount_nomom":
            ok = (f["value"] == f["value_after_update"] and f["state_step"] == 1.0
                  and not any(f["exp_avg"]) and not any(f["exp_avg_sq"]) and t1 == 2.0)
            rows.append((f"{name}: displacement and t = 1 kept, exp_avg = exp_avg_sq = 0; step 1 at t = 2", ok,
                         f"t0={f['state_step']}, t1={t1}"))
    return rows


def _step1_multiplier(mode: str, records: list[dict], controlled: tuple[str, ...]) -> tuple[str, bool, str] | None:
    """|step-1 displacement| / lr on the controlled families: sqrt(1 + b2)/(1 + b1) (dcnt), 1 (disp)."""
    if mode not in ("disp_stepcount_nomom", "disp_only_nomom"):
        return None
    ratios, expected = [], None
    for name in controlled:
        f = records[1]["families"][name]
        b1, b2 = f["betas"]
        expected = math.sqrt(1 + b2) / (1 + b1) if mode == "disp_stepcount_nomom" else 1.0
        for p0, p1, g in zip(f["value_before"], f["value_after_update"], f["grad_seen"] or []):
            if abs(g) >= 1e4 * f["eps"]:
                ratios.append(abs(p1 - p0) / f["lr"])
    if not ratios:
        return ("step-1 multiplier: no controlled gradient >= 1e4 eps at step 1", True, "n/a")
    ok = all(abs(r - expected) <= 2e-3 * expected for r in ratios)
    return (f"step-1 |displacement| / lr = {expected:.4f}", ok,
            f"measured {min(ratios):.5f}..{max(ratios):.5f} over {len(ratios)} scalars")


def mode_checks(modes: dict[str, dict]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for mode, m in modes.items():
        ok, detail = _replay(m["steps"])
        _check(out, mode, "AdamW replay of every step (t, exp_avg, exp_avg_sq, displacement)", ok, detail)
        if len(m["steps"]) >= 2:
            for name, ok, detail in _step0_semantics(mode, m["steps"], tuple(m["controlled"])):
                _check(out, mode, name, ok, detail)
            mult = _step1_multiplier(mode, m["steps"], tuple(m["controlled"]))
            if mult is not None:
                _check(out, mode, *mult)
    ref_mode = next(iter(modes))
    ref = modes[ref_mode]["steps"][0]
    for mode, m in modes.items():
        if mode == ref_mode:
            continue
        r0 = m["steps"][0]
        same = r0["loss"] == ref["loss"] and all(
            r0["families"][n][k] == f[k] for n, f in ref["families"].items() for k in ("grad", "value_before"))
        _check(out, mode, f"step 0: init, loss and gradients bitwise those of {ref_mode}", same,
               f"loss {r0['loss']!r} vs {ref['loss']!r}")
    return out


# ---------------------------------------------------------------------------------------------- audit

def paper_comparison(modes: dict[str, dict], seed: int, protocol_matches: bool) -> dict[str, Any]:
    """seed 002 §4.5 item 2's trajectory numbers for this seed beside the measured ones."""
    rows = []
    for mode, per_seed in PAPER_STEP11_LOSS.items():
        steps = modes.get(mode, {}).get("steps", [])
        measured = steps[11]["loss"] if len(steps) > 11 else None
        rows.append({"quantity": f"step-11 loss {mode}", "paper": per_seed.get(seed), "measured": measured})
    if "none" in modes and "disp_stepcount_nomom" in modes:
        a, b = modes["none"]["steps"], modes["disp_stepcount_nomom"]["steps"]
        gaps = [abs(x["loss"] - y["loss"]) for x, y in zip(a[1:12], b[1:12])]
        rows.append({"quantity": "max |loss(dcnt) - loss(12do_full)|, steps 1..11", "paper": PAPER_DCNT_TRACKS_FULL,
                     "paper_is_bound": True, "measured": max(gaps) if gaps else None})
    note = ("the paper's protocol (d6, ClimbMix, compiled bf16 on CUDA)" if protocol_matches else
            "not the paper's protocol (d6, ClimbMix, compiled bf16 on a GPU): the numbers compare in kind, not value")
    return {"rows": rows, "protocol_matches": protocol_matches, "note": note}


def protocol_matches(d: dict[str, Any]) -> bool:
    """The printed numbers' setting: depth 6, ClimbMix, compiled bf16 on CUDA, a paper seed (seed 002 §4.5 item 2)."""
    return (d["depth"] == 6 and d["data_source"] == "climbmix" and d["precision"] == "bf16"
            and d["device"].startswith("cuda") and bool(d["compile"]) and d["seed"] in (41, 42, 47))


def run_trajectory_audit(run: str | Path | None = None, preset: str | None = None, arm: str | None = None,
                         seed: int | None = None, settings: dict[str, Any] | None = None, device: str | None = None,
                         precision: str | None = None, steps: int = DEFAULT_STEPS,
                         modes: tuple[str, ...] | list[str] | str | None = None,
                         log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The steps 0..steps-1 trajectories of each step-0 mode (default all six) on the run's model."""
    if modes is not None:
        modes = [m.strip() for m in modes.split(",") if m.strip()] if isinstance(modes, str) else list(modes)
        if not modes:
            raise UsageError(f"--modes names at least one of {', '.join(STEP0_MODES)} (leave it out for all six)")
    modes = tuple(modes or STEP0_MODES)
    unknown = [m for m in modes if m not in STEP0_MODES]
    if unknown or len(set(modes)) != len(modes):
        raise UsageError(f"--modes: each of {', '.join(STEP0_MODES)} at most once, got {', '.join(modes)}")
    if steps < 2:
        raise UsageError(f"--steps must be >= 2 (the modes differ from step 1 on), got {steps}")
    s = setup(run, preset, arm, seed, settings, device, precision, log)
    out: dict[str, dict] = {}
    for mode in modes:
        st = first_steps(s, steps, step0_mode=mode)
        out[mode] = {"controlled": list(st.controlled), "steps": st.records}
    checks = mode_checks(out)
    d = s.describe()
    families = [n for n in ALL_FAMILIES if n in out[modes[0]]["steps"][0]["families"]]
    return {"config": d, "steps": steps, "families": families, "modes": out, "checks": checks,
            "passed": all(c["passed"] for c in checks),
            "paper": paper_comparison(out, d["seed"], protocol_matches(d))}


def _fmt(v: float | None, spec: str = "+.3e") -> str:
    return "-" if v is None else format(v, spec)


def format_trajectory_table(result: dict[str, Any]) -> str:
    c = result["config"]
    fams = result["families"]
    focus = next((n for n in ("wte_lambdas", "out_lambdas", "x0_lambdas") if n in fams), fams[0])
    k = SHORT[focus]
    lines = [f"step-0 trajectory audit (seed 002 §4.5 item 2): {c['preset_or_run']} arm {c['arm']} seed {c['seed']}, "
             f"{c['device']} {c['precision']}, depth {c['depth']} width {c['width']}, {c['accum']} micro-batches of "
             f"{c['micro_batch']} x {c['sequence_len']}; steps 0..{result['steps'] - 1}",
             f"per step: the logged loss; {k}[0] value after the step, its gradient, state['step'] (t), exp_avg (m), "
             "exp_avg_sq (v); the other families' [0] values (every scalar in the JSON)"]
    others = [n for n in fams if n != focus]
    head = ["mode", "step", "loss", f"{k}[0]", f"g {k}[0]", "t", f"m {k}[0]", f"v {k}[0]"] + \
        [f"{SHORT[n]}[0]" for n in others]
    rows = [head]
    for mode, m in result["modes"].items():
        for r in m["steps"]:
            f = r["families"][focus]
            rows.append([mode if r["step"] == 0 else "", str(r["step"]), f"{r['loss']:.6f}", f"{f['value'][0]:+.6f}",
                         _fmt(f["grad"][0] if f["grad"] else None), _fmt(f["state_step"], ".0f"),
                         _fmt(f["exp_avg"][0] if f["exp_avg"] else None),
                         _fmt(f["exp_avg_sq"][0] if f["exp_avg_sq"] else None)]
                        + [f"{r['families'][n]['value'][0]:+.6f}" for n in others])
    widths = [max(len(r[j]) for r in rows) for j in range(len(head))]
    lines += ["  ".join(v.ljust(w) if j == 0 else v.rjust(w) for j, (v, w) in enumerate(zip(r, widths))) for r in rows]
    p = result["paper"]
    lines.append(f"paper (seed 002 §4.5 item 2, seed {c['seed']}) vs measured: {p['note']}")
    for row in p["rows"]:
        bound = " (bound)" if row.get("paper_is_bound") else ""
        lines.append(f"  {row['quantity']}: paper {_fmt(row['paper'], '.4f') if row['paper'] is not None else 'n/a'}"
                     f"{bound}, measured {_fmt(row['measured'], '.4f')}")
    failed = [ch for ch in result["checks"] if not ch["passed"]]
    lines.append(f"checks: {len(result['checks']) - len(failed)}/{len(result['checks'])} passed")
    lines += [f"  FAILED [{ch['mode']}] {ch['check']}: {ch['detail']}" for ch in failed]
    return "\n".join(lines)


COMMAND = Command(
    'step0-trajectory', "seed 002 §4.5 item 2 steps 0..11 trajectories of the six step-0 modes "
    "(values, gradients, state['step'], exp_avg, exp_avg_sq) with their semantics checked",
    options=STEP0_RUN_OPTIONS + (
        ("--steps", dict(type=integer_at_least(2), default=12, help="optimizer steps recorded (default 12: 0..11)")),
        ("--modes", dict(default=None, help="comma-separated step-0 modes (default: all six)")),),
    run=lambda a: run_trajectory_audit(**cli_args(a), steps=a.steps,
        modes=a.modes),
    format=format_trajectory_table)
