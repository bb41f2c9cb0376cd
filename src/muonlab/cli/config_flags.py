"""Command-line flags generated from the run config's sections (muonlab.settings).

One flag per setting: its dotted key (`--optim.prepolar.tau`), the setting's one name, and the flat
name the command line has always used (`--prepolar-tau`) as its alias, both listed in `--help`, grouped by
component, with the setting's description, its choices, and the effective default: the value after
`--preset`, `--arm` (or `--config`), found by a first pass over the command line. Booleans take `--x`,
`--no-x` (flat names) or `--x true|false`. The dotted flags are those of the family that first pass
resolves to; a flat flag of another model family is accepted by the parser and refused by the config
resolution with a one-line reason.
"""

from __future__ import annotations

import argparse
from typing import Any

from muonlab.settings import base_type, field_choices, get_dotted, leaves

DEST = "cfg:"  # argparse dest prefix of a config flag; the rest is the flag


class _Bool(argparse.Action):
    """--x, --no-x, or --x true|false (a dotted key takes true|false, no --no- form)."""

    def __init__(self, option_strings, dest, **kwargs):
        negatives = ["--no-" + flag[2:] for flag in option_strings if "." not in flag]
        super().__init__([*option_strings, *negatives], dest, nargs="?", metavar="true|false", **kwargs)

    def __call__(self, parser, namespace, value, option_string=None):
        if option_string.startswith("--no-"):
            if value is not None:
                parser.error(f"{option_string} takes no value")
            setattr(namespace, self.dest, False)
            return
        setattr(namespace, self.dest, True if value is None else value)


def _group_title(key: str, family: str) -> str:
    parts = key.split(".")
    section = parts[0] if len(parts) == 2 else ".".join(parts[:-1])
    if parts[0] in ("model", "optim"):
        return f"{section} ({family} family)"
    return section if len(parts) > 1 else "run"


def add_config_flags(parser: argparse.ArgumentParser, base, families: dict, skip: tuple[str, ...] = ()) -> None:
    """Add one flag per setting of every family; help shows `base`'s family with its values."""
    from muonlab.config import family_leaves  # noqa: PLC0415

    groups: dict[str, Any] = {}
    seen: set[str] = set()
    dotted: set[str] = set()  # a key shared by families is the shown family's setting
    ordered = [base.family] + [f for f in families if f != base.family]
    for family in ordered:
        shown = family == base.family  # another family's flags parse, hidden: resolution refuses them
        for leaf in (leaves(base) if shown else family_leaves(family)):  # other families: from their classes
            if leaf.flag in seen or leaf.key in skip:
                continue
            seen.add(leaf.flag)
            kwargs: dict[str, Any] = dict(dest=DEST + leaf.flag, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            target = parser
            if shown:
                title = _group_title(leaf.key, family)
                target = groups[title] = groups.get(title) or parser.add_argument_group(title)
                choices = field_choices(leaf.type)
                extra = "" if not choices else " {" + "|".join("none" if c is None else str(c) for c in choices) + "}"
                kwargs["help"] = f"{leaf.help}{extra} (default: {_show(get_dotted(base, leaf.key))}; {leaf.key})"
            names = [f"--{leaf.flag}"]
            if shown and "." in leaf.key and leaf.key not in dotted:  # the setting's name first, its flat alias
                dotted.add(leaf.key)
                names.insert(0, f"--{leaf.key}")
            scalar, _ = base_type(leaf.type)
            if scalar is bool:
                target.add_argument(*names, action=_Bool, **kwargs)
            else:
                target.add_argument(*names, metavar=scalar.__name__.upper(), **kwargs)


def _show(value) -> str:
    return "none" if value is None else str(value)


def collect_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """{flag name (underscores): raw value} of the config flags given on the command line. Flag
    names, not dotted keys: two families may share a key under different flags (--matrix-lr is
    MuonAdamW's, --af-matrix-lr AF-Muon's), and resolution refuses a flag of another family."""
    return {k[len(DEST):].replace("-", "_"): v for k, v in vars(args).items() if k.startswith(DEST)}
