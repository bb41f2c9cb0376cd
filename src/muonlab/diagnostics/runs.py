"""Load a finished or interrupted run's model and optimizer state from its newest checkpoint.

The paper packs' checkpoint-reading diagnostics (geometry, replay, the tied table's, ...) share this: the
run's own config (config.json), the model rebuilt exactly as training built it (vocabulary size read from
the checkpoint's embedding, so no data is needed), the optimizer with its saved state, the prefetched next
batch, and the micro-batches of its next step (capture_batches). Tensors are loaded with weights_only=True (checkpoint.load_checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from muonlab.families import get_family
from muonlab.config import RunConfig, apply_overrides, load_config_file
from muonlab.device import Runtime, resolve_precision
from muonlab.errors import UsageError
from muonlab.train.build import build_model, build_optimizer
from muonlab.train.checkpoint import latest_checkpoint, list_checkpoints


@dataclass
class LoadedRun:
    cfg: RunConfig
    model: Any  # muonlab.model.GPT
    optimizer: Any  # MuonAdamW with the checkpoint's state
    checkpoint: dict
    checkpoint_path: Path
    runtime: Runtime

    @property
    def step(self) -> int:
        return int(self.checkpoint["step"])

    def pending_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch the run had prefetched for its next step (rank 0's)."""
        x, y, _ = self.checkpoint["pending"][0]
        return x.to(self.runtime.device), y.to(self.runtime.device)


def run_config(run_dir: str | Path) -> RunConfig:
    """A run directory's own config (its config.json); a directory without one is a usage error."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.json)")
    return load_config_file(run_dir / "config.json")


def require_family(run_dir: str | Path, families: tuple[str, ...], tool: str, reads: str) -> RunConfig:
    """The run's config when its model family is one of `families`; else one line naming what the
    diagnostic reads, before anything is loaded or built."""
    cfg = run_config(run_dir)
    if cfg.family not in families:
        raise UsageError(f"diagnose {tool} reads {reads} ({', '.join(families)} runs); {run_dir} is a {cfg.family} run")
    return cfg


def load_run(run_dir: str | Path, device: str = "cpu", precision: str = "fp32", fallback: bool = False) -> LoadedRun:
    """The run's model and optimizer at its newest valid checkpoint (fp32 on CPU by default)."""
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    if not list_checkpoints(run_dir):  # the trainer's "nothing to resume" would point at training again
        raise UsageError(f"{run_dir} holds no checkpoint: the diagnostics read the model and optimizer from one "
                         "(a run writes one at its end; a failed or cleaned run has none): diagnose a finished run")
    path, ckpt = latest_checkpoint(run_dir, fallback=fallback)
    dev = torch.device(device)
    runtime = Runtime(dev, resolve_precision(precision, dev))
    key = get_family(cfg.family).embedding_key
    vocab = ckpt["model"][key(cfg) if callable(key) else key].shape[0]
    # a run trained with --attn-backend fa3 is read back on SDPA off CUDA (FA3 exists only there)
    fa3_off_cuda = getattr(cfg.model, "attn_backend", None) == "fa3" and dev.type != "cuda"
    build_cfg = apply_overrides(cfg, {"model.attn_backend": "sdpa"}) if fa3_off_cuda else cfg
    model = build_model(build_cfg, vocab, runtime)
    model.load_state_dict(ckpt["model"])  # copy_ casts, e.g. bf16-trained tables into an fp32 model
    optimizer = build_optimizer(model, cfg, compile_step=False)
    optimizer.load_state_dict(ckpt["optimizer"])
    return LoadedRun(cfg, model, optimizer, ckpt, path, runtime)


def capture_batches(loaded: LoadedRun, micro_batches: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The micro-batches of the checkpoint's next step, on the run's device: every rank's pending batch, then
    the next accum-1 from its restored loader (the exact global batch of the next step); with
    `micro_batches` given, rank 0's stream only (its pending batch and the next micro_batches-1)."""
    from muonlab.data.prepare import prepare_data

    cfg, ckpt = loaded.cfg, loaded.checkpoint
    world = int(ckpt.get("world_size", 1))
    ranks = range(world) if micro_batches is None else range(1)
    per_rank = cfg.train.accum_steps_per_rank(world) if micro_batches is None else micro_batches
    if per_rank < 1:
        raise ValueError(f"micro_batches must be >= 1, got {per_rank}")
    data = prepare_data(cfg.data, log=lambda _msg: None)
    batches = []
    for rank in ranks:
        x, y, _ = ckpt["pending"][rank]
        batches.append((x, y))
        if per_rank > 1:
            loader = data.loader(cfg.train.device_batch_size, cfg.train.sequence_len, "train", rank=rank, world_size=world)
            loader.load_state_dict(ckpt["loader"][rank])
            batches += [next(loader)[:2] for _ in range(per_rank - 1)]
    dev = loaded.runtime.device
    return [(x.to(dev), y.to(dev)) for x, y in batches]
