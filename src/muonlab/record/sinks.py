"""Optional metric sinks: Weights & Biases and TensorBoard. Off by default, never required.

`--sinks wandb,tensorboard` streams each step's metrics (loss, lrm, tok/s, ...) and the final
summary. The packages are optional extras (`pip install 'muonlab[sinks]'`); asking for a sink
whose package is missing is a usage error, raised before training starts. The ledger and the
run directory stay the record of truth: sinks only mirror them.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from muonlab.errors import UsageError
from muonlab.optional import MissingPackage, install_hint, require
from muonlab.settings import comma_items, flatten

SINKS = ("wandb", "tensorboard")


_MODULES = {"wandb": "wandb", "tensorboard": "tensorboard"}


def parse_sinks(text: str) -> list[str]:
    """Validate a comma-separated sink list, including that each sink's package is installed."""
    names = comma_items(text, "sinks")
    unknown = [n for n in names if n not in SINKS]
    if unknown:
        raise UsageError(f"unknown metric sink {unknown[0]!r}; choose from {', '.join(SINKS)}")
    for name in names:
        if importlib.util.find_spec(_MODULES[name]) is None:  # found, not imported: wandb takes seconds
            raise MissingPackage(f"metric sink {name!r} needs the optional package {_MODULES[name]}: "
                                 f"{install_hint(_MODULES[name])}")
    return names


def _import(module: str, package: str):
    """`module` (torch.utils.tensorboard needs the tensorboard package), or the one-line install hint."""
    require(package, f"metric sink {package!r}")
    return importlib.import_module(module)


class WandbSink:
    def __init__(self, run_id: str, run_dir: Path, config: dict[str, Any], project: str, group: str,
                 tags: list[str]):
        wandb = _import("wandb", "wandb")
        # a resumed or requeued run keeps its id: resume="allow" continues the same wandb run
        self.run = wandb.init(project=project, name=run_id, id=run_id, dir=str(run_dir), config=config,
                              group=group, tags=tags, resume="allow")

    def log_step(self, record: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in record.items() if isinstance(v, (int, float)) and v is not None},
                     step=record["step"])

    def close(self, summary: dict[str, Any]) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str)):
                self.run.summary[key] = value
        self.run.finish()


class TensorBoardSink:
    def __init__(self, run_id: str, run_dir: Path, config: dict[str, Any], project: str, group: str,
                 tags: list[str]):
        tb = _import("torch.utils.tensorboard", "tensorboard")
        self.writer = tb.SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.writer.add_text("config", f"```\n{config}\n```")
        # the settings as hyperparameters (TensorBoard's HParams view compares runs by them)
        self.hparams = {k: v for k, v in flatten(config).items()
                        if isinstance(v, (int, float, str, bool)) and k not in ("format", "layers")}

    def log_step(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and value is not None:
                self.writer.add_scalar(f"train/{key}", value, record["step"])

    def close(self, summary: dict[str, Any]) -> None:
        scores = {}
        for key, value in summary.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value is not None:
                self.writer.add_scalar(f"summary/{key}", value, 0)
                scores[f"hparam/{key}"] = value
        self.writer.add_hparams(self.hparams, scores, run_name=".")
        self.writer.close()



class SinkGroup:
    """Fan-out to the requested sinks; an empty group costs nothing."""

    def __init__(self, names: list[str], run_id: str, run_dir: Path, config: dict[str, Any],
                 project: str = "muonlab", group: str | None = None, tags: list[str] | None = None):
        """`group` gathers runs on a dashboard (the arm: its seeds together); `tags` label the run
        (train/run.py: model family, seed, preset, protocol id)."""
        classes = {"wandb": WandbSink, "tensorboard": TensorBoardSink}
        group = group or str(config.get("arm"))
        self.sinks = [classes[n](run_id, run_dir, config, project, group, list(tags or [])) for n in names]

    def log_step(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log_step(record)

    def close(self, summary: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.close(summary)
