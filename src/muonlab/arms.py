"""The arms registry: named, documented config overrides on top of a protocol preset.

An arm says what it changes (`overrides`, TrainConfig field names; a nested `data` dict for
DataConfig) and where it comes from (`paper`, `experiment`). Later families register their
arms here, next to the module where their variant acts. Arms never carry a preset: the sweep's
`--preset` chooses the protocol, so one arm runs under `cpu-tiny` and `gpu-d8` alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from muonlab.config import TrainConfig, apply_overrides, preset
from muonlab.errors import UsageError


@dataclass(frozen=True)
class Arm:
    name: str
    description: str
    overrides: dict[str, Any] = field(default_factory=dict)
    paper: str | None = None  # e.g. "seed 002" (../shared/seeds/002_*.txt)
    experiment: str | None = None  # the paper's id for the run, e.g. "arm 01"
    family: str = "baseline"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ARMS: dict[str, Arm] = {}


def register(arm: Arm) -> Arm:
    if arm.name in ARMS:
        raise ValueError(f"arm {arm.name!r} is already registered")
    # fail at import time, not mid-sweep, if an override names no config field
    apply_overrides(TrainConfig(), arm.overrides)
    ARMS[arm.name] = arm
    return arm


def get_arm(name: str) -> Arm:
    if name not in ARMS:
        raise UsageError(f"unknown arm {name!r}; known arms: {', '.join(sorted(ARMS))}")
    return ARMS[name]


def resolve_config(arm_name: str, preset_name: str, extra: dict[str, Any] | None = None) -> TrainConfig:
    """preset -> arm overrides -> extra overrides (e.g. CLI flags), with cfg.arm set."""
    arm = get_arm(arm_name)
    cfg = apply_overrides(preset(preset_name), arm.overrides)
    cfg = apply_overrides(cfg, extra or {})
    cfg.arm = arm.name
    return cfg.validate()


register(Arm(
    name="baseline",
    description="upstream autoresearch: MuonAdamW (Muon on block matrices, AdamW elsewhere)",
    paper="autoresearch 228791f", experiment="train.py",
))
register(Arm(
    name="adamw_only",
    description="control: every block matrix on AdamW (lr adamw_matrix_lr=3e-3, no weight decay) instead of Muon",
    overrides={"matrix_optimizer": "adamw"},
    family="control",
))
