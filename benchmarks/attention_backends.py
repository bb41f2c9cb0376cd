"""Time one sliding-window attention layer, forward and backward, on each CUDA backend side by side
in one process: `flex` (FlexAttention's block mask, what `auto` runs without FA3), `sdpa` (SDPA
with an explicit T x T window mask, the path it replaces) and `fa3` where FlashAttention-3 loads.
Interleaved rounds, median ms per call, and each backend's time over flex's.

    python benchmarks/attention_backends.py [--batch 16] [--seq 2048] [--window 1024] [--rounds 20]

Defaults: gpu-d8's layer (4 heads of 128 channels, 2,048 tokens, the S layers' 1,024-token window)
at 16 rows. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics

import torch


def _layer(backend: str, q, k, v, dout, window, flash_attn_func=None):
    from muonlab.model.attention import causal_attention

    def run():
        out = causal_attention(q, k, v, window, backend, flash_attn_func)
        torch.autograd.grad(out, (q, k, v), dout)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device found: nothing timed")
        return
    from muonlab.errors import MuonlabError
    from muonlab.model.attention import resolve_backend

    device = torch.device("cuda")
    shape = (args.batch, args.seq, args.heads, args.head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device=device, dtype=torch.bfloat16)
    window = (args.window, 0)
    runs = {"flex": _layer("flex", q, k, v, dout, window), "sdpa": _layer("sdpa", q, k, v, dout, window)}
    try:
        runs["fa3"] = _layer("fa3", q, k, v, dout, window, resolve_backend("fa3", device).flash_attn_func)
    except MuonlabError as exc:
        print(f"fa3 not timed: {exc}")
    for run in runs.values():  # compile and warm up
        for _ in range(3):
            run()
    torch.cuda.synchronize()
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end))
    base = statistics.median(times["flex"])
    print(f"{torch.cuda.get_device_name(device)}, B={args.batch} T={args.seq} H={args.heads} D={args.head_dim} "
          f"window={args.window}, forward + backward:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<5} {median:8.3f} ms  ({median / base:5.2f} x flex)")


if __name__ == "__main__":
    main()
