"""`muonlab.load_run(RUN)`: a finished run's model, rebuilt from its config.json and its final
weights (model.safetensors; model.pt for runs written before it existed), or from the checkpoint
after `step` steps. The plug-ins the run used are imported first."""

from __future__ import annotations

from pathlib import Path

import torch

from muonlab.config import load_config_file
from muonlab.device import Runtime, resolve_precision
from muonlab.errors import UsageError
from muonlab.record.weights import load_safetensors
from muonlab.train.build import build_model
from muonlab.train.checkpoint import checkpoint_dir, load_checkpoint


def load_run(run_dir: str | Path, step: int | None = None, device: str = "cpu", vocab_size: int | None = None):
    """The run's model in eval mode, on `device` (cpu by default), with its final weights or those
    of the checkpoint after `step` steps. `vocab_size` is read from model.safetensors; give it for
    a run that has none (an older run's model.pt, or a checkpoint)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.json)")
    cfg = load_config_file(run_dir / "config.json")
    tensors = run_dir / "model.safetensors"
    metadata: dict[str, str] = {}
    if step is not None:
        path = checkpoint_dir(run_dir) / f"step-{step:06d}.pt"
        if not path.is_file():
            raise UsageError(f"{run_dir} has no checkpoint after step {step}")
        state = load_checkpoint(path)["model"]
        if tensors.is_file():
            metadata = load_safetensors(tensors)[1]
    elif tensors.is_file():
        state, metadata = load_safetensors(tensors)
    elif (run_dir / "model.pt").is_file():
        state = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
    else:
        raise UsageError(f"{run_dir} has no final weights (the run did not finish): give step= for a checkpoint")
    vocab = vocab_size or (int(metadata["vocab_size"]) if "vocab_size" in metadata else None)
    if vocab is None:
        raise UsageError(f"{run_dir}: its weights do not record the vocabulary size; give vocab_size=")
    where = torch.device(device)
    model = build_model(cfg, vocab, Runtime(where, resolve_precision(cfg.runtime.precision, where)))
    model.load_state_dict(state)
    return model.eval()
