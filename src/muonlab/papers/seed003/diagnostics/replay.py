"""Actual-state Muon replay (seed 003, "Actual-state Muon replay"; "Reproducibility": replay_radial_updates.py).

From a checkpoint that holds the real optimizer moments, the same captured micro-batches are run
through the ordinary and the branch-tangent backward (gradients accumulated as training does:
loss / n per micro-batch), and each condition's Muon proposal is computed from a CLONE of the
Muon state (momentum_buffer, second_momentum_buffer, any conditioner state). No proposal is
applied. Metric: the pooled relative change ||a - b||_F / ||b||_F over the concatenation of all
Muon-managed matrices (b = the ordinary condition), of (1) the accumulated matrix gradient and
(2) the mature unit-base-LR Muon direction. Controls: an ordinary repeat (nondeterminism floor,
exactly 0 on CPU) and the direction contrast with both moments / momentum only / the second
moment only reset to zero. Guards (ReplayInvariantError): every forward loss is bitwise equal
across conditions, and weights, buffers and optimizer state are bitwise unchanged afterwards.

Choices (unstated in seed 003):
  * direction = the update the optimizer's own `muon_step` subtracts, called on clones with a
    ZERO parameter stack: with wd = 0 it writes exactly -(lr_t * g), so no part of the step is
    re-implemented and any pre-polar / precision option of the group is honoured;
  * "unit-base-LR" = group lr 1.0, KEEPING the optimizer's shape factor max(1, rows/cols)^0.5
    (the direction is what MuonAdamW.step would do with lr 1); weight decay 0 (scheduled WD is 0
    at progress 1); momentum and beta2 as the checkpoint's param groups hold them, i.e. the
    values the schedule set for the checkpoint's last step, not the next step's;
  * the step functions run eagerly (training on CUDA compiles them: rounding may differ);
  * reset_* = the branch-vs-ordinary direction contrast with the named buffers zeroed in BOTH
    conditions (the paper: resetting "increases the direction contrast to 22%"); the distance of
    the reset ordinary direction from the mature one is reported too (reset_*_vs_mature);
    conditioner state (zeta_buffer) is never reset;
  * order of conditions: ordinary, rule, ordinary again (the repeat brackets the rule);
  * batches: every rank's pending batch then the next accum-1 from its restored loader (the exact
    global batch of the next step); with `micro_batches` given, rank 0's stream only;
  * device and precision: `device` (default cpu; any torch device that exists) and `precision`
    (fp32 | bf16; default the run's own: its runtime.precision, with "auto" resolved on the device
    it trained on, read from its checkpoint: a CUDA RNG state there means CUDA, so bf16). The
    checkpoint is read on the CPU and copied onto the device by load_state_dict (the model's and
    the optimizer's, which moves state to its parameter's device); batches are moved there and
    autocast takes the device's type. On CUDA the fp32 matmul precision is "high", as training
    sets it; relative changes are computed in fp64; ratio None when 0/0;
  * the nondeterminism floor: the ordinary repeat is reported as measured. On CPU it is exactly 0;
    on a GPU in bf16 it is seed 003's 2.04% (atomics in the backward), and a contrast is only
    resolved above it, which the table says.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import Tensor

from muonlab.settings import integer_at_least
from muonlab.device import detect_device, resolve_precision
from muonlab.diagnostics.runs import LoadedRun, capture_batches, load_run, run_config
from muonlab.errors import MuonlabError, UsageError
from muonlab.model.variants.residual_rules import use_rule
from muonlab.optim import muon_variant
from muonlab.optim.steps import muon_step
from muonlab.diagnostics import Command, RUN_OPTIONS, DEVICE_OPTIONS

# seed 003's two terminal checkpoints (fractions); "reset_variance" is only "changes little"
PAPER: dict[str, Any] = {
    "seeds": [146, 246], "micro_batches": 4, "tokens": 524_288,
    "gradient_rel_change": [0.14186, 0.13453], "direction_rel_change": [0.12176, 0.12348],
    "repeat_direction_rel_change": [0.02038, 0.02027], "direction_gradient_ratio": [0.858, 0.918],
    "reset_both": [0.22014, 0.22416], "reset_momentum": [0.22004, 0.22423], "reset_variance": "changes little",
}
RESETS = {"both": ("momentum_buffer", "second_momentum_buffer"), "momentum": ("momentum_buffer",),
          "variance": ("second_momentum_buffer",)}


class ReplayInvariantError(MuonlabError):
    """The replay changed the model/optimizer, or the forward differed between conditions."""


def _f32(value: float) -> Tensor:
    return torch.tensor(float(value), dtype=torch.float32)  # the optimizer's 0-D fp32 hyperparameters


def muon_groups(optimizer) -> list[dict]:
    return [g for g in optimizer.param_groups if g["kind"] == "muon" and g["params"]]


def accumulate(loaded: LoadedRun, batches: list[tuple[Tensor, Tensor]], rule: str) -> tuple[Tensor, list[Tensor]]:
    """Forward losses [n] and the accumulated gradient stack of every Muon group under `rule`."""
    model, n = loaded.model, len(batches)
    with use_rule(model, rule):
        try:
            model.zero_grad(set_to_none=True)
            losses = []
            for x, y in batches:
                with loaded.runtime.autocast():
                    loss = model(x, y)
                losses.append(loss.detach().clone())
                (loss / n).backward()
            grads = []
            for group in muon_groups(loaded.optimizer):
                if any(p.grad is None for p in group["params"]):
                    raise RuntimeError("a Muon-managed matrix received no gradient")
                grads.append(torch.stack([p.grad for p in group["params"]]))
        finally:
            model.zero_grad(set_to_none=True)
    return torch.stack(losses), grads


def muon_direction(optimizer, group: dict, grads: Tensor, reset: tuple[str, ...] = ()) -> Tensor:
    """The unit-base-LR, wd-0 update MuonAdamW.step would subtract, from a clone of the group's state."""
    p0 = group["params"][0]
    rows, cols = p0.shape
    state = {k: v.clone() if isinstance(v, Tensor) else copy.deepcopy(v) for k, v in optimizer.state[p0].items()}
    for key in reset:
        state[key].zero_()
    stages = muon_variant.resolve(group)  # the group's add-ons, as MuonAdamW composes them
    step = muon_step if stages is None else muon_variant.build_step(stages)
    extra = () if stages is None else (muon_variant.step_inputs(group, stages, state, 0, len(group["params"]), p0.device),)
    params = torch.zeros_like(grads)  # zero stack: with wd 0, the step writes params = -(lr_t * g) exactly
    step(grads.clone(), params, state["momentum_buffer"], state["second_momentum_buffer"],
         _f32(group["momentum"]), _f32(max(1.0, rows / cols) ** 0.5), _f32(0.0),
         _f32(group["beta2"] if group["beta2"] is not None else 0.0), group["ns_steps"],
         -1 if rows >= cols else -2, *extra)
    return params.neg_()


