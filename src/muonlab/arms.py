"""The arms registry: named, documented config overrides on top of a protocol preset.

An arm says what it changes (`overrides`: dotted keys of the run config, muonlab.config; they may
be written with the flat flag names, and are stored dotted) and where it comes from (`paper`, `experiment`).
This module holds the registry and the upstream arms (baseline, adamw_only); each seed paper's arms are in its
pack (muonlab.papers.<seed>.arms), registered by `register` as a plug-in registers its own, when this module is
first imported, with the pack itself (`register_pack`: its printed tables and its diagnostics). Arms never carry a preset: the sweep's
`--preset` chooses the protocol, so one arm runs under `cpu-tiny` and `gpu-d8` alike.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import asdict, dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from muonlab.config import RunConfig, all_presets, build_config, canonical_overrides, family_leaves
from muonlab.errors import UsageError
from muonlab.families import get_family
from muonlab.record.ledger import read_records_tolerant
from muonlab.record.protocol import recorded_arm_overrides
from muonlab.settings import coerce


@dataclass(frozen=True)
class Arm:
    name: str
    description: str
    overrides: dict[str, Any] = field(default_factory=dict)
    paper: str | None = None  # the paper, as its pack names it (muonlab.papers)
    experiment: str | None = None  # the paper's id for the run, e.g. "arm 01"
    group: str = "baseline"  # the paper's label for the arm's set (prepolar, seed002, ...), not a model family
    seeds: tuple[int, ...] = ()  # the paper's seeds: the sweep's default when --seeds is omitted
    # the model families whose presets the arm runs under when it sets none itself (a paper's arms that act
    # on every tied family); its overrides are checked against each at registration
    model_families: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ARMS: dict[str, Arm] = {}


def register(arm: Arm) -> Arm:
    """Register an arm, its overrides stored as dotted keys (an override that names no setting
    fails here). Whether each acts is checked when the arm is resolved (resolve_config) and, for
    every registered arm, by tests/arms/test_arms.py (check_arm): importing the registry builds no config."""
    if arm.name in ARMS:
        raise ValueError(f"arm {arm.name!r} is already registered")
    arm = Arm(**{**arm.to_dict(), "overrides": canonical_overrides(arm.overrides)})
    ARMS[arm.name] = arm
    return arm


ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # a name that is also a file name (run dirs, job files)
METHOD_SECTIONS = ("model.", "optim.")  # the settings an arm given on the command line takes (define_arm)


def define_arm(name: str, overrides: dict[str, Any], base: str = "baseline", description: str = "",
               ledger: str | Path | None = None) -> Arm:
    """An arm defined outside the registry (an experiment file, `muonlab train --arm-name`): the
    registered arm `base`'s overrides plus `overrides`, registered for this process. Values are
    checked against their settings' types, so "25" and 25 are one arm. A name already taken by
    an arm with other overrides, here or in `ledger`'s lines, is refused (UsageError) before
    anything is registered."""
    if not isinstance(name, str) or not ARM_NAME.fullmatch(name):
        raise UsageError(f"arm name {name!r} must be letters, digits and _.+- (it names files)")
    parent = get_arm(base)
    merged = normalized_overrides({**parent.overrides, **canonical_overrides(overrides)})
    if name in ARMS:
        if normalized_overrides(ARMS[name].overrides) != merged:
            raise UsageError(f"arm {name!r} is already defined with other overrides "
                             f"({_show_overrides(ARMS[name].overrides)}); choose another name")
        return ARMS[name]
    if ledger is not None:
        _check_recorded(name, merged, ledger)
    arm = Arm(name=name, description=description or f"{base} + {_show_overrides(canonical_overrides(overrides))}",
              overrides=merged, group="user", seeds=parent.seeds, model_families=parent.model_families)
    ARMS[name] = arm
    return arm


def normalized_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Dotted-key overrides with each value checked and converted to its setting's type (under
    the model family they set, or the default one)."""
    family = overrides.get("family", "autoresearch")
    leaves = {leaf.key: leaf for leaf in family_leaves(family)}
    out = {}
    for key, value in overrides.items():
        out[key] = value if key not in leaves else coerce(value, leaves[key].type, key, leaves[key].allow_inf)
    return out


