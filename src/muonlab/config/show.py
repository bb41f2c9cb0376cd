"""`muonlab config`: a resolved config as a person reads it, each value with the layer it came from.

The origin of a setting is the last resolution layer that set it ("preset", "arm", "implied",
"command line", "saved"), else "default"; a setting that does not act in this config says why.
TOML has no null: a setting at none is written as the string "none", which the config reads back
as none.
"""

from __future__ import annotations

import json
import math
from typing import Any

from muonlab.settings import get_dotted, inactive_keys, leaves


def origins(cfg) -> dict[str, str]:
    """{dotted key: the layer that set it, or "default"} for every setting of cfg."""
    resolution = cfg.resolution()
    out = {leaf.key: "default" for leaf in leaves(cfg)}
    out["arm"] = "arm"  # the arm's name is set with its overrides
    for origin, values in (resolution.layers or []) if resolution is not None else []:
        for key in values:
            if key in out:
                out[key] = origin
    return out


def inactive(cfg) -> dict[str, str]:
    """{dotted key: why it does not act} for every setting of cfg that does not act now."""
    whole = inactive_keys(cfg)
    return {leaf.key: why for leaf in leaves(cfg) for prefix, why in whole.items()
            if leaf.key == prefix or leaf.key.startswith(prefix + ".")}


def describe(cfg) -> dict[str, Any]:
    """The JSON form: the saved config, its hash, protocol id, each setting's origin and the
    settings that do not act."""
    return {"config": cfg.to_dict(), "config_hash": cfg.config_hash(), "protocol": cfg.protocol_id(),
            "origins": origins(cfg), "inactive": inactive(cfg)}


def to_toml(cfg) -> str:
    """The config as TOML, grouped by section, each value commented with its origin."""
    where, idle = origins(cfg), inactive(cfg)
    lines = [f"# arm {cfg.arm}, model family {cfg.family}: {cfg.describe_model()}",
             f"# config_hash {cfg.config_hash()}, protocol {cfg.protocol_id() or 'unknown'}"]
    by_section: dict[str, list] = {}  # a TOML table is written once, with all its keys
    for leaf in leaves(cfg):
        by_section.setdefault(leaf.key.rpartition(".")[0], []).append(leaf)
    for head, members in by_section.items():
        lines += ["", f"[{head}]"] if head else [""]
        for leaf in members:
            note = where[leaf.key] + (f"; does not act: {idle[leaf.key]}" if leaf.key in idle else "")
            lines.append(f"{leaf.key.rpartition('.')[2]} = {_toml_value(get_dotted(cfg, leaf.key))}  # {note}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's
