"""AF-Muon against Hybrid Muon on every seed-004 family (issue 15's targets, seed 004 Table 27).

Step time: each family's CPU preset, one model per arm from the same seed (`muonlab.papers.seed004.diagnostics.overhead.
ArmStepper`), full optimizer steps (the preset's micro-batches of random tokens: forward, backward, clipping,
the optimizer), the arms' steps interleaved in one process after warm-up; the median per arm and the ratio
AF-Muon / Hybrid (target <= 1.05x), with the optimizer step alone beside it (its share is what AF-Muon
changes). State: the analytic bytes at the CPU shape and at every paper preset (target <= 0.80x; the paper's
Table 27 ratios within 1 point).

    .venv/bin/python benchmarks/af_muon_families.py [--repeats 15] [--warmup 3] [--presets tied-cpu,t5-cpu] [--json]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_main  # noqa: E402

from muonlab.papers.seed004.diagnostics.overhead import PAPER_TABLE27, ArmStepper, analytic_state, default_vocab  # noqa: E402

CPU_PRESETS = ("tied-cpu", "t5-cpu", "t5gemma2-cpu", "imagegpt-cpu", "hf-cpu", "protein-cpu")
PAPER_PRESETS = ("nanogpt-124m", "t5-small", "t5gemma2", "imagegpt", "smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b",
                 "protein-llama")
ARMS = ("t1_hybrid", "t1_afmuon")


def _timed_optimizer(stepper: ArmStepper):
    """Wrap the stepper's optimizer.step to record its own seconds."""
    inner, record = stepper.optimizer.step, []

    def step(*a, **k):
        t0 = time.perf_counter()
        out = inner(*a, **k)
        record.append(time.perf_counter() - t0)
        return out
    stepper.optimizer.step = step
    return record


def _time_family(preset: str, repeats: int, warmup: int) -> dict:
    vocab = default_vocab(preset)
    steppers = {arm: ArmStepper(arm, preset, vocab, torch.device("cpu")) for arm in ARMS}
    opt_times = {arm: _timed_optimizer(s) for arm, s in steppers.items()}
    for _ in range(warmup):
        for s in steppers.values():
            s.step()
    for record in opt_times.values():
        record.clear()
    steps = {arm: [] for arm in ARMS}
    for _ in range(repeats):  # interleaved: machine noise hits both arms alike
        for arm, s in steppers.items():
            steps[arm].append(s.step())
    med = {arm: statistics.median(v) for arm, v in steps.items()}
    opt = {arm: statistics.median(v) for arm, v in opt_times.items()}
    state = analytic_state(preset, vocab, ARMS)
    return {"step_s": med, "optimizer_s": opt, "step_ratio": med["t1_afmuon"] / med["t1_hybrid"],
            "optimizer_ratio": opt["t1_afmuon"] / opt["t1_hybrid"],
            "state_ratio": state["t1_afmuon"] / state["t1_hybrid"]}


def run(repeats: int = 15, warmup: int = 3, presets: str = ",".join(CPU_PRESETS)) -> dict:
    torch.manual_seed(0)
    cpu = {p: _time_family(p, repeats, warmup) for p in presets.split(",") if p}
    paper = {}
    for p in PAPER_PRESETS:
        state = analytic_state(p, None, ARMS)
        printed = PAPER_TABLE27.get(p)
        paper[p] = {"state_ratio": state["t1_afmuon"] / state["t1_hybrid"],
                    "paper_state_ratio": printed["state_gib"][1] / printed["state_gib"][0] if printed else None}
    return {"repeats": repeats, "threads": torch.get_num_threads(), "cpu": cpu, "paper": paper}


def format_table(res: dict) -> str:
    lines = [f"full steps at each family's CPU preset ({res['repeats']} interleaved repeats, {res['threads']} threads)",
             f"{'preset':<14} {'Hybrid s':>9} {'AF s':>9} {'step x':>7} {'opt x':>7} {'state x':>8}"]
    for p, r in res["cpu"].items():
        lines.append(f"{p:<14} {r['step_s']['t1_hybrid']:>9.4f} {r['step_s']['t1_afmuon']:>9.4f} "
                     f"{r['step_ratio']:>7.3f} {r['optimizer_ratio']:>7.3f} {r['state_ratio']:>8.3f}")
    lines.append("analytic state, AF-Muon / Hybrid, at the paper presets (Table 27 beside it where printed)")
    for p, r in res["paper"].items():
        printed = "" if r["paper_state_ratio"] is None else (
            f"  paper {r['paper_state_ratio']:.3f} ({100 * (r['state_ratio'] - r['paper_state_ratio']):+.1f} points)")
        lines.append(f"{p:<14} {r['state_ratio']:.3f}{printed}")
    return "\n".join(lines)


def main(argv=None):
    bench_main(__doc__, run, format_table, argv, extra_args=(("--presets", str, ",".join(CPU_PRESETS)),))


if __name__ == "__main__":
    main()