def check_against_ledger(arm_names, ledger) -> None:
    """Refuse (UsageError) an arm whose name the ledger's lines already record with other overrides:
    one name, one arm, across every process that writes the ledger."""
    for name in arm_names:
        _check_recorded(name, normalized_overrides(get_arm(name).overrides), ledger)


def _check_recorded(name: str, overrides: dict[str, Any], ledger) -> None:
    if not Path(ledger).is_file():
        return
    recorded = recorded_arm_overrides(read_records_tolerant(ledger)[0])
    if name in recorded and normalized_overrides(recorded[name]) != overrides:
        raise UsageError(f"arm {name!r} is recorded in {ledger} with other overrides "
                         f"({_show_overrides(recorded[name])}); choose another name")


def _show_overrides(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in overrides.items()) or "none"


def check_arm(arm: Arm) -> None:
    """Resolve the arm's overrides under each model family it runs in (that family's first preset;
    the defaults when it names none): UsageError if one does not act or cannot hold."""
    for family in arm.model_families or (None,):  # under the family's first preset: its data are the family's
        preset = {"family": family, **next(iter(get_family(family).presets.values()), {})} if family else None
        build_config(([("preset", preset)] if preset else []) + [("arm", arm.overrides)])


def get_arm(name: str) -> Arm:
    if name not in ARMS:
        raise UsageError(f"unknown arm {name!r}; known arms: {', '.join(sorted(ARMS))}")
    return ARMS[name]


def resolve_config(arm_name: str, preset_name: str, extra: dict[str, Any] | None = None,
                   implied: dict[str, Any] | None = None) -> RunConfig:
    """preset -> arm overrides -> extra overrides (e.g. CLI flags), with cfg.arm set. `implied`
    holds settings that follow from the extra ones (e.g. num_steps none when a time budget is given)."""
    arm = get_arm(arm_name)
    presets = all_presets()
    if preset_name not in presets:
        raise UsageError(f"unknown preset {preset_name!r}; choose from {', '.join(presets)}")
    cfg = build_config([("preset", presets[preset_name]), ("arm", arm.overrides), ("implied", implied or {}),
                        ("command line", extra or {})])
    cfg.arm = arm.name
    return cfg


register(Arm(
    name="baseline",
    description="upstream autoresearch: MuonAdamW (Muon on block matrices, AdamW elsewhere)",
    paper="autoresearch 228791f", experiment="train.py",
))
register(Arm(
    name="adamw_only",
    description="control: every block matrix on AdamW (lr adamw_matrix_lr=3e-3, no weight decay) instead of Muon",
    overrides={"matrix_optimizer": "adamw"},
    group="control",
))


def default_seeds(arm_names: list[str]) -> list[int]:
    """The seeds the arms' papers used; the arms must agree."""
    seeds = {get_arm(name).seeds for name in arm_names}
    if len(seeds) != 1 or not next(iter(seeds)):
        raise UsageError("these arms list no common default seeds; pass --seeds")
    return list(next(iter(seeds)))


# ----------------------------------------------------------------------------- paper packs
@dataclass(frozen=True)
class PaperPack:
    """One seed paper's pack (`muonlab/papers/<name>/`): its arms register through `register` when the
    pack is imported; `tables` are its printed tables (read by muonlab.lab.paper); `diagnostics` are the
    modules of its `muonlab diagnose` tools (each with a COMMAND, imported only when that verb runs)."""

    name: str  # the pack's folder, e.g. "seed123"
    paper: str  # how arms and tables name the paper, e.g. "seed 123"
    tables: Traversable | None  # its printed tables (JSON), or None
    diagnostics: tuple[str, ...] = ()  # module names, in the order `diagnose --help` lists them


PACKS: dict[str, PaperPack] = {}


def register_pack(pack: PaperPack) -> PaperPack:
    if pack.name in PACKS and PACKS[pack.name] != pack:
        raise ValueError(f"paper pack {pack.name!r} is already registered")
    PACKS[pack.name] = pack
    return pack


def all_packs() -> dict[str, PaperPack]:
    """Every registered pack: the built-in ones (imported with this module) and any a plug-in registered."""
    return PACKS


# The seed papers' packs, imported by name (they import this registry: they sit above it, as plug-ins do)
BUILTIN_PAPER_PACKS = ("seed000", "seed003", "seed002", "seed004")  # the order their arms register in
for _pack in BUILTIN_PAPER_PACKS:
    importlib.import_module(f"muonlab.papers.{_pack}")
