"""A CPU run's step with glibc's malloc defaults against the freed memory kept (muonlab.host_memory).

Each CPU preset's full optimizer steps (`ArmStepper`: the preset's micro-batches of random tokens, forward,
backward, clipping, the optimizer) for one arm, in one process, the two allocator settings alternating in turns
after warm-up (mallopt switched between glibc's defaults and what a CPU run sets; the first step after a switch
is not measured: it frees what the other setting's heap held); per setting the median step time, the page faults a step takes (the kernel's count for this process) and the ratio kept / defaults.
The peak resident size is the process's, not per setting: the cost the kept memory has is in the docstring of
muonlab.host_memory, measured by whole runs.

    .venv/bin/python benchmarks/host_memory.py [--repeats 7] [--warmup 2] [--presets imagegpt-cpu,tied-cpu] [--json]
"""

from __future__ import annotations

import ctypes
import resource
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_main  # noqa: E402

from muonlab import host_memory  # noqa: E402
from muonlab.papers.seed004.diagnostics.overhead import ArmStepper, default_vocab  # noqa: E402

PRESETS = ("imagegpt-cpu", "tied-cpu", "t5-cpu", "hf-cpu", "protein-cpu")
ARM = "t1_afmuon"
GLIBC_MMAP_MAX, GLIBC_TRIM_THRESHOLD = 65536, 128 * 1024  # glibc's defaults (malloc.c)


def _set(kept: bool) -> None:
    libc = ctypes.CDLL(None)
    libc.mallopt(host_memory.M_MMAP_MAX, 0 if kept else GLIBC_MMAP_MAX)
    libc.mallopt(host_memory.M_TRIM_THRESHOLD, host_memory.NEVER_TRIM if kept else GLIBC_TRIM_THRESHOLD)


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _time_preset(preset: str, repeats: int, warmup: int) -> dict:
    stepper = ArmStepper(ARM, preset, default_vocab(preset), torch.device("cpu"))
    samples = {"defaults": [], "kept": []}
    for i in range(warmup + repeats):
        for name in samples:  # alternating: machine noise hits both settings alike
            _set(name == "kept")
            stepper.step()  # the step after a switch inherits the other setting's heap: not measured
            before = _faults()
            seconds = stepper.step()
            if i >= warmup:
                samples[name].append((seconds, _faults() - before))
    med = {name: {"step_s": statistics.median(s for s, _ in rows), "faults": statistics.median(f for _, f in rows)}
           for name, rows in samples.items()}
    return {**med, "step_ratio": med["kept"]["step_s"] / med["defaults"]["step_s"]}


def run(repeats: int = 7, warmup: int = 2, presets: str = ",".join(PRESETS)) -> dict:
    if not host_memory.is_glibc():
        raise SystemExit("glibc's malloc only: nothing to compare here")
    torch.manual_seed(0)
    rows = {p: _time_preset(p, repeats, warmup) for p in presets.split(",") if p}
    _set(False)
    return {"arm": ARM, "repeats": repeats, "threads": torch.get_num_threads(), "presets": rows,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def format_table(res: dict) -> str:
    lines = [f"{res['arm']}'s full steps, glibc's defaults against freed memory kept ({res['repeats']} alternating "
             f"repeats, {res['threads']} threads)",
             f"{'preset':<14} {'defaults s':>10} {'kept s':>9} {'kept x':>7} {'faults/step':>12} {'kept':>8}"]
    for p, r in res["presets"].items():
        lines.append(f"{p:<14} {r['defaults']['step_s']:>10.4f} {r['kept']['step_s']:>9.4f} {r['step_ratio']:>7.3f} "
                     f"{r['defaults']['faults']:>12.0f} {r['kept']['faults']:>8.0f}")
    return "\n".join(lines)


def main(argv=None):
    bench_main(__doc__, run, format_table, argv, extra_args=(("--presets", str, ",".join(PRESETS)),))


if __name__ == "__main__":
    main()
