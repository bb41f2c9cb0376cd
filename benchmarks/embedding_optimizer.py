"""Step time and optimizer-state bytes of the embedding-table options vs the upstream AdamW step.

The depth-8 tables (vocab 8192, width 512): wte and the 4 value-embedding tables in bf16 (as
upstream casts them), lm_head in fp32. Options (issue 5 items 4-5, seed 002 §2.1 Tier 1 and §3 item 3):
`master32` (fp32 master copy + fp32 moments for the bf16 tables), `neumann` (right-projected
Neumann-Gram whitening of every table's gradient, tau 80, fp32), and both (`01_dense_opt`'s
setting). All optimizers live in one process and step interleaved after warm-up, so machine
noise hits them alike; reported: median step seconds, ratio to the upstream step, state bytes
beyond it. Targets (seed 002 §2.1, §3 item 3): master32 adds exactly 160.0 MiB at depth 8 (8 bytes per
bf16 table element: fp32 master + the moments' bf16 -> fp32 growth), whitening adds 0 bytes.

    .venv/bin/python benchmarks/embedding_optimizer.py [--repeats 7] [--warmup 2] [--json]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_main, optimizer_state_bytes, time_optimizer_steps  # noqa: E402

from muonlab.optim import MuonAdamW  # noqa: E402

VOCAB, WIDTH, VALUE_TABLES = 8192, 512, 4
ARMS = {
    "native": {},
    "master32": dict(master32=True),
    "neumann": {"whiten.kind": "neumann", "whiten.tau": 80.0},
    "neumann+master32": {"master32": True, "whiten.kind": "neumann", "whiten.tau": 80.0},
}
TARGET_EXTRA_MIB = {"native": 0.0, "master32": 160.0, "neumann": 0.0, "neumann+master32": 160.0}


def build(options: dict, seed: int = 0) -> MuonAdamW:
    gen = torch.Generator().manual_seed(seed)

    def table(dtype):
        p = torch.nn.Parameter((torch.randn(VOCAB, WIDTH, generator=gen) * 0.02).to(dtype))
        p.grad = (torch.randn(VOCAB, WIDTH, generator=gen) * 1e-3).to(dtype)
        return p

    embeds = [table(torch.bfloat16) for _ in range(1 + VALUE_TABLES)]  # wte + value embeddings
    head = table(torch.float32)
    # upstream's learning rates at width 512 (scaled by (d/768)^-1/2), no weight decay
    scale = (WIDTH / 768) ** -0.5
    groups = [dict(kind="adamw", params=embeds[:1], lr=0.6 * scale, **options),
              dict(kind="adamw", params=embeds[1:], lr=0.6 * scale, **options),
              dict(kind="adamw", params=[head], lr=0.004 * scale,
                   **{k: v for k, v in options.items() if k != "master32"})]  # lm_head is fp32 already
    for g in groups:
        g.update(betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0)
    return MuonAdamW(groups, compile=False)


def run(repeats: int = 7, warmup: int = 2) -> dict:
    opts = {name: build(o) for name, o in ARMS.items()}
    times = time_optimizer_steps(opts, repeats, warmup)
    base_t = statistics.median(times["native"])
    base_b = optimizer_state_bytes(opts["native"])
    rows = {name: dict(median_s=statistics.median(times[name]), ratio=statistics.median(times[name]) / base_t,
                       extra_state_mib=(optimizer_state_bytes(opt) - base_b) / 2**20)
            for name, opt in opts.items()}
    return dict(vocab=VOCAB, width=WIDTH, value_tables=VALUE_TABLES, repeats=repeats, warmup=warmup,
                threads=torch.get_num_threads(), native_state_mib=base_b / 2**20, arms=rows)


def format_table(res: dict) -> str:
    lines = [f"AdamW step over the depth-8 tables (wte + {res['value_tables']} value embeddings bf16, lm_head fp32; "
             f"{res['vocab']} x {res['width']}), {res['repeats']} interleaved repeats, {res['threads']} threads; "
             f"native state {res['native_state_mib']:.1f} MiB",
             f"{'arm':<18} {'median s':>9} {'x native':>9} {'+state MiB':>11}  target"]
    for name, r in res["arms"].items():
        want = TARGET_EXTRA_MIB[name]
        verdict = "met" if r["extra_state_mib"] == want else "MISSED"
        lines.append(f"{name:<18} {r['median_s']:>9.4f} {r['ratio']:>9.3f} {r['extra_state_mib']:>11.2f}  "
                     f"+{want:g} MiB: {verdict}")
    return "\n".join(lines)


def main(argv=None):
    bench_main(__doc__, run, format_table, argv)


if __name__ == "__main__":
    main()
