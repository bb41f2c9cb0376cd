"""`muonlab methods`: the registered methods (paper, config key, module, arms, tests), plug-ins' too."""

from __future__ import annotations

from muonlab.cli.parser import _emit

HELP = "list the registered methods (paper, config key, module, arms, tests)"


def add_arguments(p, context) -> None:
    p.add_argument("--plugin", default=None, help="comma-separated plug-in modules or .py files to list too")
    p.add_argument("--json", action="store_true", help="print the registry as JSON")


def run(args) -> int:
    from muonlab.lab.methods import format_methods, method_catalog
    from muonlab.plugins import load_plugins

    load_plugins(args.plugin or "")  # their methods are listed too

    catalog = method_catalog()
    _emit(args, {"methods": catalog}, format_methods(catalog))
    return 0
