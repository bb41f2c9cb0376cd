"""What a verb's add_arguments gets: the command line, and from it, once per parser, the config whose
values the config flags' help shows (a first pass over --preset/--arm/--config/--plugin), with the
flags every verb that resolves a config shares."""

from __future__ import annotations

import argparse
import functools

from muonlab.cli.config_flags import add_config_flags
from muonlab.errors import MuonlabError


class Context:
    """The second argument of every verb's add_arguments (one per parser built)."""

    def __init__(self, argv: list[str] | None):
        self.argv = argv

    @functools.cached_property
    def config(self):
        """(the config the flags' defaults show, the preset names, the families)."""
        from muonlab.config import all_presets
        from muonlab.families import all_families

        return _first_pass(self.argv), sorted(all_presets()), all_families()

    def with_config(self, p, data_only: bool = False) -> None:
        """--preset, one flag per setting (with `data_only`, the data settings') and --json."""
        base, presets, families = self.config  # first: the first pass loads the plug-ins
        from muonlab.lab.request import DEFAULT_PRESET

        p.add_argument("--preset", default=DEFAULT_PRESET, choices=presets,
                       help="protocol preset the flags override (default: gpu-d8; a GPU preset on a machine "
                            "without one needs --device cpu)")
        from muonlab.config import family_leaves

        skip = ("arm",) + tuple(l.key for f in families for l in family_leaves(f)
                                if data_only and not l.key.startswith("data."))
        add_config_flags(p, base, families, skip=skip)
        p.add_argument("--json", action="store_true", help="print the result as JSON")


def _first_pass(argv: list[str] | None):
    """--preset/--arm/--config/--plugin before the full parse: plug-ins are imported, and the
    flags' defaults are those of the config they resolve to (the family's settings shown)."""
    from muonlab.lab.plugin_methods import load_tracked

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)  # --pre is not --preset
    for flag in ("--preset", "--arm", "--config", "--plugin"):
        pre.add_argument(flag, default=None)
    try:
        known, _ = pre.parse_known_args(argv)
    except argparse.ArgumentError:  # e.g. `--plugin --`: the real parse says so, in one line
        known = argparse.Namespace(preset=None, arm=None, config=None, plugin=None)
    load_tracked(known.plugin or "")  # what each plug-in registers, seen at its first import
    from muonlab.lab.request import DEFAULT_PRESET

    try:
        from muonlab.arms import resolve_config
        from muonlab.config import load_config_file

        if known.config:
            return load_config_file(known.config)
        return resolve_config(known.arm or "baseline", known.preset or DEFAULT_PRESET)
    except MuonlabError:  # the real parse reports it; defaults are the plain preset's meanwhile
        from muonlab.config import preset

        return preset(DEFAULT_PRESET)
