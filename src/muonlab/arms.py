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
    seeds: tuple[int, ...] = ()  # the paper's seeds: the sweep's default when --seeds is omitted

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


def default_seeds(arm_names: list[str]) -> list[int]:
    """The seeds the arms' papers used; the arms must agree."""
    seeds = {get_arm(name).seeds for name in arm_names}
    if len(seeds) != 1 or not next(iter(seeds)):
        raise UsageError("these arms list no common default seeds; pass --seeds")
    return list(next(iter(seeds)))


# Seed 000 (../shared/seeds/000_*.txt) Tables 3-4A: the optimizer part of each run family. The
# paper's runs also carry pair-tied QK and gains (forward variants, a later issue); until those
# land these arms reproduce the pre-polar/precision change alone. Seeds 42, 47, 137 (spec-000-003 §3).
_SEED000 = (42, 47, 137)
for _name, _exp, _overrides in [
    ("exp44_hbieq_bf16", "exp48/44/49", dict(prepolar="hbieq")),
    ("exp27_hbieq_fp32", "exp26/27/32", dict(prepolar="hbieq", post_polar_dtype="fp32")),
    ("exp50_bieq_undamped_bf16", "exp56/50/57", dict(prepolar="hbieq", prepolar_tau=0.0)),
    ("exp51_rowrms1_bf16", "exp51", dict(prepolar="hbieq", prepolar_passes=1, prepolar_sides="row")),
    ("exp47_hbieq_square_only_bf16", "exp47", dict(prepolar="hbieq", prepolar_scope="square_only")),
    ("exp58_zeta_bf16", "exp59/58/60", dict(prepolar="zeta")),
    ("exp52_turbo_aol_bf16", "exp62/52/63", dict(prepolar="turbo_aol")),
    ("exp53_muon2f_bf16", "exp53", dict(prepolar="muon2f")),
    ("exp40_postpolar_fp32", "exp42/40/45", dict(post_polar_dtype="fp32")),
]:
    register(Arm(name=_name, description=f"seed 000 {_exp}: pre-polar conditioning / precision "
                 "(optimizer part only; pair-tied QK arrives with the forward variants)",
                 overrides=_overrides, paper="seed 000", experiment=_exp, family="prepolar", seeds=_SEED000))


# Seed 002 (../shared/seeds/002_*.txt) dense arms, seeds 41, 42, 47 (spec-002 §1.12, §3.3). The
# fixed-step progress of §1.2 is the preset's; 01_dense_opt follows when Neumann whitening and
# master32 land.
_SEED002 = (41, 42, 47)
register(Arm(name="00_dense_native", description="seed 002 00_dense_native: the baseline under the paper's protocol",
             paper="seed 002", experiment="00_dense_native", family="seed002", seeds=_SEED002))
register(Arm(name="00_dense_native_lr141",
             description="seed 002 LR141: every LR x sqrt(2), Muon weight decay x 1/sqrt(2) (spec-002 §1.10)",
             overrides={"lr_scale": 2 ** 0.5}, paper="seed 002", experiment="00_dense_native_lr141",
             family="seed002", seeds=_SEED002))

# 01_dense_opt: the six OPT sub-components of spec-002 §1.4, all on (the "0-trainable-parameter
# backward optimizer"): 2-pass homotopy BiEq with tau 25, Polar Express and post-polar in fp32,
# warmdown momentum cooldown, Neumann-Gram vocabulary whitening (tau 80), fp32 master state for
# wte and value embeddings, cosine Muon weight decay.
_OPT = dict(prepolar="hbieq", prepolar_tau=25.0, polar_dtype="fp32", post_polar_dtype="fp32",
            muon_momentum_cooldown=True, whiten="neumann", whiten_tau=80.0, embedding_state="master32",
            muon_wd_schedule="cosine")
register(Arm(name="01_dense_opt", description="seed 002 01_dense_opt: BiEq(tau 25) + PE32 + momentum cooldown + "
             "Neumann whitening + master32 + cosine WD", overrides=_OPT, paper="seed 002",
             experiment="01_dense_opt", family="seed002", seeds=_SEED002))
register(Arm(name="01_dense_opt_lr141", description="seed 002 01_dense_opt with LR x sqrt(2), Muon WD x 1/sqrt(2)",
             overrides={**_OPT, "lr_scale": 2 ** 0.5}, paper="seed 002", experiment="01_dense_opt_lr141",
             family="seed002", seeds=_SEED002))
