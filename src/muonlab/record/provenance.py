"""Where a number came from: code version, environment, device and data fingerprints."""

from __future__ import annotations

import hashlib
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch

from muonlab.version import __version__


def _git(*args: str, cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode(errors="replace")


def code_provenance() -> dict[str, Any]:
    """Git commit of the muonlab checkout (if any) and a hash of its uncommitted diff."""
    root = Path(__file__).resolve().parents[1]  # the muonlab package
    commit = _git("rev-parse", "HEAD", cwd=root)
    if commit is None:
        return {"git_commit": None, "git_dirty": None, "git_diff_sha256": None}
    diff = _git("diff", "HEAD", cwd=root) or ""
    return {
        "git_commit": commit.strip(),
        "git_dirty": bool(diff),
        "git_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
    }


def environment_provenance(device: torch.device | None = None) -> dict[str, Any]:
    from muonlab.device import device_name

    return {
        "muonlab_version": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "device": str(device) if device is not None else None,
        "device_name": device_name(device) if device is not None else None,
    }


def collect(device: torch.device | None = None, **extra: Any) -> dict[str, Any]:
    """All provenance of a run; `extra` adds e.g. corpus and tokenizer hashes."""
    return {**code_provenance(), **environment_provenance(device), **extra}
