"""What each plug-in registered, and the refusal of one that would not act.

A plug-in registers methods (a pre-polar conditioner, a model variant, an arm) at its first import;
a run or a set of runs that loads it and selects none of them would carry a setting that does
nothing, so it is refused before anything runs."""

from __future__ import annotations

from typing import Iterable

from muonlab.errors import UsageError
from muonlab.plugins import load_plugins
from muonlab.settings import get_dotted

_METHODS: dict[str, set[tuple[str, str]]] = {}  # plug-in -> (kind, name) of the methods it registered


SELECTABLE = ("prepolar", "variant", "arm")  # the kinds of registered_methods(): what a run selects by name


def registered_methods() -> set[tuple[str, str]]:
    """The methods a run can select by name: pre-polar conditioners, model variants, arms."""
    from muonlab.arms import ARMS
    from muonlab.model import REGISTRY
    from muonlab.optim.extensions import prepolars

    return ({("prepolar", n) for n in prepolars()} | {("variant", n) for n in REGISTRY}
            | {("arm", n) for n in ARMS})


def everything_registered() -> set[tuple[str, str]]:
    """All a plug-in can register: the selectable methods, the families, the presets."""
    from muonlab.config import all_presets
    from muonlab.families import all_families

    return registered_methods() | {("family", n) for n in all_families()} | {("preset", n) for n in all_presets()}


def load_tracked(spec: str) -> None:
    """load_plugins(spec), noting what each plug-in registers at its first import (one imported
    before, untracked, registers nothing as far as the check knows: it is never refused). A plug-in
    whose first import registers nothing at all (a wrong file, a standard module) is refused, unless it
    declares why (`REGISTERS_NOTHING = "..."`: a plug-in that patches muonlab, a test's fixed peak)."""
    from muonlab import plugins

    for item in _items(spec):
        if item not in _METHODS:
            imported_before = item in plugins._LOADED
            before = everything_registered()
            load_plugins(item)
            added = everything_registered() - before
            _METHODS[item] = {(kind, name) for kind, name in added if kind in SELECTABLE}
            says_why = getattr(plugins._LOADED.get(item), "REGISTERS_NOTHING", None)  # a patch, not a method
            if not imported_before and not says_why and not added:
                raise UsageError(f"--plugin {item} registers nothing (no method, arm, add-on, family or preset): "
                                 "a plug-in registers through muonlab's registries at import (docs/extending.md); "
                                 "one that only patches muonlab says so with REGISTERS_NOTHING = \"why\"")


def _selected_by(cfg, kind: str, name: str) -> bool:
    if kind == "arm":
        return cfg.arm == name
    key = "optim.prepolar.kind" if kind == "prepolar" else "model.extra_variants"
    try:
        value = get_dotted(cfg, key)
    except AttributeError:  # a family without that section
        return False
    return value == name if kind == "prepolar" else name in [v.strip() for v in str(value or "").split(",")]


def check_plugins_act(cfgs: Iterable, runs: str, given_as: str = "--plugin",
                      select_with: str = "--prepolar, --variant or --arm") -> None:
    """Refuse a plug-in the runs load (their record.plugins) that registered methods none of `cfgs`
    selects. `runs` says who selects none ("this run selects none"), `given_as` where the plug-in
    was named."""
    cfgs = list(cfgs)
    for item in _items(cfgs[0].record.plugins if cfgs else ""):
        methods = _METHODS.get(item)
        if methods and not any(_selected_by(cfg, kind, name) for cfg in cfgs for kind, name in methods):
            names = ", ".join(f"{kind} {name}" for kind, name in sorted(methods))
            raise UsageError(f"{given_as} {item} registers {names}, and {runs} of them ({select_with}): "
                             "it would not act")


def _items(spec: str) -> list[str]:
    return [item for item in (x.strip() for x in (spec or "").split(",")) if item]
