"""The shared harness of the paper packs' read-only diagnostics (`muonlab diagnose TOOL`).

Each diagnostic lives in its paper's pack (muonlab/papers/<seed>/diagnostics/) and declares its own
sub-command next to its code, as the module's `COMMAND`: its name, its help, its options, how it runs
from the parsed arguments, how its result is printed and when that result is a failed check (exit 1).
A pack lists its tools (PaperPack.diagnostics); `muonlab diagnose --help` shows them pack by pack, and
the command line imports them only when `diagnose` is the verb (they import torch). Here: the Command
type, the options several tools share, loading a run (runs.py) and selecting runs (run_selection.py).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from muonlab.settings import seed_value

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
    """Every registered pack's diagnostics by command name, pack by pack (imports the modules)."""
    from muonlab.arms import all_packs  # noqa: PLC0415

    found: dict[str, Command] = {}
    for pack in sorted(all_packs().values(), key=lambda p: p.name):
        for module in pack.diagnostics:
            command = importlib.import_module(module).COMMAND
            if command.name in found:
                raise ValueError(f"diagnose {command.name}: declared by {module} and by another pack's tool")
            found[command.name] = command
    return found
