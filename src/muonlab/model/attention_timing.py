"""One sliding-window attention layer, forward and backward, timed on each CUDA backend side by side in
one process: `flex` (FlexAttention's block mask, what `auto` runs without FA3), `sdpa` (SDPA with an
explicit T x T window mask, the path flex replaced) and `fa3` where FlashAttention-3 loads. Interleaved
rounds, each call between CUDA events; the median ms per call and each backend's time over flex's.

Used by benchmarks/attention_backends.py and by the GPU check's throughput section
(`python -m muonlab.model.attention_timing --json`, in a child process with its own limit).
Defaults: gpu-d8's layer (4 heads of 128 channels, 2,048 tokens, the short layers' 1,024-token window).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class LayerShape:
    batch: int = 16
    seq: int = 2048
    heads: int = 4
    head_dim: int = 128
    window: int = 1024


def time_backends(shape: LayerShape = LayerShape(), rounds: int = 10, warmup: int = 3) -> dict[str, Any]:
    """Median milliseconds per forward+backward call of each backend that runs here (CUDA only), and the
    reason fa3 was not timed when it cannot load."""
    import torch  # noqa: PLC0415

    from muonlab.errors import MuonlabError  # noqa: PLC0415
    from muonlab.model.attention import causal_attention, resolve_backend  # noqa: PLC0415

    if not torch.cuda.is_available():
        raise MuonlabError("no CUDA device found: attention backends are timed on a GPU only")
    device = torch.device("cuda")
    size = (shape.batch, shape.seq, shape.heads, shape.head_dim)
    q, k, v = (torch.randn(size, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(size, device=device, dtype=torch.bfloat16)
    window = (shape.window, 0)

    def layer(backend: str, func: Callable[..., Any] | None = None) -> Callable[[], None]:
        def run() -> None:
            out = causal_attention(q, k, v, window, backend, func)
            torch.autograd.grad(out, (q, k, v), dout)
        return run

    runs = {"flex": layer("flex"), "sdpa": layer("sdpa")}
    fa3_reason = None
    try:
        runs["fa3"] = layer("fa3", resolve_backend("fa3", device).flash_attn_func)
    except MuonlabError as exc:
        fa3_reason = str(exc)
    for run in runs.values():  # compile and warm up
        for _ in range(warmup):
            run()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end))
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"device_name": torch.cuda.get_device_name(device), "shape": asdict(shape), "rounds": rounds,
            "median_ms": median, "over_flex": {name: ms / median["flex"] for name, ms in median.items()},
            "fa3_not_timed": fa3_reason}


def format_timing(result: dict[str, Any]) -> str:
    s = result["shape"]
    lines = [f"{result['device_name']}, B={s['batch']} T={s['seq']} H={s['heads']} D={s['head_dim']} "
             f"window={s['window']}, forward + backward, median of {result['rounds']} rounds:"]
    lines += [f"  {name:<5} {ms:8.3f} ms  ({result['over_flex'][name]:5.2f} x flex)"
              for name, ms in result["median_ms"].items()]
    if result["fa3_not_timed"]:
        lines.append(f"  fa3 not timed: {result['fa3_not_timed']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = LayerShape()
    for name in ("batch", "seq", "heads", "head_dim", "window"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    for name in ("batch", "seq", "heads", "head_dim", "window", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        print(json.dumps({"status": "skipped"}) if args.json else "no CUDA device found: nothing timed")
        return 0
    shape = LayerShape(args.batch, args.seq, args.heads, args.head_dim, args.window)
    result = time_backends(shape, args.rounds)
    print(json.dumps(result) if args.json else format_timing(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
