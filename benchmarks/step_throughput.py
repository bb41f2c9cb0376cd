"""Training-step throughput, the optimizer's share of step time, and peak memory.

Shapes: the CPU demo (depth 4, width 256, T 256, vocab 2048) and the seed papers' depth-8
model (width 512, T 2048, vocab 8192; one row per micro-step on CPU). With `--upstream
PATH/train.py` it also times upstream autoresearch's own model and optimizer at the same
configuration, interleaved in this process, and prints muonlab / upstream time ratios
(below 1.0 means muonlab is faster). Absolute times on shared machines are noise; read the ratios.

    python benchmarks/step_throughput.py [--shapes demo,d8] [--repeats 5] [--upstream train.py]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, load_upstream  # noqa: E402

from muonlab.config import preset  # noqa: E402
from muonlab.device import Runtime, detect_device, peak_memory_mb, resolve_precision, synchronize  # noqa: E402
from muonlab.model import GPTConfig  # noqa: E402
from muonlab.train.build import build_model, build_optimizer, model_config  # noqa: E402

SHAPES = {
    "demo": dict(preset="cpu-demo", vocab=2048, batch=16),
    "d8": dict(preset="gpu-d8", vocab=8192, batch=1),
}


def _make_step(model, opt, x, y, autocast, sync):
    """One training step that reports its forward+backward and optimizer seconds."""

    def step():
        sync()
        t0 = time.perf_counter()
        with autocast():
            loss = model(x, y)
        loss.backward()
        sync()
        t1 = time.perf_counter()
        opt.step()
        model.zero_grad(set_to_none=True)
        sync()
        return {"fwd_bwd": t1 - t0, "opt": time.perf_counter() - t1}

    return step


def _upstream_model(ns, gcfg: GPTConfig, device, precision, cfg):
    up_cfg = ns["GPTConfig"](sequence_len=gcfg.sequence_len, vocab_size=gcfg.vocab_size, n_layer=gcfg.n_layer,
                             n_head=gcfg.n_head, n_kv_head=gcfg.n_kv_head, n_embd=gcfg.n_embd,
                             window_pattern=gcfg.window_pattern)
    with torch.device("meta"):
        model = ns["GPT"](up_cfg)
    model.to_empty(device=device)
    model.init_weights()
    if precision == "fp32":
        model.float()
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # upstream prints its LR scaling
        opt = model.setup_optimizer(unembedding_lr=cfg.optim.unembedding_lr, embedding_lr=cfg.optim.embedding_lr,
                                    matrix_lr=cfg.optim.matrix_lr, weight_decay=cfg.optim.weight_decay,
                                    adam_betas=(cfg.optim.adam_beta1, cfg.optim.adam_beta2), scalar_lr=cfg.optim.scalar_lr)
    return model, opt


def bench_shape(name: str, repeats: int, upstream: dict | None, precision: str) -> dict:
    spec = SHAPES[name]
    cfg = preset(spec["preset"])
    device = detect_device("auto")
    runtime = Runtime(device, resolve_precision(precision, device))
    torch.manual_seed(0)
    model = build_model(cfg, spec["vocab"], runtime)
    opt = build_optimizer(model, cfg, compile_step=device.type == "cuda")
    B, T = spec["batch"], cfg.train.sequence_len
    x = torch.randint(0, spec["vocab"], (B, T), device=device)
    y = torch.randint(0, spec["vocab"], (B, T), device=device)
    sync = lambda: synchronize(device)  # noqa: E731
    steps = {"muonlab": _make_step(model, opt, x, y, runtime.autocast, sync)}
    if upstream is not None:
        up_model, up_opt = _upstream_model(upstream, model_config(cfg, spec["vocab"]), device, runtime.precision, cfg)
        steps["upstream"] = _make_step(up_model, up_opt, x, y, runtime.autocast, sync)
    med = interleaved(steps, repeats)
    step = med["muonlab"]["fwd_bwd"] + med["muonlab"]["opt"]
    out = {
        "shape": name, "device": str(device), "precision": runtime.precision, "batch": [B, T],
        "params": model.num_scaling_params()["total"],
        "tokens_per_second": B * T / step, "step_seconds": step,
        "optimizer_share": med["muonlab"]["opt"] / step, "peak_memory_mb": peak_memory_mb(device),
    }
    if upstream is not None:
        up = med["upstream"]
        up_step = up["fwd_bwd"] + up["opt"]
        out.update(upstream_step_seconds=up_step, ratio_step=step / up_step,
                   ratio_fwd_bwd=med["muonlab"]["fwd_bwd"] / up["fwd_bwd"],
                   ratio_optimizer=med["muonlab"]["opt"] / up["opt"])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="demo,d8")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--upstream", default=None, help="path to upstream autoresearch train.py")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    upstream = load_upstream(args.upstream) if args.upstream else None
    results = [bench_shape(s, args.repeats, upstream, args.precision) for s in args.shapes.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        line = (f"{r['shape']:>5} [{r['device']}, {r['precision']}, B x T = {r['batch'][0]} x {r['batch'][1]}, "
                f"{r['params'] / 1e6:.1f}M params]: {r['tokens_per_second']:,.0f} tok/s, optimizer "
                f"{100 * r['optimizer_share']:.1f}% of the step, peak memory {r['peak_memory_mb']:,.0f} MiB")
        print(line)
        if "ratio_step" in r:
            print(f"      muonlab / upstream time: step {r['ratio_step']:.3f}x, forward+backward "
                  f"{r['ratio_fwd_bwd']:.3f}x, optimizer {r['ratio_optimizer']:.3f}x")


if __name__ == "__main__":
    main()
