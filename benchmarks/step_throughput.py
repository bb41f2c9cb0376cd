"""Training-step throughput, the optimizer's share of step time, and peak memory, muonlab beside upstream.

Shapes: `d4w256`, the CPU shape of the speed issue (depth 4, width 256, T 256, vocab 2048,
16 rows), and `d8`, the seed papers' depth-8 model (width 512, T 2048, vocab 8192; one row per
micro-step on CPU). With `--upstream PATH/train.py` it also times upstream autoresearch's own
model and optimizer at the same configuration, interleaved in this process, and prints
muonlab / upstream time ratios (below 1.0: muonlab is faster). `--compile off,on` measures
both sides eager and both compiled (the model with torch.compile(dynamic=False), the optimizer
steps compiled as each code base compiles them). `--head-loss-ablation` adds muonlab with
upstream's unfused LM-head loss (`model.head_loss=reference`), so the fused loss's share of any
gain is measured, not inferred. Peak memory is the peak of live tensors during one eager step
(parameters, gradients, optimizer state, activations and temporaries), measured per contender.
Absolute times on shared machines are noise; read the ratios.

    python benchmarks/step_throughput.py [--shapes d4w256,d8] [--compile off,on] [--repeats 5]
        [--precision fp32] [--upstream train.py] [--head-loss-ablation] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, load_upstream, peak_tensor_bytes  # noqa: E402

from muonlab.config import apply_overrides, preset  # noqa: E402
from muonlab.device import Runtime, detect_device, resolve_precision, synchronize  # noqa: E402
from muonlab.model import GPTConfig  # noqa: E402
from muonlab.train.build import build_model, build_optimizer, model_config  # noqa: E402

SHAPES = {
    "d4w256": dict(preset="cpu-demo", vocab=2048, batch=16,
                   overrides={"model.depth": 4, "model.aspect_ratio": 64, "model.head_dim": 128}),
    "d8": dict(preset="gpu-d8", vocab=8192, batch=1, overrides={}),
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
        opt.zero_grad(set_to_none=True)
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
    with contextlib.redirect_stdout(io.StringIO()):  # upstream prints its LR scaling
        opt = model.setup_optimizer(unembedding_lr=cfg.optim.unembedding_lr, embedding_lr=cfg.optim.embedding_lr,
                                    matrix_lr=cfg.optim.matrix_lr, weight_decay=cfg.optim.weight_decay,
                                    adam_betas=(cfg.optim.adam_beta1, cfg.optim.adam_beta2), scalar_lr=cfg.optim.scalar_lr)
    return model, opt


def _contenders(name: str, precision: str, compiled: bool, upstream_path: str | None, ablation: bool):
    """{contender: (model, optimizer)} built at one shape, plus the run config and runtime."""
    spec = SHAPES[name]
    cfg = apply_overrides(preset(spec["preset"]), spec["overrides"])
    device = detect_device("auto")
    runtime = Runtime(device, resolve_precision(precision, device))
    built = {}
    head_losses = {"muonlab": "fused", **({"muonlab[reference head loss]": "reference"} if ablation else {})}
    for label, head_loss in head_losses.items():
        torch.manual_seed(0)
        run_cfg = apply_overrides(cfg, {"model.head_loss": head_loss})
        model = build_model(run_cfg, spec["vocab"], runtime)
        built[label] = (model, build_optimizer(model, run_cfg, compile_step=compiled))
    if upstream_path is not None:
        ns = load_upstream(upstream_path, compile=compiled)
        built["upstream"] = _upstream_model(ns, model_config(cfg, spec["vocab"]), device, runtime.precision, cfg)
    return built, cfg, runtime


def bench_shape(name: str, repeats: int, upstream_path: str | None, precision: str, compiled: bool,
                ablation: bool = False) -> dict:
    built, cfg, runtime = _contenders(name, precision, compiled, upstream_path, ablation)
    device, spec = runtime.device, SHAPES[name]
    B, T = spec["batch"], cfg.train.sequence_len
    x = torch.randint(0, spec["vocab"], (B, T), device=device)
    y = torch.randint(0, spec["vocab"], (B, T), device=device)
    sync = lambda: synchronize(device)  # noqa: E731
    steps = {}
    peaks = {}
    for label, (model, opt) in built.items():
        steps[label] = _make_step(model, opt, x, y, runtime.autocast, sync)
        if not compiled:  # the tracker is a dispatch mode: eager steps only (one step first: state exists)
            steps[label]()
            peaks[label] = peak_tensor_bytes(steps[label], (model, opt, x, y)) / 2**20
        else:
            built[label] = (torch.compile(model, dynamic=False), opt)
            steps[label] = _make_step(built[label][0], opt, x, y, runtime.autocast, sync)
    med = interleaved(steps, repeats)
    model = built["muonlab"][0]
    rows = {}
    for label, m in med.items():
        step = m["fwd_bwd"] + m["opt"]
        rows[label] = dict(step_seconds=step, fwd_bwd_seconds=m["fwd_bwd"], optimizer_seconds=m["opt"],
                           tokens_per_second=B * T / step, optimizer_share=m["opt"] / step,
                           peak_tensor_mib=peaks.get(label))
    out = {"shape": name, "device": str(device), "precision": runtime.precision, "compile": compiled,
           "batch": [B, T], "params": getattr(model, "_orig_mod", model).num_scaling_params()["total"],
           "repeats": repeats, "contenders": rows}
    if "upstream" in rows:
        up = rows["upstream"]
        out["ratios_to_upstream"] = {
            label: {"step": r["step_seconds"] / up["step_seconds"],
                    "fwd_bwd": r["fwd_bwd_seconds"] / up["fwd_bwd_seconds"],
                    "optimizer": r["optimizer_seconds"] / up["optimizer_seconds"],
                    **({"peak_memory": r["peak_tensor_mib"] / up["peak_tensor_mib"]} if r["peak_tensor_mib"] else {})}
            for label, r in rows.items() if label != "upstream"}
    return out


def format_result(r: dict) -> str:
    lines = [f"{r['shape']} [{r['device']}, {r['precision']}, compile {'on' if r['compile'] else 'off'}, "
             f"B x T = {r['batch'][0]} x {r['batch'][1]}, {r['params'] / 1e6:.1f}M params, "
             f"median of {r['repeats']}]"]
    width = max(len(k) for k in r["contenders"])
    for label, c in r["contenders"].items():
        peak = "" if c["peak_tensor_mib"] is None else f", peak tensors {c['peak_tensor_mib']:,.0f} MiB"
        lines.append(f"  {label:<{width}}  {c['tokens_per_second']:>8,.0f} tok/s, step {c['step_seconds']:.3f}s "
                     f"(optimizer {100 * c['optimizer_share']:.1f}%){peak}")
    for label, q in r.get("ratios_to_upstream", {}).items():
        mem = f", peak memory {q['peak_memory']:.3f}x" if "peak_memory" in q else ""
        lines.append(f"  {label} / upstream time: step {q['step']:.3f}x, forward+backward {q['fwd_bwd']:.3f}x, "
                     f"optimizer {q['optimizer']:.3f}x{mem}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="d4w256,d8")
    parser.add_argument("--compile", default="off", help="comma list of off, on")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--upstream", default=None, help="path to upstream autoresearch train.py")
    parser.add_argument("--head-loss-ablation", action="store_true",
                        help="also time muonlab with upstream's unfused LM-head loss")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = [m.strip() for m in args.compile.split(",")]
    if any(m not in ("off", "on") for m in modes):
        parser.error(f"--compile takes off and/or on, got {args.compile!r}")
    shapes = [s.strip() for s in args.shapes.split(",")]
    if any(s not in SHAPES for s in shapes):
        parser.error(f"--shapes: choose from {', '.join(SHAPES)}, got {args.shapes!r}")
    if args.upstream and not Path(args.upstream).is_file():
        parser.error(f"--upstream: no file {args.upstream}")
    warnings.filterwarnings("ignore", module="torch")  # compile-stack notices, not results
    results = []
    for shape in shapes:
        for mode in modes:
            results.append(bench_shape(shape, args.repeats, args.upstream, args.precision, mode == "on",
                                       args.head_loss_ablation))
            if not args.json:
                print(format_result(results[-1]), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
