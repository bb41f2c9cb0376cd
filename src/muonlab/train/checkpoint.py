"""Checkpoints: everything a run needs to continue exactly where it stopped.

Layout: `<run_dir>/checkpoints/step-NNNNNN.pt` (written atomically: temp file, fsync, rename)
and beside it `step-NNNNNN.json`, written after the data, holding the format, step, size and
sha256 of the .pt file. A checkpoint without its sidecar is a write that did not finish (a kill
between the two files): resuming passes over it to the newest valid one, and says so. One whose
bytes do not match its sidecar (truncated, corrupted) is refused; `fallback=True` resumes from
the newest valid one instead. The `keep` newest checkpoints are kept, so a crash or a full disk
mid-write never loses the previous one.

Contents (read with torch.load(..., weights_only=True)): format, step (completed optimizer
steps), model and optimizer state dicts, the data loader's position, the batch already
prefetched for the next step, the loop's counters (training seconds, loss EMA) and the RNG
states of torch (CPU, and CUDA for the run's own device) and Python's `random`.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any, Callable

import torch

from muonlab.atomic import atomic_open, write_json
from muonlab.errors import MuonlabError

# /2: a method's optimizer group keys are its settings' dotted keys (`whiten.tau`; /1 wrote `whiten_tau`), so a
# release that reads /1 alone refuses a /2 checkpoint instead of running its methods at their defaults; /1 is read,
# its groups renamed on load (muonlab.optim.legacy_group_keys)
CHECKPOINT_FORMAT = "muonlab-checkpoint/2"
READABLE_FORMATS = ("muonlab-checkpoint/1", CHECKPOINT_FORMAT)


class _HashingWriter:
    """File wrapper that hashes what torch.save writes, so the data is never held twice."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _cuda_index(device: torch.device | None) -> int:
    """The CUDA device a run draws from: `device`'s index, else the current device (torchrun
    ranks are pinned to theirs, muonlab.train.distributed)."""
    if device is not None and device.index is not None:
        return device.index
    return torch.cuda.current_device()


def _uses_cuda(device: torch.device | None) -> bool:
    return torch.cuda.is_available() and (device is None or device.type == "cuda")


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """torch's CPU and Python's states, and the CUDA state of the run's own device only (the
    current one when `device` is None): a resume may see fewer GPUs (a sweep slot), and a rank
    draws from its device alone. Under torchrun rank 0 writes the checkpoint, so it holds rank 0's
    CUDA state; every rank restores that one, seeded and used alike on every rank."""
    state = {"torch": torch.get_rng_state(), "python": list(_to_lists(random.getstate()))}
    if _uses_cuda(device):
        state["cuda"] = torch.cuda.get_rng_state(_cuda_index(device))
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore `rng_state()`'s states, the CUDA one onto the run's device (`device`, else the
    current one)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    cuda = state.get("cuda")
    if cuda is None or not _uses_cuda(device):
        return
    index = _cuda_index(device)
    if isinstance(cuda, (list, tuple)):
        # Older checkpoints hold every GPU the writer saw (get_rng_state_all). The writer drew
        # from one: rank 0's cuda:0 under torchrun (a resume has the same world size), else the
        # run's own device, which a one-process resume keeps: this index. Where the writer saw
        # fewer GPUs than that (it ran with CUDA_VISIBLE_DEVICES narrowed), its device was the first.
        writer = 0 if torch.distributed.is_available() and torch.distributed.is_initialized() else index
        cuda = cuda[writer] if writer < len(cuda) else cuda[0]
    torch.cuda.set_rng_state(cuda, index)


