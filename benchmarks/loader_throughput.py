"""The training data path's rate against the rate a step needs: can tokenizing and packing keep up with gpu-d8?

gpu-d8 trains 524,288 tokens a step. At a target MFU on a GPU of peak P (dense bf16), a step takes
524,288 * flops_per_token / (MFU * P) seconds, so the loader must make
    needed = MFU * P / flops_per_token   tokens per second.
This measures the loader muonlab trains with (best-fit packing of BOS-prefixed documents into rows of T+1,
upstream's; tokenizing with the run's BPE) on one core (the tokenizer held to one thread), encoding on
threads of the loader's process (up to 8), and in worker processes (up to 8, `data.encode_processes`), and
prints the ratio of each to `needed`, and how many cores a GPU node must give the data path for it never to
block a step. Threads share the GIL that tiktoken holds to build each result (and the training thread
needs): on a 16-core H100 node they made 0.83M tokens/s, the step waiting 60% of its time for data.

The corpus is the embedded Python standard library (`stdlib`), tokenized with a BPE of gpu-d8's vocabulary
(8,192) trained on it; ClimbMix web text has fewer tokens per byte than source code, so its tokens/s per core
is lower for the same bytes/s: both are printed. Absolute rates on a shared machine are noise; read the ratio.

    python benchmarks/loader_throughput.py [--batches 8] [--mfu 0.40] [--gpu H100] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import time

from muonlab.arms import resolve_config
from muonlab.data.packing import BestFitLoader
from muonlab.data.prepare import prepare_data
from muonlab.data.tokenizer import usable_cpus
from muonlab.device import Runtime, peak_flops_of
from muonlab.train.build import build_model


def _rate(loader, batches: int, tokens_per_batch: int) -> float:
    next(loader)  # the buffer's first fill is start-up, not the steady state
    start = time.perf_counter()
    for _ in range(batches):
        next(loader)
    return batches * tokens_per_batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8, help="micro-batches timed (gpu-d8: 64 x 2048 tokens each)")
    parser.add_argument("--mfu", type=float, default=0.40, help="the MFU the data path must keep up with")
    parser.add_argument("--gpu", default="H100", help="the GPU whose peak sets the step rate")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    cfg = resolve_config("baseline", "gpu-d8", {"data.source": "stdlib", "runtime.device": "cpu"})
    data = prepare_data(cfg.data, log=lambda _: None)
    B, T = cfg.train.device_batch_size, cfg.train.sequence_len
    flops_per_token = build_model(cfg, data.vocab_size, Runtime(__import__("torch").device("meta"), "fp32")
                                  ).estimate_flops()
    peak = peak_flops_of(f"NVIDIA {args.gpu}")
    needed = args.mfu * peak / flops_per_token

    tokenizer = data.tokenizer
    held = type("OneThread", (), {"encode_batch": functools.partial(tokenizer.encode_batch, num_threads=1)})()
    cores = usable_cpus()
    rates = {}
    for name, tok, workers, processes in (("one core", held, 1, 0), ("threads", tokenizer, max(1, min(8, cores)), 0),
                                          ("processes", tokenizer, 1, max(1, min(8, cores)))):
        loader = BestFitLoader(lambda start: data.documents("train", start), tok, B, T, encode_workers=workers,
                               encode_processes=processes)
        rates[name] = _rate(loader, args.batches, B * T)
    sample = b"".join(d.encode() for batch in [next(iter(data.documents("train")))] for d in batch.docs)
    tokens_per_byte = sum(len(ids) for ids in tokenizer.encode_batch([sample.decode()], prepend_bos=False)) / len(sample)
    one = rates["one core"]
    out = {"flops_per_token": flops_per_token, "gpu": args.gpu, "peak_flops": peak, "mfu": args.mfu,
           "needed_tokens_per_s": needed, "cores_here": cores, "tokens_per_byte_stdlib": tokens_per_byte,
           "bytes_per_s_one_core": one / tokens_per_byte, "cores_needed": needed / one,
           **{f"tokens_per_s_{k.replace(' ', '_')}": v for k, v in rates.items()},
           **{f"ratio_{k.replace(' ', '_')}": v / needed for k, v in rates.items()},
           "processes_over_threads": rates["processes"] / rates["threads"]}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"gpu-d8: {flops_per_token:,.0f} FLOPs/token; at {100 * args.mfu:.0f}% MFU of a {args.gpu} "
          f"({peak / 1e12:,.0f} TFLOP/s) a step needs {needed:,.0f} tokens/s from the loader")
    print(f"loader, one core:        {one:>12,.0f} tokens/s ({one / tokens_per_byte / 1e6:,.1f} MB/s of "
          f"text at {tokens_per_byte:.3f} tokens/byte): {one / needed:.2f}x the need; "
          f"{needed / one:.1f} core(s) keep up")
    for name in ("threads", "processes"):
        print(f"loader, {cores} {name:<9} here: {rates[name]:>11,.0f} tokens/s: {rates[name] / needed:.2f}x the need "
              f"({rates[name] / one:.2f}x one core)")
    print(f"encoding in processes / on threads: {out['processes_over_threads']:.2f}x")

if __name__ == "__main__":
    main()