def directions(optimizer, grads: list[Tensor], reset: tuple[str, ...] = ()) -> list[Tensor]:
    return [muon_direction(optimizer, g, s, reset) for g, s in zip(muon_groups(optimizer), grads)]


def pooled_rel_change(a: list[Tensor], b: list[Tensor]) -> float:
    """||a - b||_F / ||b||_F over the concatenation of all matrices (fp64)."""
    num = sum(float((x.double() - y.double()).square().sum()) for x, y in zip(a, b))
    den = sum(float(y.double().square().sum()) for y in b)
    return math.sqrt(num) / math.sqrt(den) if den > 0 else math.nan


def _snapshot(loaded: LoadedRun) -> list[Tensor]:
    tensors = [t.detach().clone() for t in loaded.model.state_dict().values()]
    for st in loaded.optimizer.state.values():
        tensors += [v.clone() for v in st.values() if isinstance(v, Tensor)]
    return tensors


def replay_loaded(loaded: LoadedRun, batches: list[tuple[Tensor, Tensor]], rule: str = "branch_tangent") -> dict:
    """The replay on an already loaded run (its model and optimizer are left bitwise unchanged)."""
    before = _snapshot(loaded)
    opt = loaded.optimizer
    losses_a, grads_a = accumulate(loaded, batches, "ordinary")
    losses_r, grads_r = accumulate(loaded, batches, rule)
    losses_b, grads_b = accumulate(loaded, batches, "ordinary")
    losses_equal = torch.equal(losses_a, losses_r) and torch.equal(losses_a, losses_b)
    dir_a, dir_r, dir_b = directions(opt, grads_a), directions(opt, grads_r), directions(opt, grads_b)
    out: dict[str, Any] = {}
    for name, keys in RESETS.items():
        ord_reset = directions(opt, grads_a, keys)
        out[f"reset_{name}"] = pooled_rel_change(directions(opt, grads_r, keys), ord_reset)
        out[f"reset_{name}_vs_mature"] = pooled_rel_change(ord_reset, dir_a)
    after = _snapshot(loaded)
    weights_unchanged = len(before) == len(after) and all(torch.equal(x, y) for x, y in zip(before, after))
    if not weights_unchanged:
        raise ReplayInvariantError("the replay changed the model's weights or the optimizer's state")
    if not losses_equal:
        raise ReplayInvariantError(f"forward losses differ between conditions: ordinary {losses_a.tolist()}, "
                                   f"{rule} {losses_r.tolist()}, repeat {losses_b.tolist()}")
    g_rel, d_rel = pooled_rel_change(grads_r, grads_a), pooled_rel_change(dir_r, dir_a)
    digest = hashlib.sha256()
    for x, y in batches:
        digest.update(x.cpu().numpy().tobytes() + y.cpu().numpy().tobytes())
    return {
        "step": loaded.step, "micro_batches": len(batches), "tokens": sum(y.numel() for _, y in batches),
        "rule": rule, "muon_matrices": sum(len(g["params"]) for g in muon_groups(opt)),
        "gradient_rel_change": g_rel, "direction_rel_change": d_rel,
        "direction_gradient_ratio": d_rel / g_rel if g_rel > 0 else None,
        "repeat_gradient_rel_change": pooled_rel_change(grads_b, grads_a),
        "repeat_direction_rel_change": pooled_rel_change(dir_b, dir_a),
        **out, "losses": losses_a.tolist(), "losses_bitwise_equal": losses_equal,
        "weights_unchanged": weights_unchanged, "batch_sha256": digest.hexdigest(),
        "checkpoint": str(loaded.checkpoint_path), "paper": PAPER,
    }


