"""Experiment files: a study a researcher writes and commits, read from TOML.

    preset = "cpu-tiny"                 # the protocol preset (required)
    seeds = [1, 2]                      # optional: the arms' papers' seeds when left out
    plugins = ["power.py"]              # optional: modules or .py paths, relative to this file
    baseline = "baseline"               # optional: "baseline" when it is an arm, else the first arm
    [settings]                          # optional: every run's own settings (part of the protocol)
    "train.num_steps" = 20
    [arms.baseline]                     # a registered arm as it is
    [arms.hbieq25]                      # a new arm: `base` (default baseline) plus dotted keys
    base = "baseline"
    "optim.prepolar.kind" = "hbieq"
    "optim.prepolar.tau" = 25

Keys may be dotted keys or flag names, quoted or as TOML tables (`optim.prepolar.kind = ...`).
An arm the file defines is an arm like a registered one (muonlab.arms.define_arm): runs record it
by name with its overrides (their config's "arm" layer), in the same protocol as the baseline, so
`muonlab report` contrasts it; a name already taken with other overrides is refused.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muonlab.arms import check_against_ledger, default_seeds, define_arm, get_arm, resolve_config
from muonlab.config import canonical_overrides
from muonlab.errors import UsageError
from muonlab.lab.plugin_methods import check_plugins_act, load_tracked
from muonlab.settings import flatten

TOP_KEYS = ("preset", "seeds", "plugins", "baseline", "settings", "arms")
ARM_KEYS = ("base", "description")  # an arm table's own keys; the rest are its overrides


@dataclass(frozen=True)
class Experiment:
    path: Path
    preset: str
    seeds: tuple[int, ...]
    arms: tuple[str, ...]  # in file order
    baseline: str
    settings: dict[str, Any] = field(default_factory=dict)  # dotted keys, every run's

    def check_ledger(self, ledger) -> None:
        """Refuse a file arm whose name the ledger records with other overrides."""
        check_against_ledger(self.arms, ledger)


def load_experiment(path: str | Path) -> Experiment:
    """Read an experiment file, import its plug-ins and define its arms (UsageError naming the file
    and the first problem)."""
    path = Path(path)
    try:
        values = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"experiment file not found: {path}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: not a TOML experiment file ({exc})") from None
    try:
        return _read(path, values)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _read(path: Path, values: dict[str, Any]) -> Experiment:
    unknown = sorted(set(values) - set(TOP_KEYS))
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} (an experiment file has {', '.join(TOP_KEYS)})")
    preset = values.get("preset")
    if not isinstance(preset, str):
        raise UsageError("`preset` must name a preset (muonlab arms --presets)")
    plugins = _plugins(path, values.get("plugins", []))
    load_tracked(",".join(plugins))  # before the arms: they may name a plug-in's methods
    arms_table = values.get("arms")
    if not isinstance(arms_table, dict) or not arms_table:
        raise UsageError("`[arms.NAME]` tables are missing: an experiment names at least one arm")
    arms = tuple(_arm(name, table) for name, table in arms_table.items())
    seeds = values.get("seeds")
    if seeds is None:
        seeds = default_seeds(list(arms))
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise UsageError(f"`seeds` must be a non-empty list of distinct integers, got {seeds!r}")
    baseline = values.get("baseline", "baseline" if "baseline" in arms else arms[0])
    if baseline not in arms:
        raise UsageError(f"baseline {baseline!r} is not one of the file's arms ({', '.join(arms)})")
    settings = values.get("settings", {})
    if not isinstance(settings, dict):
        raise UsageError("`[settings]` must be a table of settings")
    settings = canonical_overrides(settings)  # nested tables are flattened there
    for arm in arms:  # a setting an arm table names wrongly is refused here, naming the arm (and the file, above)
        try:
            resolve_config(arm, preset, settings)
        except UsageError as exc:
            raise UsageError(f"arms.{arm}: {exc}") from None
    if plugins:  # saved with every run, so sweep children and --resume import them again
        settings["record.plugins"] = ",".join(plugins)
        check_plugins_act((resolve_config(arm, preset, settings) for arm in arms), "no arm of the file selects any",
                          given_as="the plug-in",
                          select_with="an arm's prepolar.kind or model.extra_variants, or its name")
    return Experiment(path, preset, tuple(seeds), arms, baseline, settings)


def _plugins(path: Path, given: Any) -> list[str]:
    if not isinstance(given, list) or not all(isinstance(p, str) for p in given):
        raise UsageError("`plugins` must be a list of module names or .py paths")
    # a .py path is relative to the file; a module name is imported as it is
    return [str((path.parent / p).resolve()) if p.endswith(".py") else p for p in given]


def _arm(name: str, table: Any) -> str:
    if not isinstance(table, dict):
        raise UsageError(f"arms.{name} must be a table")
    overrides = flatten({k: v for k, v in table.items() if k not in ARM_KEYS})
    base = table.get("base")
    if not overrides and base is None:  # a registered arm as it is
        return get_arm(name).name
    description = table.get("description", "")
    if not isinstance(description, str) or (base is not None and not isinstance(base, str)):
        raise UsageError(f"arms.{name}: `base` and `description` are strings")
    try:
        return define_arm(name, overrides, base=base or "baseline", description=description).name
    except UsageError as exc:
        raise UsageError(f"arms.{name}: {exc}") from None
