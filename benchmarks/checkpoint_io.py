"""Checkpoint write time, verification time and size for the demo and depth-8 models.

A checkpoint holds the model, the full optimizer state (after one step, so every moment and
momentum buffer exists), and small loader/RNG/loop entries; it is written atomically and
checksummed (muonlab.train.checkpoint). Sizes are exact; times are this machine's.

    python benchmarks/checkpoint_io.py [--shapes demo,d8] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from muonlab.config import preset
from muonlab.device import Runtime
from muonlab.train.build import build_model, build_optimizer
from muonlab.train.checkpoint import load_checkpoint, rng_state, save_checkpoint

SHAPES = {"demo": ("cpu-demo", 2048), "d8": ("gpu-d8", 8192)}


def bench(name: str, directory: Path) -> dict:
    preset_name, vocab = SHAPES[name]
    cfg = preset(preset_name)
    runtime = Runtime(torch.device("cpu"), "fp32")
    model = build_model(cfg, vocab, runtime)
    opt = build_optimizer(model, cfg, compile_step=False)
    for p in model.parameters():  # one step with random gradients creates every state buffer
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    state = dict(model=model.state_dict(), optimizer=opt.state_dict(), loader=[{}], pending=[None],
                 loop={"step": 1}, rng=rng_state(), config_hash=cfg.config_hash(), world_size=1)
    t0 = time.perf_counter()
    path = save_checkpoint(directory / name, 1, state)
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_checkpoint(path)
    t_load = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    return dict(shape=name, params=params, bytes=path.stat().st_size, write_s=t_write, verify_load_s=t_load)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="demo,d8")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name in args.shapes.split(","):
            r = bench(name, Path(tmp))
            print(f"{r['shape']:>5}: {r['params'] / 1e6:.1f}M params, checkpoint {r['bytes'] / 2**20:,.1f} MiB "
                  f"({r['bytes'] / r['params']:.1f} bytes/param), write {r['write_s']:.2f}s "
                  f"({r['bytes'] / 2**20 / r['write_s']:,.0f} MiB/s), verify+load {r['verify_load_s']:.2f}s")


if __name__ == "__main__":
    main()
