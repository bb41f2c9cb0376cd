"""Step time and optimizer-state bytes of every pre-polar conditioner vs the plain MuonAdamW step.

Depth-8 Muon shapes (seed 000 §3.3): 512x512 x32, 2048x512 x8, 512x2048 x8, 4x32 x4.
All optimizers live in one process and are stepped interleaved (one step of each per repeat,
after warm-up steps), so machine noise hits them alike; reported: median step seconds, the
ratio to the plain step, and the state bytes beyond the plain step's (absolute and per matrix
element). Targets (issue 5 item 8): stateless conditioners (hbieq, turbo_aol) <= +5% step time
on CPU; state: hbieq 0, zeta 4 bytes per matrix element.

    .venv/bin/python benchmarks/conditioners.py [--repeats 7] [--warmup 2] [--json]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_main, optimizer_state_bytes, time_optimizer_steps  # noqa: E402

from muonlab.optim import MuonAdamW  # noqa: E402

SHAPES = ((512, 512, 32), (2048, 512, 8), (512, 2048, 8), (4, 32, 4))
ARMS = {
    "plain": {},
    "hbieq": {"prepolar.kind": "hbieq", "prepolar.tau": 80.0},
    "rowrms1": {"prepolar.kind": "hbieq", "prepolar.passes": 1, "prepolar.sides": "row"},
    "zeta": {"prepolar.kind": "zeta"},
    "turbo_aol": {"prepolar.kind": "turbo_aol"},
    "muon2f": {"prepolar.kind": "muon2f"},
    "post_fp32": {"polar.post_dtype": "fp32"},
    "polar_fp32": {"polar.dtype": "fp32"},
}
TARGETS = {"hbieq": (1.05, 0.0), "turbo_aol": (1.05, 0.0), "zeta": (None, 4.0)}


def build(options: dict, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for rows, cols, n in SHAPES:
        params = [torch.nn.Parameter(torch.randn(rows, cols, generator=gen) * 0.02) for _ in range(n)]
        for p in params:
            p.grad = torch.randn(rows, cols, generator=gen) * 1e-3
        groups.append(dict(kind="muon", params=params, lr=0.04, momentum=0.95, weight_decay=0.2, **options))
    return MuonAdamW(groups, compile=False)


def run(repeats: int = 7, warmup: int = 2) -> dict:
    opts = {name: build(o) for name, o in ARMS.items()}
    elements = sum(r * c * n for r, c, n in SHAPES)
    times = time_optimizer_steps(opts, repeats, warmup)
    base_t = statistics.median(times["plain"])
    base_b = optimizer_state_bytes(opts["plain"])
    rows = {}
    for name, opt in opts.items():
        med = statistics.median(times[name])
        extra = optimizer_state_bytes(opt) - base_b
        rows[name] = dict(median_s=med, ratio=med / base_t, extra_state_bytes=extra,
                          extra_bytes_per_element=extra / elements)
    return dict(shapes=SHAPES, matrix_elements=elements, repeats=repeats, warmup=warmup,
                threads=torch.get_num_threads(), plain_state_bytes=base_b, arms=rows)


def format_table(res: dict) -> str:
    lines = [f"Muon step, depth-8 shapes ({res['matrix_elements']:,} matrix elements), "
             f"{res['repeats']} interleaved repeats, {res['threads']} threads; plain state "
             f"{res['plain_state_bytes'] / 2**20:.1f} MiB",
             f"{'arm':<12} {'median s':>9} {'x plain':>8} {'+state MiB':>11} {'+B/elem':>8}  target"]
    for name, r in res["arms"].items():
        target = ""
        if name in TARGETS:
            t_ratio, t_bytes = TARGETS[name]
            ok_t = t_ratio is None or r["ratio"] <= t_ratio
            ok_b = r["extra_bytes_per_element"] == t_bytes
            target = (f"{'<=' + format(t_ratio, '.2f') + 'x ' if t_ratio else ''}{t_bytes:g} B/elem: "
                      f"{'met' if ok_t and ok_b else 'MISSED'}")
        lines.append(f"{name:<12} {r['median_s']:>9.4f} {r['ratio']:>8.3f} "
                     f"{r['extra_state_bytes'] / 2**20:>11.2f} {r['extra_bytes_per_element']:>8.2f}  {target}")
    return "\n".join(lines)


def main(argv=None):
    bench_main(__doc__, run, format_table, argv)


if __name__ == "__main__":
    main()
