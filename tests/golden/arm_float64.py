"""Every registered arm's figures after a few steps in float64: the arm check that holds on any CPU.

The bitwise checksums of make_arm_checksums.py hold only on the machine that recorded them: another
CPU rounds fp32 and bf16 differently, and AdamW turns a rounding-noise gradient into a full step. This
check trains the same runs (the same configs, the same `STEPS` steps, one run per config group) with
every floating-point tensor in float64 (`float64_everywhere`: the fp32, bf16 and fp16 dtypes the code
names are float64 for the duration, so every cast, factory and dtype test in muonlab sees float64) and
compares figures that move with any change of the math: the loss at every step, and for every final
tensor its L2 norm and its projection on a fixed random direction (a sign or direction change that
keeps the norm moves the projection).

The tolerance is argued from the arithmetic, not from any recorded spread. Two CPUs running float64
differ only in the order of operations (vector width, GEMM blocking, thread splits) and in 1-ulp
differences of vectorised exp/log. A reordered reduction of n terms moves its result by at most
gamma_n = n u / (1 - n u) times the sum of the magnitudes of its terms (u = 2^-53; Higham, Accuracy and
Stability of Numerical Algorithms, §3.1), that is by kappa n u relative to the result, kappa being the sum
of the magnitudes over the magnitude of the sum. Here:
  - n <= 2^15: the longest reductions are over the 512 tokens of a step times a width of 64 (a scalar
    gain's gradient) or over a 300 x 64 table (a norm): n u <= 3.6e-12;
  - kappa <= 1e3: the worst-conditioned figures are the scalar gains (x0_lambdas, ve_gate, radius gates),
    whose gradients are sums of terms of either sign; such a sum of n terms is ~sqrt(n) = 181 times
    smaller than the sum of their magnitudes, and AdamW's normalisation carries that relative error
    into the update unchanged (d log(g / (|g| + eps)) / d log g <= 1);
  - an amplification of at most 1e2 through the three steps (forward, backward, Polar Express, moments).
Hence a figure moves by at most 3.6e-7 relative between CPUs: `RTOL` = 1e-6. It is a hundred times below
what the check must catch: NorMuon's scale off by 1e-4 moves the zero-initialised projections, whose
whole value is their updates, by 1e-4 (tests/arms/test_arm_checksums.py breaks it and watches this check fail).

    python tests/golden/arm_float64.py             # record every arm's figures (all machines share them)
    python tests/golden/arm_float64.py --check     # compare, print the arms that differ
    python tests/golden/arm_float64.py --arms A,B --reason "what moved them"   # an intended numeric change
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

_HARNESS = Path(__file__).with_name("make_arm_checksums.py")
harness = sys.modules.get("make_arm_checksums")  # loaded once per process (the checksum test loads it too)
if harness is None:
    _spec = importlib.util.spec_from_file_location("make_arm_checksums", _HARNESS)
    harness = sys.modules["make_arm_checksums"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(harness)

FIGURES = Path(__file__).with_name("arm_float64.json")
RTOL = 1e-6
# the reduced-precision dtypes muonlab names, and the tensor methods that cast to them
_NAMES = ("float32", "float", "bfloat16", "float16", "half")
_CASTS = ("float", "bfloat16", "half")


class _Float64Calls(TorchFunctionMode):
    """Every torch call made within it gets float64 where it was handed fp32, bf16 or fp16: the dtypes a
    module captured before the names were switched (a default argument, a constant table) included."""

    def __init__(self, reduced: tuple[torch.dtype, ...]):
        super().__init__()
        self.reduced = reduced

    def _retarget(self, value):
        return torch.float64 if isinstance(value, torch.dtype) and value in self.reduced else value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _BIT_VIEWS:
            args = tuple(self._retarget(a) for a in args)
            kwargs = {k: self._retarget(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


_BIT_VIEWS = (torch.Tensor.view,)  # x.view(dtype) reinterprets bits: never retargeted


@contextlib.contextmanager
def float64_everywhere():
    """Within it, torch.float32/bfloat16/float16 are torch.float64, `.float()`/`.bfloat16()`/`.half()` cast
    to float64, the default dtype is float64, and every torch call handed a reduced dtype gets float64:
    code written for fp32 and bf16 computes in float64 with its dtype tests (`x.dtype == torch.float32`)
    unchanged. torch's serialisation tables are built first, with the real dtypes, so checkpoints and
    model.pt save and load as float64."""
    import torch._weights_only_unpickler as unpickler
    import torch.storage as storage

    unpickler._get_allowed_globals(), storage._dtype_to_storage_type_map(), storage._storage_type_to_dtype_map()
    names = {name: getattr(torch, name) for name in _NAMES}
    casts = {name: getattr(torch.Tensor, name) for name in _CASTS}
    reduced = tuple({id(d): d for d in names.values()}.values())
    default = torch.get_default_dtype()
    try:
        for name in _NAMES:
            setattr(torch, name, torch.float64)
        for name in _CASTS:
            setattr(torch.Tensor, name, torch.Tensor.double)
        torch.set_default_dtype(torch.float64)
        with _Float64Calls(reduced):
            yield
    finally:
        torch.set_default_dtype(default)
        for name, value in names.items():
            setattr(torch, name, value)
        for name, value in casts.items():
            setattr(torch.Tensor, name, value)


def tensor_figures(state: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per tensor: [L2 norm, projection on a unit random direction drawn from a fixed seed]."""
    out = {}
    for name, t in sorted(state.items()):
        flat = t.detach().to(torch.float64).flatten()
        direction = torch.randn(flat.numel(), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        out[name] = [flat.norm().item(), (flat @ direction).item() / max(direction.norm().item(), 1e-300)]
    return out


def arm_figures(arm_name: str, runs_dir: Path, data_cache: dict) -> dict:
    """Train `arm_name` for STEPS steps under its CPU preset in float64; its losses and tensor figures."""
    from muonlab.arms import get_arm, resolve_config
    from muonlab.train import run_training

    preset_name = harness.preset_for(get_arm(arm_name))
    with float64_everywhere():
        cfg = resolve_config(arm_name, preset_name, {"num_steps": harness.STEPS, "quiet": True,
                                                     "runs_dir": str(runs_dir),
                                                     **harness.preset_batch(preset_name, arm_name)})
        if preset_name not in data_cache:
            data_cache[preset_name] = harness.prepared(cfg, log=lambda _: None)
        result = run_training(cfg, log=lambda _: None, data=data_cache[preset_name])
        state = torch.load(result.run_dir / "model.pt", weights_only=True)
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in lines if "loss" in line and "step" in line]
    dtypes = sorted({str(t.dtype) for t in state.values() if t.is_floating_point()})
    if dtypes != ["torch.float64"]:
        raise AssertionError(f"{arm_name}: float64_everywhere left tensors in {dtypes}")
    return {"preset": preset_name, "steps": harness.STEPS, "losses": losses, "tensors": tensor_figures(state)}