def trained_precision(precision: str, device: str, rng_keys: Iterable[str]) -> str:
    """The precision a run trained at: its runtime.precision, "auto" resolved on its training
    device (runtime.device, or with "auto" CUDA iff its checkpoint holds a CUDA RNG state)."""
    if device == "auto":
        device = "cuda" if "cuda" in rng_keys else "cpu"
    return resolve_precision(precision, torch.device(device))


def recorded_precision(run_dir: str | Path, runtime=None) -> str:
    """The run's own precision (see trained_precision) from its config's `runtime` (read from the run
    when not given); its newest checkpoint is only peeked at."""
    from muonlab.train.checkpoint import list_checkpoints

    run_dir = Path(run_dir)
    runtime = run_config(run_dir).runtime if runtime is None else runtime
    rng_keys: tuple[str, ...] = ()
    if runtime.precision == "auto" and runtime.device == "auto" and list_checkpoints(run_dir):
        ckpt = torch.load(list_checkpoints(run_dir)[-1], map_location="cpu", weights_only=True, mmap=True)
        rng_keys = tuple(ckpt.get("rng", {}))
    return trained_precision(runtime.precision, runtime.device, rng_keys)


@contextlib.contextmanager
def _matmul_precision_as_training(device: torch.device):
    """Training sets fp32 matmuls to "high" on CUDA (train.run); the replay does the same there."""
    previous = torch.get_float32_matmul_precision()
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def run_replay(run_dir: str | Path, micro_batches: int | None = None, rule: str = "branch_tangent",
               device: str = "cpu", precision: str | None = None) -> dict:
    """Seed 003's actual-state Muon replay at the run's newest checkpoint on `device` at
    `precision` (None: the run's own; see the module docstring)."""
    from muonlab.model.variants.residual_rules import RESIDUAL_RULES

    if rule not in RESIDUAL_RULES:
        raise UsageError(f"--rule must be one of {', '.join(RESIDUAL_RULES)}, got {rule!r}")
    if micro_batches is not None and micro_batches < 1:
        raise UsageError(f"--micro-batches must be at least 1, got {micro_batches}")
    cfg = run_config(run_dir)
    family = cfg.family
    if family != "autoresearch":  # the residual rules act at the autoresearch GPT's residual additions
        raise UsageError(f"the replay compares residual backward rules of the autoresearch GPT; {run_dir} is a "
                         f"run of family {family!r}")
    dev = detect_device(device)  # a device that does not exist is a usage error
    source = "given" if precision is not None else "the run's"
    precision = resolve_precision(precision if precision is not None else recorded_precision(run_dir, cfg.runtime), dev)
    loaded = load_run(run_dir, device=str(dev), precision=precision)
    with _matmul_precision_as_training(dev):
        result = replay_loaded(loaded, capture_batches(loaded, micro_batches), rule)
    result.update(run_dir=str(run_dir), device=str(loaded.runtime.device), precision=loaded.runtime.precision,
                  precision_source=source,
                  deterministic=result["repeat_gradient_rel_change"] == 0 == result["repeat_direction_rel_change"])
    return result


