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
                entry = entries.setdefault(info.name, {
                    "name": info.name, "paper": info.paper, "config_key": key, "family": family,
                    "flag": f"--{flag_of(switch)}" if info.selector else None, "module": info.module,
                    "tests": list(info.tests), "arms": []})
                entry["arms"] = sorted(name for name, arm in ARMS.items()
                                       if _switched_on(arm.overrides, switch, info.selector, info.off))
    _add_conditioners(entries)
    _add_plugin_variants(entries)
    return sorted(entries.values(), key=lambda e: (e["family"], e["config_key"], e["name"]))


def _settings(cls, prefix: str) -> list[dict[str, Any]]:
    """A method dataclass's settings as the catalogue lists them, under dotted prefix `prefix`."""
    return [{"key": f"{prefix}.{f.name}", "flag": f"--{flag_of(f'{prefix}.{f.name}')}", "default": f.default,
             "help": field_help(cls, f)} for f in option_fields(cls)]


def _add_conditioners(entries: dict[str, dict[str, Any]]) -> None:
    """One entry per registered pre-polar conditioner (plug-ins included), from the optimizer's
    registry: the `prepolar` section selects among them by name."""
    from muonlab.optim.extensions import addons, prepolars  # noqa: PLC0415

    for info in addons("prepolar"):
        settings = _settings(prepolars()[info.name], "optim.prepolar")
        entries[f"prepolar:{info.name}"] = {
            "name": info.name, "paper": info.paper, "config_key": f"optim.prepolar.kind={info.name}",
            "family": "autoresearch", "flag": f"--prepolar {info.name}", "module": info.module,
            "tests": list(info.tests), "settings": settings,
            "arms": sorted(n for n, a in ARMS.items() if a.overrides.get("optim.prepolar.kind") == info.name)}


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
        settings = _settings(info.config, f"model.plugin_variants.{name}")
        entries[f"variant:{name}"] = {
            "name": name, "paper": f"{info.paper} {info.section}".strip(), "config_key": f"model.extra_variants={name}",
            "family": "autoresearch", "flag": f"--variant {name}", "module": info.module, "tests": list(info.tests),
            "settings": settings,
            "arms": sorted(n for n, a in ARMS.items() if name in str(a.overrides.get("model.extra_variants", "")))}
