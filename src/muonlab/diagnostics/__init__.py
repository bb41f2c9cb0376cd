"""Read-only diagnostics over optimizers, models and checkpoints (`muonlab diagnose TOOL`).

Each diagnostic declares its own sub-command next to its code, as the module's `COMMAND`: its
name, its help, its options, how it runs from the parsed arguments, how its result is printed
and when that result is a failed check (exit 1). `TOOLS` lists the modules in the order
`muonlab diagnose --help` shows them; the command line imports them only when `diagnose` is
the verb (they import torch).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from muonlab.settings import seed_value

TOOLS = ("conditioning", "storage", "equivalence", "gauge", "step0_audit", "step0_trajectory", "accounting",
         "trajectory", "geometry", "replay", "audit_tables", "afmuon", "reuse", "overhead", "tied_table")

Option = tuple[str, dict[str, Any]]  # a flag and its argparse keywords

# the options several diagnostics share
RUN_OPTIONS: tuple[Option, ...] = (("--run", dict(required=True, metavar="RUN_DIR", help="the run directory to read")),)
# The step-0 audits read a run's config, or build one from preset, arm, seed and settings.
STEP0_RUN_OPTIONS: tuple[Option, ...] = (
    ("--run", dict(default=None, metavar="RUN_DIR", help="a run directory (its config.json)")),
    ("--preset", dict(default=None, help="the protocol (default cpu-tiny)")),
    ("--arm", dict(default=None, help="the arm (default 12do_oe_decoupled_x0_out)")),
    ("--seed", dict(type=seed_value, default=None, help="the seed (default: the arm's first paper seed)")),
    ("--set", dict(action="append", default=[], metavar="KEY=VALUE",
                   help="a setting on top of preset and arm, by flag name (e.g. oe-m=1009)")),
    ("--device", dict(default=None, help="cpu, cuda, ... (default: the config's)")),
    ("--precision", dict(default=None, choices=("fp32", "bf16"), help="default: the config's")),
)
DEVICE_OPTIONS: tuple[Option, ...] = (
    ("--device", dict(default="cpu", help="where to rebuild the run (cpu, cuda, ...; default cpu)")),
    ("--precision", dict(default="fp32", choices=("fp32", "bf16"), help="fp32 or bf16 autocast (default fp32)")))


def _result_says_failed(result: dict[str, Any]) -> bool:
    return result.get("passed") is False


@dataclass(frozen=True)
class Command:
    """One `muonlab diagnose` sub-command."""

    name: str
    help: str
    options: tuple[Option, ...]
    run: Callable[[argparse.Namespace], dict[str, Any]]
    format: Callable[[dict[str, Any]], str]
    failed: Callable[[dict[str, Any]], bool] = _result_says_failed  # a check of the diagnostic failed: exit 1


def commands() -> dict[str, Command]:
    """Every diagnostic's command by name, in TOOLS order (imports the modules)."""
    found = [importlib.import_module(f"muonlab.diagnostics.{module}").COMMAND for module in TOOLS]
    return {command.name: command for command in found}
