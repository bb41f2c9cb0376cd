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
from muonlab.train.checkpoint import checkpoint_dir, list_checkpoints, load_checkpoint


def run_weights(run_dir: Path, step: int | None = None) -> tuple[Path, dict, dict[str, str]]:
    """(the file, the state dict, the safetensors metadata) of a run's final weights (model.safetensors;
    model.pt for runs written before it existed) or of the checkpoint after `step` steps; UsageError
    naming the checkpoints there are when the asked-for weights are not."""
    tensors = run_dir / "model.safetensors"
    metadata = load_safetensors(tensors)[1] if tensors.is_file() else {}
    if step is not None:
        path = checkpoint_dir(run_dir) / f"step-{step:06d}.pt"
        if not path.is_file():
            raise UsageError(f"{run_dir} has no checkpoint after step {step} ({_checkpoints(run_dir)})")
        return path, load_checkpoint(path)["model"], metadata
    if tensors.is_file():
        state, metadata = load_safetensors(tensors)
        return tensors, state, metadata
    if (run_dir / "model.pt").is_file():
        return run_dir / "model.pt", torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True), {}
    raise UsageError(f"{run_dir} has no final weights (the run did not finish): give a step for one of its "
                     f"checkpoints ({_checkpoints(run_dir)})")


def _checkpoints(run_dir: Path) -> str:
    steps = [int(p.stem.split("-")[1]) for p in list_checkpoints(run_dir)]
    return "checkpoints after steps " + ", ".join(map(str, steps)) if steps else "it kept no checkpoint"


def load_run(run_dir: str | Path, step: int | None = None, device: str = "cpu", vocab_size: int | None = None):
    """The run's model in eval mode, on `device` (cpu by default), with its final weights or those
    of the checkpoint after `step` steps. `vocab_size` is read from model.safetensors; give it for
    a run that has none (an older run's model.pt, or a checkpoint)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.json)")
    cfg = load_config_file(run_dir / "config.json")
    _, state, metadata = run_weights(run_dir, step)
    vocab = vocab_size or (int(metadata["vocab_size"]) if "vocab_size" in metadata else None)
    if vocab is None:
        raise UsageError(f"{run_dir}: its weights do not record the vocabulary size; give vocab_size=")
    where = torch.device(device)
    model = build_model(cfg, vocab, Runtime(where, resolve_precision(cfg.runtime.precision, where)))
    model.load_state_dict(state)
    return model.eval()
