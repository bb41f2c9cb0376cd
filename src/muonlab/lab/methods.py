"""The method catalogue: every registered method with its paper section, config key, module,
the arms that switch it on and its tests. Generated from the config sections (each method
section carries a `METHOD`, muonlab.settings.MethodInfo) and the arms registry, so it cannot
drift from what the code runs."""

from __future__ import annotations

from typing import Any

from muonlab.arms import ARMS
from muonlab.config import RunConfig, flag_of
from muonlab.families import all_families
from muonlab.settings import field_help, option_fields, sections


def _switched_on(overrides: dict[str, Any], key: str, selector: str | None, off: Any) -> bool:
    if selector is None:  # a section without a switch: any setting of it
        return any(k.startswith(key + ".") for k in overrides)
    return key in overrides and overrides[key] != off


def method_catalog() -> list[dict[str, Any]]:
    """One entry per method, from its one record (settings.MethodInfo): the sections' METHOD and
    FIELD_METHODS, the registered conditioners' and the plug-in variants' records."""
    entries: dict[str, dict[str, Any]] = {}
    for family in all_families():
        for prefix, section in sections(RunConfig.for_family(family)):
            found = []
            info = getattr(type(section), "METHOD", None)
            if info is not None and info.name != "prepolar":  # conditioners: from their registry
                switch = f"{prefix}{info.selector}" if info.selector else prefix.rstrip(".")
                found.append((info, switch, prefix.rstrip(".")))
            for field, finfo in getattr(type(section), "FIELD_METHODS", {}).items():
                found.append((finfo, f"{prefix}{field}", f"{prefix}{field}"))
            for info, switch, key in found:
                entries.setdefault(info.name, _entry(
                    info, key, family, f"--{flag_of(switch)}" if info.selector else None,
                    lambda overrides, switch=switch, info=info: _switched_on(overrides, switch, info.selector, info.off)))
    _add_conditioners(entries)
    _add_plugin_variants(entries)
    return sorted(entries.values(), key=lambda e: (e["family"], e["config_key"], e["name"]))


def _entry(info, config_key: str, family: str, flag: str | None, selects, settings=None) -> dict[str, Any]:
    """A catalogue entry for record `info`; `selects(overrides)` says whether an arm switches it on."""
    entry = {"name": info.name, "paper": info.paper, "config_key": config_key, "family": family, "flag": flag,
             "module": info.module, "tests": list(info.tests)}
    if settings is not None:
        entry["settings"] = settings
    entry["arms"] = sorted(name for name, arm in ARMS.items() if selects(arm.overrides))
    return entry


def _settings(cls, prefix: str) -> list[dict[str, Any]]:
    """A method dataclass's settings as the catalogue lists them, under dotted prefix `prefix`."""
    return [{"key": f"{prefix}.{f.name}", "flag": f"--{flag_of(f'{prefix}.{f.name}')}", "default": f.default,
             "help": field_help(cls, f)} for f in option_fields(cls)]


def _add_conditioners(entries: dict[str, dict[str, Any]]) -> None:
    """One entry per registered pre-polar conditioner (plug-ins included), from the optimizer's
    registry: the `prepolar` section selects among them by name."""
    from muonlab.optim.extensions import prepolars, records  # noqa: PLC0415

    for info in records():
        entries[f"prepolar:{info.name}"] = _entry(
            info, f"optim.prepolar.kind={info.name}", "autoresearch", f"--prepolar {info.name}",
            lambda overrides, name=info.name: overrides.get("optim.prepolar.kind") == name,
            _settings(prepolars()[info.name], "optim.prepolar"))


def format_methods(catalog: list[dict[str, Any]]) -> str:
    lines = []
    for e in catalog:
        arms = ", ".join(e["arms"][:6]) + (f" (+{len(e['arms']) - 6})" if len(e["arms"]) > 6 else "")
        lines.append(f"{e['name']:<22} {e['paper']}")
        lines.append(f"{'':<22} config {e['config_key']}{' (' + e['flag'] + ')' if e['flag'] else ''}, "
                     f"family {e['family']}, module {e['module']}")
        if e.get("settings"):
            lines.append(f"{'':<22} settings: " + ", ".join(f"{x['flag']} (default {x['default']})" for x in e["settings"]))
        lines.append(f"{'':<22} arms: {arms or '-'}; tests: {', '.join(e['tests'])}")
    return "\n".join(lines)


def _add_plugin_variants(entries: dict[str, dict[str, Any]]) -> None:
    """Model variants registered by plug-ins (the built-in ones have their own sections above)."""
    from muonlab.model import REGISTRY  # noqa: PLC0415
    from muonlab.model.extensions import is_builtin  # noqa: PLC0415

    for name, info in REGISTRY.items():
        if is_builtin(info):
            continue
        entries[f"variant:{name}"] = _entry(
            info.record, f"model.extra_variants={name}", "autoresearch", f"--variant {name}",
            lambda overrides, name=name: name in str(overrides.get("model.extra_variants", "")),
            _settings(info.config, f"model.plugin_variants.{name}"))
