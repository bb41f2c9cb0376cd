"""AF-Muon against Hybrid Muon: optimizer step time on CPU and optimizer-state bytes (seed 004).

Step time: the tied GPT at the CPU demo shapes (`tied-cpu` model preset: vocab 2048, 4 layers,
width 256), one model per optimizer with the same weights and the same gradients, optimizer
steps interleaved in one process after warm-up (target: AF-Muon <= 1.05x Hybrid).
State bytes: the NanoGPT-124M parameter set (vocab 50,304, d 768, 12 layers) built on the meta
device, every state tensor created as the first step creates it (AFMuon.init_state) and
counted (target: AF-Muon <= 0.8x Hybrid, the paper's ~20% saving).

    .venv/bin/python benchmarks/af_muon.py [--repeats 7] [--warmup 2] [--json]
"""

from __future__ import annotations

import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_main, time_optimizer_steps  # noqa: E402

from muonlab.optim.af_muon import build_optimizer, state_bytes  # noqa: E402
from muonlab.families.tied.model import build_tied_model  # noqa: E402


def _state_ratio() -> dict:
    sizes = {}
    for preset in ("afmuon", "hybrid"):
        with torch.device("meta"):
            model = build_tied_model("nanogpt-124m")
        opt = build_optimizer(model, preset)
        opt.init_state()
        sizes[preset] = state_bytes(opt)
    return {"afmuon_state_bytes": sizes["afmuon"], "hybrid_state_bytes": sizes["hybrid"],
            "state_ratio": sizes["afmuon"] / sizes["hybrid"]}


def run(repeats: int = 7, warmup: int = 2) -> dict:
    torch.manual_seed(0)
    base = build_tied_model("tied-cpu")
    idx = torch.randint(0, base.config.vocab_size, (4, base.config.sequence_len))
    opts = {}
    for preset in ("hybrid", "afmuon"):
        model = copy.deepcopy(base)  # same weights (the tie survives deepcopy) and, below, the same gradients
        model(idx, idx.roll(-1, 1)).backward()
        opts[preset] = build_optimizer(model, preset)
    times = time_optimizer_steps(opts, repeats, warmup)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"shape": "tied-cpu", "repeats": repeats, "threads": torch.get_num_threads(),
            "hybrid_step_s": med["hybrid"], "afmuon_step_s": med["afmuon"],
            "step_ratio": med["afmuon"] / med["hybrid"], **_state_ratio()}


def format_table(res: dict) -> str:
    ok_t = "met" if res["step_ratio"] <= 1.05 else "MISSED"
    ok_b = "met" if res["state_ratio"] <= 0.8 else "MISSED"
    return "\n".join([
        f"optimizer step at the tied-GPT demo shapes ({res['repeats']} interleaved repeats, {res['threads']} threads): "
        f"Hybrid {res['hybrid_step_s']:.4f} s, AF-Muon {res['afmuon_step_s']:.4f} s -> {res['step_ratio']:.3f}x "
        f"(target <= 1.05x: {ok_t})",
        f"optimizer state, NanoGPT-124M: AF-Muon {res['afmuon_state_bytes'] / 2**30:.3f} GiB, Hybrid "
        f"{res['hybrid_state_bytes'] / 2**30:.3f} GiB -> {res['state_ratio']:.4f}x (target <= 0.8x: {ok_b})",
    ])


def main(argv=None):
    bench_main(__doc__, run, format_table, argv)


if __name__ == "__main__":
    main()
