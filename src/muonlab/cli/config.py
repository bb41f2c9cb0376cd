"""`muonlab config`: the resolved config of a preset, arm and flags (or a saved config, or an experiment
file's arm), each value with the layer it came from, its hash and protocol id."""

from __future__ import annotations

from muonlab.cli.parser import _emit
from muonlab.cli.resolve import _resolve_config

HELP = ("print the resolved config of a preset, arm and flags: each value with the layer it came from, its hash "
        "and protocol id (TOML, or --json)")


def add_arguments(p, context) -> None:
    p.add_argument("--arm", default="baseline", help="registered arm (see `muonlab arms`)")
    p.add_argument("--arm-name", default=None, metavar="NAME",
                   help="as `train --arm-name`: NAME is --arm plus the model and optimizer settings given")
    p.add_argument("--config", default=None,
                   help="a saved config (a run's config.json, or the TOML this verb prints) instead of --preset/--arm")
    p.add_argument("--experiment", default=None, metavar="FILE",
                   help="a TOML experiment file: --arm is one of its arms, under its preset and settings")
    context.with_config(p)


def run(args) -> int:
    from muonlab.config.show import describe, to_toml

    cfg = _resolve_config(args)
    _emit(args, describe(cfg), to_toml(cfg).rstrip())
    return 0
