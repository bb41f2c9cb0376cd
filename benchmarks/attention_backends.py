"""Time one sliding-window attention layer, forward and backward, on each CUDA backend side by side
in one process: `flex` (FlexAttention's block mask, what `auto` runs without FA3), `sdpa` (SDPA
with an explicit T x T window mask, the path it replaces) and `fa3` where FlashAttention-3 loads.
Interleaved rounds, median ms per call, and each backend's time over flex's. The same timing runs
inside the GPU check's throughput section (muonlab.model.attention_timing).

    python benchmarks/attention_backends.py [--batch 16] [--seq 2048] [--window 1024] [--rounds 20] [--json]

Defaults: gpu-d8's layer (4 heads of 128 channels, 2,048 tokens, the S layers' 1,024-token window)
at 16 rows. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import sys

from muonlab.model.attention_timing import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    raise SystemExit(main(argv if any(a.startswith("--rounds") for a in argv) else [*argv, "--rounds", "20"]))