def format_replay_table(result: dict) -> str:
    """Markdown table: this replay beside seed 003's two checkpoints (relative changes in %)."""
    p = result["paper"]

    def pct(v: Any) -> str:
        return "n/a" if v is None else (v if isinstance(v, str) else f"{100 * v:.3f}%")

    def paper(key: str, fmt=pct) -> str:
        v = p.get(key)
        return "n/a" if v is None else (v if isinstance(v, str) else " / ".join(fmt(x) for x in v))

    ratio = result["direction_gradient_ratio"]
    rows = [
        ("accumulated matrix gradient", pct(result["gradient_rel_change"]), paper("gradient_rel_change")),
        ("mature unit-base-LR Muon direction", pct(result["direction_rel_change"]), paper("direction_rel_change")),
        ("direction / gradient ratio", "n/a" if ratio is None else f"{ratio:.3f}",
         paper("direction_gradient_ratio", lambda x: f"{x:.3f}")),
        ("ordinary-repeat gradient change", pct(result["repeat_gradient_rel_change"]), "n/a"),
        ("ordinary-repeat direction change", pct(result["repeat_direction_rel_change"]),
         paper("repeat_direction_rel_change")),
    ]
    for name in RESETS:
        rows.append((f"direction contrast, reset {name}", pct(result[f"reset_{name}"]), paper(f"reset_{name}")))
        rows.append((f"reset-{name} vs mature ordinary direction", pct(result[f"reset_{name}_vs_mature"]), "n/a"))
    where = (f", on {result['device']} at {result['precision']} ({result['precision_source']} precision)"
             if "device" in result else "")
    lines = [f"Actual-state Muon replay: step {result['step']}, {result['micro_batches']} micro-batches, "
             f"{result['tokens']:,} targets, rule {result['rule']} vs ordinary{where}",
             "", "| relative change | this run | seed 003 (s146 / s246) |", "| --- | ---: | ---: |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines.append(f"\nforward losses bitwise equal: {result['losses_bitwise_equal']}; "
                 f"weights unchanged: {result['weights_unchanged']}")
    floor = result["repeat_direction_rel_change"]
    if result["repeat_gradient_rel_change"] == 0 == floor:
        lines.append("the replay is deterministic here: the nondeterminism floor is exactly 0 "
                     "(seed 003's 2.04% is its GPU bf16 floor)")
    else:
        lines.append(f"the replay is nondeterministic here: ordinary repeat (the floor) {pct(floor)} of the "
                     f"direction, {pct(result['repeat_gradient_rel_change'])} of the gradient; a contrast "
                     "is resolved only above it (seed 003: 2.038% / 2.027%)")
    return "\n".join(lines)


COMMAND = Command(
    'replay', "seed 003's actual-state Muon replay of one step under two backward rules",
    options=(*RUN_OPTIONS, ("--rule", dict(default="branch_tangent", help="the backward rule compared with ordinary")),
        ("--micro-batches", dict(type=integer_at_least(1), default=None,
        help="micro-batches to replay (default: one optimizer step's worth)")),
        DEVICE_OPTIONS[0], ("--precision", dict(default=None, choices=("fp32", "bf16"),
        help="fp32 or bf16 autocast (default: the run's own precision)"))),
    run=lambda a: run_replay(a.run, micro_batches=a.micro_batches, rule=a.rule,
        device=a.device, precision=a.precision),
    format=format_replay_table)
