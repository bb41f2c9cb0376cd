"""Shared pieces of the benchmark scripts: timing side by side, loading upstream's train.py."""

from __future__ import annotations

import builtins
import re
import statistics
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F


def interleaved(steps: dict, repeats: int, warmup: int = 2) -> dict[str, dict[str, float]]:
    """Median seconds of each phase of each step function, the calls interleaved so that
    machine noise hits every contender alike. A step function returns {phase: seconds}."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    samples = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            samples[name].append(step())
    return {name: {phase: statistics.median(s[phase] for s in runs) for phase in runs[0]}
            for name, runs in samples.items()}


def _sdpa_window_attn(q, k, v, causal=True, window_size=(-1, 0)):
    """Stand-in for FA3 on CPU: SDPA with the explicit causal window of the reference bundles."""
    T = q.size(1)
    left = window_size[0]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    mask = (j <= i) & (j >= i - left) if 0 <= left < T - 1 else None
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, is_causal=mask is None,
                                       enable_gqa=k.size(2) != q.size(2))
    return y.transpose(1, 2)


def load_upstream(train_py: str | Path, compile: bool = False) -> dict:
    """Execute the model and optimizer definitions of upstream's train.py (not its script part).

    The user supplies the file (e.g. a clone of karpathy/autoresearch); nothing of it ships
    with muonlab. FA3 is replaced by SDPA, and torch.compile (upstream's decorators on its
    optimizer steps) by the identity unless `compile`, as the reference bundles were recorded.
    """
    source = Path(train_py).read_text()
    cut = source.index("# Hyperparameters")
    source = source[:cut]
    source = re.sub(r"^from kernels import get_kernel.*?^fa3 = .*?$", "", source, flags=re.S | re.M)
    source = re.sub(r"^from prepare import .*$", "", source, flags=re.M)
    source = source.replace('os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"', "")

    class _FA3:
        flash_attn_func = staticmethod(_sdpa_window_attn)

    module = types.ModuleType("upstream_train")
    module.fa3 = _FA3
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    real_compile = torch.compile
    if not compile:
        torch.compile = lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda f: f))
    try:
        exec(builtins.compile(source, str(train_py), "exec"), module.__dict__)
    finally:
        torch.compile = real_compile
    return module.__dict__


def peak_tensor_bytes(step, track: tuple = ()) -> int:
    """Peak bytes of live tensors during one call of `step` (eager), counting what `track`
    holds (modules, optimizers, tensors) from the start: torch's MemTracker, a dispatch mode
    that sees every allocation on any device, so it also measures CPU steps (where the
    process's RSS says little about one step)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*track)
    with tracker:
        step()
    peak = tracker.get_tracker_snapshot("peak")
    return int(sum(stats["Total"] for stats in peak.values()))


def optimizer_state_bytes(opt) -> int:
    """Bytes of every tensor in an optimizer's state."""
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


def time_optimizer_steps(opts: dict, repeats: int, warmup: int) -> dict[str, list[float]]:
    """Seconds of `opt.step()` per optimizer, the optimizers stepped interleaved after warm-up."""
    import time

    times = {name: [] for name in opts}
    for i in range(warmup + repeats):
        for name, opt in opts.items():
            t0 = time.perf_counter()
            opt.step()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def bench_main(doc: str, run, format_table, argv=None, extra_args=()) -> None:
    """The shared command line: --repeats, --warmup, --json (+ extra (flag, type, default) triples)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    for flag, kind, default in extra_args:
        ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--json", action="store_true")
    args = vars(ap.parse_args(argv))
    as_json = args.pop("json")
    res = run(**args)
    print(json.dumps(res, indent=2) if as_json else format_table(res))
