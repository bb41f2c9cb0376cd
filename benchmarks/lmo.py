"""Time of the finite-cap clipped-row LMO (seed 004 §2.2 (eqs. 4–5)) vs a plain row-RMS normalisation.

The table is the NanoGPT tied table, 50,304 x 768 fp32 (a momentum-like buffer: Gaussian by
default, `--dist t3` for Student-t(3) heavy tails, which need more Newton passes). Contenders,
all in one process and called interleaved (one call of each per repeat, after warm-up), so
machine noise hits them alike; reported: median seconds and the ratio to row-RMS
`B * (sqrt(d) / ||b_i||)` (fresh output, `rowrms`). Arms: `lmo` (fresh output, like row-RMS),
`rowrms_out` / `lmo_out` (both into a reused buffer: no page faults of a new 154 MB output, so
the ratio lmo_out / rowrms_out is the compute-only one), and the two fast paths `lmo_c1` (sign)
and `lmo_inf` (row-RMS through the LMO). Target (the LMO issue): `lmo` within 2x of `rowrms`.
`--threads N` sets torch's intra-op threads (0: leave torch's default); on a shared, loaded
machine every multi-threaded op pays a barrier wait, which hits the LMO's ~12 passes per chunk
far more than row-RMS's 2 passes, so compare at 1 thread there too.
Also printed: the share of rows and coordinates the cap clips (paper audit at c = 3 on real
NanoGPT momentum: 90.3% rows, 0.29% coordinates).

    .venv/bin/python benchmarks/lmo.py [--repeats 7] [--warmup 2] [--cap 3] [--dist gauss|t3]
                                       [--rows 50304] [--width 768] [--threads 0] [--json]
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_main, interleaved  # noqa: E402

from muonlab.optim.lmo import clipped_row_lmo  # noqa: E402

TARGET = 2.0


def _table(rows: int, width: int, dist: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dist == "gauss":
        return torch.randn(rows, width, generator=gen) * 1e-3
    if dist == "t3":  # Student-t(3): z / sqrt(chi2_3 / 3)
        z = torch.randn(rows, width, generator=gen)
        chi2 = torch.randn(3, rows, width, generator=gen).square().sum(0)
        return z / (chi2 / 3).sqrt() * 1e-3
    raise ValueError(f"unknown --dist {dist!r} (gauss, t3)")


def _timed(fn):
    def step() -> dict[str, float]:
        t0 = time.perf_counter()
        fn()
        return {"s": time.perf_counter() - t0}
    return step


def run(repeats: int = 7, warmup: int = 2, cap: float = 3.0, dist: str = "gauss",
        rows: int = 50304, width: int = 768, threads: int = 0) -> dict:
    if threads > 0:
        torch.set_num_threads(threads)
    B = _table(rows, width, dist)
    buf, buf_rms = torch.empty_like(B), torch.empty_like(B)
    root_d = math.sqrt(width)
    steps = {
        "rowrms": _timed(lambda: B * (root_d / B.norm(dim=1, keepdim=True))),
        "rowrms_out": _timed(lambda: torch.mul(B, root_d / B.norm(dim=1, keepdim=True), out=buf_rms)),
        "lmo": _timed(lambda: clipped_row_lmo(B, cap)),
        "lmo_out": _timed(lambda: clipped_row_lmo(B, cap, out=buf)),
        "lmo_c1": _timed(lambda: clipped_row_lmo(B, 1.0)),
        "lmo_inf": _timed(lambda: clipped_row_lmo(B, math.inf)),
    }
    med = {name: r["s"] for name, r in interleaved(steps, repeats, warmup).items()}
    L = clipped_row_lmo(B, cap)
    capped = L.abs() >= min(cap, root_d) * (1 - 1e-6)
    return dict(rows=rows, width=width, cap=cap, dist=dist, repeats=repeats, warmup=warmup,
                threads=torch.get_num_threads(), target=TARGET,
                rows_capped=capped.any(1).float().mean().item(), coords_capped=capped.float().mean().item(),
                compute_ratio=med["lmo_out"] / med["rowrms_out"],
                arms={name: dict(median_s=s, ratio=s / med["rowrms"]) for name, s in med.items()})


def format_table(res: dict) -> str:
    lines = [f"clipped-row LMO, {res['rows']:,} x {res['width']} fp32 ({res['dist']}), c = {res['cap']:g}, "
             f"{res['repeats']} interleaved repeats, {res['threads']} threads; capped: "
             f"{100 * res['rows_capped']:.1f}% rows, {100 * res['coords_capped']:.2f}% coordinates",
             f"{'arm':<10} {'median s':>9} {'x rowrms':>9}  target"]
    for name, r in res["arms"].items():
        target = ""
        if name == "lmo":
            target = f"<= {res['target']:g}x: {'met' if r['ratio'] <= res['target'] else 'MISSED'}"
        lines.append(f"{name:<10} {r['median_s']:>9.4f} {r['ratio']:>9.3f}  {target}")
    lines.append(f"compute only (lmo_out / rowrms_out): {res['compute_ratio']:.3f}x")
    return "\n".join(lines)


def main(argv=None):
    bench_main(__doc__, run, format_table, argv,
               extra_args=(("--cap", float, 3.0), ("--dist", str, "gauss"), ("--rows", int, 50304),
                           ("--width", int, 768), ("--threads", int, 0)))


if __name__ == "__main__":
    main()