def _to_lists(value):
    return [(_to_lists(v) if isinstance(v, tuple) else v) for v in value]


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write step-NNNNNN.pt and its sidecar; prune to the `keep` newest; return the path."""
    directory = checkpoint_dir(run_dir)
    path = directory / f"step-{step:06d}.pt"
    payload = {"format": CHECKPOINT_FORMAT, "step": step, **state}
    with atomic_open(path, "wb") as f:
        writer = _HashingWriter(f)
        torch.save(payload, writer)
    write_json(path.with_suffix(".json"), {"format": CHECKPOINT_FORMAT, "step": step,
                                           "bytes": writer.size, "sha256": writer.sha.hexdigest()})
    # what a killed writer left (one writer per run): temp files, and checkpoints without a sidecar,
    # which must not count among the `keep` newest
    for stale in [*directory.glob(".step-*.tmp"), *(p for p in list_checkpoints(run_dir)
                                                    if not p.with_suffix(".json").exists())]:
        stale.unlink(missing_ok=True)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)
    return path


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint files, oldest first (sidecar present or not)."""
    directory = checkpoint_dir(run_dir)
    return sorted(directory.glob("step-*.pt")) if directory.is_dir() else []


NO_SIDECAR = "no checksum sidecar (the write did not finish)"


def _sidecar(path: Path) -> dict | str:
    """The sidecar's contents, or why there are none."""
    sidecar = path.with_suffix(".json")
    if not sidecar.is_file():
        return NO_SIDECAR
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, json.JSONDecodeError):
        return "unreadable checksum sidecar"
    return meta if isinstance(meta, dict) else "unreadable checksum sidecar"


def newest_complete_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint whose write finished (sidecar present, size as recorded): a cheap
    check for the ledger's `resumable`; resuming verifies the checksum."""
    for path in reversed(list_checkpoints(run_dir)):
        meta = _sidecar(path)
        if isinstance(meta, dict) and path.stat().st_size == meta.get("bytes"):
            return path
    return None


def verify_checkpoint(path: Path) -> str | None:
    """None if the file matches its sidecar, else the reason it does not."""
    meta = _sidecar(path)
    if isinstance(meta, str):
        return meta
    if meta.get("format") not in READABLE_FORMATS:
        return f"unknown checkpoint format {meta.get('format')!r}"
    size = path.stat().st_size
    if size != meta.get("bytes"):
        return f"size {size} differs from the recorded {meta.get('bytes')} (truncated?)"
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            sha.update(chunk)
    if sha.hexdigest() != meta.get("sha256"):
        return "checksum mismatch (corrupted)"
    return None


def load_checkpoint(path: Path) -> dict[str, Any]:
    problem = verify_checkpoint(path)
    if problem:
        raise MuonlabError(f"checkpoint {path} refused: {problem}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("format") not in READABLE_FORMATS:
        raise MuonlabError(f"checkpoint {path} has format {state.get('format')!r}, not one of {', '.join(READABLE_FORMATS)}")
    return state


def latest_checkpoint(run_dir: Path, fallback: bool = False,
                      log: Callable[[str], None] | None = None) -> tuple[Path, dict[str, Any]]:
    """The newest valid checkpoint, passing over unfinished ones (no sidecar); a damaged one is an
    error, or with `fallback` passed over too."""
    candidates = list_checkpoints(run_dir)
    start_over = (f"nothing to resume: start the run again with `muonlab train --config "
                  f"{Path(run_dir) / 'config.json'}` (and a new --run-name if it was named)")
    if not candidates:
        raise MuonlabError(f"no checkpoint in {checkpoint_dir(run_dir)}; {start_over}")
    refused = []
    for path in reversed(candidates):
        problem = verify_checkpoint(path)
        if problem is None:
            if refused and log is not None:
                log(f"passed over {'; '.join(refused)}")
            return path, load_checkpoint(path)
        refused.append(f"{path.name}: {problem}")
        if not fallback and problem != NO_SIDECAR:
            raise MuonlabError(f"checkpoint {path} refused: {problem}; pass --fallback to resume "
                               "from the previous valid checkpoint")
    raise MuonlabError(f"no valid checkpoint in {checkpoint_dir(run_dir)} ({'; '.join(refused)}); {start_over}")
