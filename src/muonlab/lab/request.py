"""What a command asks to run, resolved without argparse: a `RunRequest` (a preset and arm, a saved
config, an experiment file's arm or a new arm, with settings on top) to one RunConfig, and a
`SweepRequest` (arms and seeds, or an experiment file) to a sweep's plan. The command line builds
these from its flags; a script may build them itself. The rules and their messages are the
command line's: the flag names in them are what a user gave.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from muonlab.arms import (METHOD_SECTIONS, check_against_ledger, default_seeds, define_arm, get_arm,
                          resolve_config)
from muonlab.config import RunConfig, apply_overrides, canonical_overrides, load_config_file
from muonlab.errors import UsageError
from muonlab.lab.experiment import load_experiment
from muonlab.lab.plugin_methods import check_plugins_act
from muonlab.lab.sweep import parse_seeds
from muonlab.record.rundir import ledger_path
from muonlab.settings import comma_items

DEFAULT_PRESET = "gpu-d8"  # the paper's protocol; the CPU presets are named explicitly


@dataclass(frozen=True)
class RunRequest:
    """One run's config as asked for. `overrides`: the settings given, by flag name with underscores
    (`num_steps`, as the command line gives them) or dotted key; `preset` None or DEFAULT_PRESET
    counts as not given where an experiment file names its own."""

    preset: str | None = None
    arm: str = "baseline"
    arm_name: str | None = None  # record the run as a new arm: `arm` plus the model and optimizer settings given
    config_file: str | None = None  # a saved config (config.json or TOML) instead of preset and arm
    experiment: str | None = None  # a TOML experiment file: `arm` is one of its arms
    overrides: dict[str, Any] = field(default_factory=dict)


def implied_durations(overrides: dict[str, Any]) -> dict[str, Any]:
    """Giving one duration (the flags time_budget, num_steps) switches the other off, unless both are given."""
    implied = {}
    if overrides.get("time_budget") not in (None, "none") and "num_steps" not in overrides:
        implied["train.num_steps"] = None
    if overrides.get("num_steps") not in (None, "none") and "time_budget" not in overrides:
        implied["train.time_budget"] = None
    return implied


def resolve_request(request: RunRequest) -> RunConfig:
    """The RunConfig a request names: layers preset -> arm -> implied durations -> the settings given
    (a saved config, then implied durations and the settings; an experiment file's preset, arm and
    settings, then the settings given)."""
    overrides = dict(request.overrides)
    implied = implied_durations(overrides)
    if request.config_file:
        if request.arm_name:
            raise UsageError("--arm-name defines an arm on a preset; --config starts from a saved config")
        cfg = apply_overrides(load_config_file(request.config_file, whole=True), implied, origin="implied")
        return apply_overrides(cfg, overrides, origin="command line")
    arm = request.arm
    if request.experiment:  # an experiment file's arm: its preset, settings, then the flags
        if request.arm_name:
            raise UsageError("--arm-name defines an arm on a preset; --experiment names its own arms (--arm)")
        study = load_experiment(request.experiment)
        if arm not in study.arms:
            raise UsageError(f"--arm {arm} is not an arm of {request.experiment} ({', '.join(study.arms)})")
        if request.preset not in (None, DEFAULT_PRESET, study.preset):  # the default: not given
            raise UsageError(f"{request.experiment} runs preset {study.preset}: drop --preset {request.preset}")
        return resolve_config(arm, study.preset, {**study.settings, **overrides}, implied)
    if request.arm_name:  # the model and optimizer settings given are the new arm's
        given = canonical_overrides(overrides)
        own = {k: v for k, v in given.items() if k.startswith(METHOD_SECTIONS)}
        if not own:
            raise UsageError("--arm-name names the model and optimizer settings given with it (--prepolar, "
                             "--qk-scale, ...); none was given")
        overrides = {k: v for k, v in given.items() if k not in own}
        preset = request.preset or DEFAULT_PRESET
        ledger = ledger_path(resolve_config(arm, preset, overrides, implied))  # where the name is recorded
        arm = define_arm(request.arm_name, own, base=arm, ledger=ledger).name
        return resolve_config(arm, preset, overrides, implied)
    return resolve_config(arm, request.preset or DEFAULT_PRESET, overrides, implied)


@dataclass(frozen=True)
class SweepRequest:
    """A sweep as asked for: comma-separated `arms` and `seeds` (the arms' papers' seeds when None) under
    `preset`, or an `experiment` file naming all three; `overrides` as RunRequest's."""

    arms: str | None = None
    seeds: str | None = None
    preset: str | None = None
    experiment: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


def plan_request(request: SweepRequest) -> tuple[list[str], list[int], str, dict]:
    """(arms, seeds, preset, overrides) of a sweep: from its arms, seeds and preset, or an experiment
    file (its settings under the request's); an experiment's arm recorded in the ledger with other
    overrides is refused."""
    given = canonical_overrides(request.overrides)
    if "seed" in given:  # each job's seed is one of --seeds (or the experiment's): a single --seed would be dropped
        raise UsageError("muonlab sweep takes --seeds (a list), not --seed")
    if request.experiment:
        if request.arms or request.seeds:
            raise UsageError("--experiment names the arms and seeds: drop --arms and --seeds")
        study = load_experiment(request.experiment)
        if request.preset not in (None, study.preset):
            raise UsageError(f"{request.experiment} runs preset {study.preset}: drop --preset {request.preset}")
        arms, seeds, preset, overrides = list(study.arms), list(study.seeds), study.preset, {**study.settings, **given}
        overrides.setdefault("record.quiet", True)
        check_against_ledger(arms, ledger_path(resolve_config(arms[0], preset, overrides)))
        return arms, seeds, preset, overrides
    if not request.arms:
        raise UsageError("muonlab sweep needs --arms or --experiment (or --status, to see where a sweep stands)")
    arms = comma_items(request.arms, "--arms", empty_ok=False)
    for arm in arms:
        get_arm(arm)
    seeds = parse_seeds(request.seeds) if request.seeds is not None else default_seeds(arms)
    given.setdefault("record.quiet", True)
    check_plugins_act((resolve_config(arm, request.preset or DEFAULT_PRESET, given) for arm in arms),
                      "no arm of this sweep selects any")
    return arms, seeds, request.preset or DEFAULT_PRESET, given
