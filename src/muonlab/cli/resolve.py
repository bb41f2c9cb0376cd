"""The run config a verb's arguments name: a RunRequest made from them, resolved by
muonlab.lab.request, which holds the rules (preset -> arm -> implied durations -> command line)."""

from __future__ import annotations

import argparse

from muonlab.cli.config_flags import collect_overrides


def run_request(args: argparse.Namespace):
    """The RunRequest of a verb's arguments (a verb without --arm asks for the baseline)."""
    from muonlab.lab.request import RunRequest

    return RunRequest(preset=getattr(args, "preset", None), arm=getattr(args, "arm", "baseline"),
                      arm_name=getattr(args, "arm_name", None), config_file=getattr(args, "config", None),
                      experiment=getattr(args, "experiment", None), overrides=collect_overrides(args))


def _resolve_config(args: argparse.Namespace):
    """The RunConfig of a verb's arguments (prepare, train, config)."""
    from muonlab.lab.request import resolve_request

    return resolve_request(run_request(args))
