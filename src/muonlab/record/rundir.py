"""A run directory: resolved config, per-step metrics (JSONL), summary, final weights.

Layout (docs/design.md, Contracts):
    <runs_dir>/<run_id>/config.json     the resolved RunConfig, whole
                        metrics.jsonl   one line per optimizer step
                        summary.json    upstream's summary keys + holdout_bpb + status
                        model.pt        final weights (state_dict, read with weights_only=True)
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from muonlab.atomic import append_whole, atomic_open, writable_error, write_json, write_text
from muonlab.errors import MuonlabError, UsageError
from muonlab.paths import cache_root
from muonlab.record.weights import save_safetensors

# `cfg` below is a run config (muonlab.config.RunConfig): the record sits below the config layer,
# so it reads a config's `record` and `data` sections and never imports the class
RunConfigLike = Any


def runs_dir(cfg: RunConfigLike) -> Path:
    return Path(cfg.record.runs_dir).expanduser() if cfg.record.runs_dir else cache_root(cfg.data.cache_dir) / "runs"


def ledger_path(cfg: RunConfigLike) -> Path:
    return Path(cfg.record.ledger).expanduser() if cfg.record.ledger else runs_dir(cfg) / "ledger.jsonl"


def new_run_id(cfg: RunConfigLike) -> str:
    if cfg.record.run_name:
        return cfg.record.run_name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # a random suffix keeps ids unique when runs of one config start within the same second
    return f"{cfg.arm}-s{cfg.seed}-{stamp}-{cfg.config_hash()[:8]}-{os.urandom(2).hex()}"


def check_runs_folder(cfg: RunConfigLike) -> Path:
    """The runs folder, refused (one line) where the file system will not write it."""
    folder = runs_dir(cfg)
    if folder.exists() and not folder.is_dir():
        raise MuonlabError(f"the runs folder {folder} is a file: nothing was run (give another --runs-dir)")
    error = writable_error(folder)
    if error is not None:
        raise MuonlabError(f"cannot write the runs folder {folder}: nothing was run ({error.strerror}; give another "
                           "--runs-dir)")
    return folder


def check_new_run(cfg: RunConfigLike) -> None:
    """Refuse, before the run's data is made, a run whose directory could not be created: a runs folder
    the file system will not write, or a --run-name already holding a run."""
    name = cfg.record.run_name
    if name is not None and (name.strip() in ("", ".", "..") or name.startswith(".") or "\0" in name
                             or any(sep in name for sep in ("/", "\\"))):
        raise UsageError(f"--run-name must be a plain directory name (no '/' or '\\', not starting with '.'), "
                         f"got {name!r}")
    folder = check_runs_folder(cfg)
    named = folder / name if name else None
    if named is not None and named.exists() and (not named.is_dir() or any(named.iterdir())):
        raise UsageError(f"run directory {named} already exists: give another --run-name, or continue that run "
                         f"with --resume {named}")


class RunDir:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, cfg: RunConfigLike, run_id: str) -> "RunDir":
        path = runs_dir(cfg) / run_id
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"run directory {path} already exists")
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        write_json(path / "config.json", {"config": cfg.to_dict(), "config_hash": cfg.config_hash()})
        return run

    def truncate_metrics(self, steps_done: int) -> None:
        """Keep the metrics of steps < steps_done (a resumed run redoes the later ones)."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return
        kept = []
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] < steps_done:
                    kept.append(line)
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a torn last line from the interruption
        write_text(path, "".join(f"{line}\n" for line in kept))

    def write_summary(self, summary: dict) -> None:
        write_json(self.path / "summary.json", summary)

    def save_weights(self, model, metadata: dict[str, str] | None = None) -> Path:
        """model.pt (torch's format) and model.safetensors (record/weights.py) of the final weights."""
        target = self.path / "model.pt"
        state = model.state_dict()
        with atomic_open(target, "wb") as f:
            torch.save({k: v.detach().cpu() for k, v in state.items()}, f)
        save_safetensors(state, self.path / "model.safetensors", metadata or {})
        return target


@contextlib.contextmanager
def metrics_writer(path: Path) -> Iterator[Callable[[dict], None]]:
    """A function that appends one JSON line per step, each whole or not at all (a full disk
    leaves no partial line behind)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # less the umask, as open() creates files

    def write(record: dict) -> None:
        try:
            append_whole(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        except OSError as exc:  # os.write's errors do not name the file
            raise OSError(exc.errno, exc.strerror, str(path)) from exc

    try:
        yield write
    finally:
        os.close(fd)


POSTHOC_FILE = "evals.jsonl"  # a run's evaluations scored afterwards (`muonlab eval RUN --every N`)


def read_posthoc(run_dir: Path) -> list[dict]:
    """The evaluations `eval --every` recorded for a run ({"step", "tokens", "val_bpb", ...}); bad lines skipped."""
    path = Path(run_dir) / POSTHOC_FILE
    out = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("tokens"), int):
                out.append(row)
    return out



def periodic_evals(metrics_path: Path, tokens_per_step: int) -> list[dict]:
    """The periodic evaluations of a run's metrics.jsonl, in order: {"step": steps done, "tokens":
    tokens trained, "val_bpb": ..., ...} (a metrics line's `step` counts from 0, so the evaluation
    after N steps sits on the line of step N - 1). Unreadable lines are skipped."""
    out = []
    if not Path(metrics_path).is_file():
        return out
    with open(metrics_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
                step = int(row["step"]) + 1
            except (ValueError, KeyError, TypeError):
                continue
            scores = {k: v for k, v in row.items() if k.startswith("val_") and isinstance(v, (int, float))}
            if scores:
                out.append({"step": step, "tokens": step * tokens_per_step, **scores})
    return out