def _close(measured: float, recorded: float, scale: float) -> bool:
    return math.isfinite(measured) and abs(measured - recorded) <= RTOL * abs(scale)


def differences(measured: dict, recorded: dict) -> list[str]:
    """What differs beyond RTOL: a loss (relative to itself), a norm (to itself), a projection (to the
    tensor's norm, which bounds it); a missing or extra tensor; another preset."""
    out = []
    if measured["preset"] != recorded["preset"] or measured["steps"] != recorded["steps"]:
        out.append(f"recorded under {recorded['preset']} x {recorded['steps']} steps")
    if len(measured["losses"]) != len(recorded["losses"]):
        out.append(f"{len(measured['losses'])} losses, recorded {len(recorded['losses'])}")
    out += [f"loss at step {i}: {m!r} vs {r!r}" for i, (m, r) in enumerate(zip(measured["losses"], recorded["losses"]))
            if not _close(m, r, r)]
    names_m, names_r = set(measured["tensors"]), set(recorded["tensors"])
    out += [f"tensor {n} not recorded" for n in sorted(names_m - names_r)]
    out += [f"tensor {n} missing" for n in sorted(names_r - names_m)]
    for name in sorted(names_m & names_r):
        (norm_m, proj_m), (norm_r, proj_r) = measured["tensors"][name], recorded["tensors"][name]
        if not (_close(norm_m, norm_r, norm_r) and _close(proj_m, proj_r, norm_r)):
            out.append(f"{name}: norm {norm_m!r} vs {norm_r!r}, projection {proj_m!r} vs {proj_r!r}")
    return out


def load_figures(path: Path = FIGURES) -> dict:
    """The recorded figures, an arm written as {"same_as": FIRST} (its config group's first arm) resolved."""
    golden = json.loads(path.read_text()) if path.exists() else {"arms": {}}
    arms = golden["arms"]
    golden["arms"] = {name: arms[entry["same_as"]] if "same_as" in entry else entry for name, entry in arms.items()}
    return golden


def _compact(arms: dict[str, dict]) -> dict[str, dict]:
    """Each set of figures written once: arms with the same figures as an earlier arm name it."""
    out, first_of = {}, {}
    for name in sorted(arms):
        key = json.dumps(arms[name], sort_keys=True)
        out[name] = {"same_as": first_of[key]} if key in first_of else arms[name]
        first_of.setdefault(key, name)
    return out


def compute(arm_names) -> dict[str, dict]:
    """Figures of `arm_names`: one float64 run per config group, given to every member."""
    out, cache = {}, {}
    torch.set_num_threads(harness.recording_threads())
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("MUONLAB_CACHE", str(Path(tmp) / "cache"))
        for first, members in harness.arm_groups(arm_names).items():
            figures = arm_figures(first, Path(tmp) / "runs", cache)
            out.update({name: figures for name in members})
    return out


def main() -> int:
    from muonlab.arms import ARMS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the recorded figures instead of writing")
    parser.add_argument("--arms", help="record only these arms (comma-separated); needs --reason if recorded")
    parser.add_argument("--reason", help="why the --arms moved (an intended numeric change)")
    args = parser.parse_args()
    golden = load_figures()
    names = args.arms.split(",") if args.arms else sorted(ARMS)
    unknown = sorted(set(names) - set(ARMS))
    if unknown:
        raise SystemExit(f"not registered arms: {', '.join(unknown)}")
    current = compute(names)
    if args.check:
        bad = {n: differences(current[n], golden["arms"][n]) for n in names if n in golden["arms"]}
        bad = {n: d for n, d in bad.items() if d}
        print("all arms match" if not bad else "\n".join(f"{n}: {d[0]} (+{len(d) - 1})" for n, d in bad.items()))
        return 1 if bad else 0
    if args.arms and any(n in golden["arms"] for n in names) and not args.reason:
        raise SystemExit("recording arms already in the figures is a numeric change: say why with --reason")
    _, machine = harness.machine_fingerprint()
    golden["arms"] = _compact({**golden["arms"], **current})
    golden["recorded_on"] = machine
    if args.reason:
        golden.setdefault("changes", []).append({"arms": sorted(names), "reason": args.reason})
    FIGURES.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(current)} arms' float64 figures ({machine}) to {FIGURES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
