"""Cost of seed 002's Over-Encoding on a CPU training step at the demo shapes, and its state bytes.

Two models built from the cpu-demo preset at depth 4, width 256 (T 256, B 16, vocab 2048) with
the same seed, one plain and one with Over-Encoding (m = 150,855, 4 tables of width 64) and
its moment-free group, stepped interleaved in one process (count + forward + backward +
optimizer step, as the training loop does). Reported: median step seconds, the ratio (target
<= 1.05, issue 7), the OE parts measured separately (lookup, counting, moment-free update),
and the bytes: optimizer state of the OE group (target 0: no moments), the tables' params +
grads + counts against OverEncoding.memory_bytes() (seed 002 §3 item 3's analytical formula, exactly).

    .venv/bin/python benchmarks/over_encoding.py [--repeats 7] [--warmup 2] [--oe-m 150855] [--json]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_main  # noqa: E402

from muonlab.config import apply_overrides, preset  # noqa: E402
from muonlab.device import Runtime  # noqa: E402
from muonlab.train.build import build_model, build_optimizer  # noqa: E402

VOCAB = 2048


def _build(oe_m: int, seed: int = 0):
    cfg = apply_overrides(preset("cpu-demo"), {"oe_m": oe_m, "model.depth": 4, "model.aspect_ratio": 64,
                                               "model.head_dim": 128})  # the shape issue 7 measured
    torch.manual_seed(seed)
    model = build_model(cfg, VOCAB, Runtime(torch.device("cpu"), "fp32"))
    return cfg, model, build_optimizer(model, cfg, compile_step=False)


def _step(model, opt, x, y):
    oe = getattr(model, "oe", None)
    t0 = time.perf_counter()
    if oe is not None:
        oe.count_(x)
    model(x, y).backward()
    opt.step()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def run(repeats: int = 7, warmup: int = 2, oe_m: int = 150_855) -> dict:
    cfg, plain, plain_opt = _build(0)
    _, oe_model, oe_opt = _build(oe_m)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (cfg.train.device_batch_size, cfg.train.sequence_len), generator=gen)
    y = torch.randint(0, VOCAB, (cfg.train.device_batch_size, cfg.train.sequence_len), generator=gen)
    times = {"plain": [], "oe": []}
    for i in range(warmup + repeats):
        for name, (m, o) in (("plain", (plain, plain_opt)), ("oe", (oe_model, oe_opt))):
            dt = _step(m, o, x, y)
            if i >= warmup:
                times[name].append(dt)
    oe = oe_model.oe
    parts = {"lookup": [], "count": [], "update": []}
    for _ in range(repeats):  # the OE pieces alone
        t0 = time.perf_counter()
        e = oe(x)
        t1 = time.perf_counter()
        oe.count_(x)
        t2 = time.perf_counter()
        e.float().sum().backward()
        group = next(g for g in oe_opt.param_groups if g["kind"] == "oe_mfree")
        t3 = time.perf_counter()
        oe_opt._step_kind(group)
        t4 = time.perf_counter()
        oe.zero_grad(set_to_none=True)
        for k, v in zip(parts, (t1 - t0, t2 - t1, t4 - t3)):
            parts[k].append(v)
    group_params = next(g for g in oe_opt.param_groups if g["kind"] == "oe_mfree")["params"]
    oe_state = sum(v.numel() * v.element_size() for p in group_params for v in oe_opt.state[p].values()
                   if torch.is_tensor(v))
    measured = (sum(2 * p.numel() * p.element_size() for p in oe.parameters())  # params + same-dtype grads
                + sum(c.numel() * c.element_size() for c in oe.counts()))
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(shape="cpu-demo", oe_m=oe_m, repeats=repeats, threads=torch.get_num_threads(),
                plain_s=med["plain"], oe_s=med["oe"], ratio=med["oe"] / med["plain"],
                parts_s={k: statistics.median(v) for k, v in parts.items()},
                oe_params=oe.num_parameters(), oe_optimizer_state_bytes=oe_state,
                oe_bytes_measured=measured, oe_bytes_analytical=oe.memory_bytes(),
                table_dtype=str(next(oe.parameters()).dtype))


def format_table(res: dict) -> str:
    ok_t = "met" if res["ratio"] <= 1.05 else "MISSED"
    ok_b = "met" if res["oe_optimizer_state_bytes"] == 0 and res["oe_bytes_measured"] == res["oe_bytes_analytical"] \
        else "MISSED"
    parts = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in res["parts_s"].items())
    return "\n".join([
        f"Over-Encoding at the demo shapes (m = {res['oe_m']:,}, {res['oe_params']:,} table params, "
        f"{res['table_dtype']}), {res['repeats']} interleaved repeats, {res['threads']} threads",
        f"step: plain {res['plain_s']:.4f} s, with OE {res['oe_s']:.4f} s -> {res['ratio']:.3f}x (target <= 1.05x: {ok_t})",
        f"OE parts: {parts}",
        f"bytes: OE optimizer state {res['oe_optimizer_state_bytes']} (target 0); params + grads + counts "
        f"{res['oe_bytes_measured']:,} measured vs {res['oe_bytes_analytical']:,} analytical ({ok_b})",
    ])


def main(argv=None):
    bench_main(__doc__, run, format_table, argv, extra_args=[("--oe-m", int, 150_855)])


if __name__ == "__main__":
    main()
