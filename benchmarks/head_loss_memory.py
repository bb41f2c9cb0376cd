"""Peak memory of the LM-head loss (forward + backward), fused against upstream's unfused ops,
measured on CPU at scaled shapes and carried to the GPU presets.

The head alone: x [N, d] (N = rows of one micro-batch) -> soft-capped cross-entropy -> backward,
eager, bf16 autocast and fp32, peak live tensors by torch's MemTracker beyond x, W and their
gradients. The unfused path holds whole [N, V] tensors (the product, its fp32 copy, tanh,
log-softmax and their gradients), so its peak is a fixed number of bytes per logit, read off the
measurement as peak / (N V); the fused path holds one chunk of ceil(V/d) and the [N, d] input
gradient, so its peak per logit falls as N V grows. The last table multiplies the measured bytes
per logit (unfused) and the measured bytes per chunk logit plus the [N, d] terms (fused) out to
the presets' micro-batches (eager; torch.compile fuses part of the unfused chain on a GPU, so
there the unfused figure is an upper bound).

    python benchmarks/head_loss_memory.py [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import peak_tensor_bytes  # noqa: E402

from muonlab.model.head_loss import default_chunk_rows, reference_softcapped_cross_entropy, softcapped_cross_entropy  # noqa: E402

CAP = 15.0
SCALED = [(2048, 2048, 256), (4096, 2048, 256), (2048, 8192, 512)]  # (N, V, d) on CPU
PRESETS = {"gpu-d8": (64 * 2048, 8192, 512), "upstream": (128 * 2048, 8192, 512)}  # device batch x T


def head_peak(n: int, v: int, d: int, fused: bool, precision: str) -> int:
    """Peak bytes beyond x and W during one loss + backward of the head (their new fp32
    gradients included, as in a training step after zero_grad(set_to_none=True))."""
    torch.manual_seed(0)
    x = torch.randn(n, d, requires_grad=True)
    w = (0.02 * torch.randn(v, d)).requires_grad_()
    y = torch.randint(0, v, (n,))
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext())
    loss_fn = softcapped_cross_entropy if fused else reference_softcapped_cross_entropy

    def step():
        x.grad = w.grad = None
        with autocast:
            loss = loss_fn(x, w, y, CAP)
        loss.backward()

    step()  # a first call, as the step benchmark warms up
    return peak_tensor_bytes(step, (x, w, y)) - (x.numel() + w.numel()) * 4 - y.numel() * 8


def run() -> dict:
    rows = []
    for precision in ("bf16", "fp32"):
        for n, v, d in SCALED:
            ref, fused = head_peak(n, v, d, False, precision), head_peak(n, v, d, True, precision)
            chunk = default_chunk_rows(n, v, d)
            # fused: chunk logits [chunk, V] plus the gradients (x's saved and returned, W's) and the cast input
            fixed = n * d * (8 + (2 if precision == "bf16" else 0)) + v * d * (8 + (2 if precision == "bf16" else 0))
            per_chunk_logit = (fused - fixed) / (chunk * v)
            rows.append(dict(precision=precision, N=n, V=v, d=d, chunk_rows=chunk, reference_mib=ref / 2**20,
                             fused_mib=fused / 2**20, reference_bytes_per_logit=ref / (n * v),
                             fused_bytes_per_chunk_logit=per_chunk_logit))
    presets = {}
    for name, (n, v, d) in PRESETS.items():
        bf16 = [r for r in rows if r["precision"] == "bf16"]
        ref_b = max(r["reference_bytes_per_logit"] for r in bf16)
        chunk_b = max(r["fused_bytes_per_chunk_logit"] for r in bf16)
        chunk = default_chunk_rows(n, v, d)
        presets[name] = dict(N=n, V=v, d=d, chunk_rows=chunk, reference_gib=ref_b * n * v / 2**30,
                             fused_gib=(chunk_b * chunk * v + (n + v) * d * 10) / 2**30)
    return {"measured": rows, "presets_bf16_eager": presets}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print("measured (CPU, eager): peak MiB of the head's loss + backward")
    for r in res["measured"]:
        print(f"  {r['precision']:>4} N {r['N']:>6} V {r['V']:>5} d {r['d']:>4} (chunks of {r['chunk_rows']:>4} rows): "
              f"reference {r['reference_mib']:7.1f} ({r['reference_bytes_per_logit']:.2f} B/logit), "
              f"fused {r['fused_mib']:6.1f} ({r['fused_bytes_per_chunk_logit']:.2f} B/chunk logit)")
    print("carried to the presets' micro-batches (bf16 autocast, eager):")
    for name, p in res["presets_bf16_eager"].items():
        print(f"  {name:>8}: N {p['N']:,} x V {p['V']:,}: reference {p['reference_gib']:.2f} GiB, "
              f"fused {p['fused_gib']:.2f} GiB (chunks of {p['chunk_rows']:,} rows)")


if __name__ == "__main__":
    main()
