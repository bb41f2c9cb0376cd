"""The `muonlab` parser: the top level, which lists every verb by its one-line help and builds the
chosen verb's arguments alone; the parser class every verb's parser is; how a verb reports.

A verb is a module of this package (the verb's name, `-` as `_`) with HELP, its one-line help;
optionally PARSER, more keyword arguments of its parser (description, epilog, formatter_class);
add_arguments(parser, context), its flags; and run(args) -> int, its exit status.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Callable

from muonlab.errors import UsageError

DESCRIPTION = "muonlab: controlled small-scale LLM pretraining research with the Muon optimizer family"
VERBS = ("prepare", "train", "arms", "methods", "config", "eval", "sweep", "report", "paper", "diagnose", "ledger",
         "demo", "doctor", "verify-reference")  # in the order `muonlab --help` lists them


class _Parser(argparse.ArgumentParser):
    """Print one line and exit 2 on bad usage, instead of argparse's usage dump. Flags are never
    abbreviated: with argparse's default a partial flag (or a typo that is a prefix) silently sets
    whichever setting it starts, e.g. a plug-in's --prepolar-p taken as --prepolar-passes."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def parse_known_args(self, args=None, namespace=None):
        for arg in args or () if self._subparsers is None else ():  # argparse reads `--flag=--` as an empty list
            action = self._option_string_actions.get(arg[:-3]) if isinstance(arg, str) and arg.endswith("=--") else None
            if action is not None and action.nargs in (None, "?"):
                self.error(f"argument {arg[:-3]}: expected one value, got '--'")
        namespace, extras = super().parse_known_args(args, namespace)
        unknown = [a.split("=", 1)[0] for a in extras if a.startswith("--")]
        if unknown and self._subparsers is None:  # a verb's own parser knows its flags: name the closest
            self.error(_unknown_flag(unknown[0], [o for o in self._option_string_actions if o.startswith("--")]))
        return namespace, extras


def _unknown_flag(flag: str, known: list[str]) -> str:
    import difflib

    close = [o for o in known if o.startswith(flag)][:4] or difflib.get_close_matches(flag, known, n=3, cutoff=0.6)
    return f"unknown option {flag}" + (f"; did you mean {', '.join(close)}?" if close else "")


def refuse_a_ledger_folder(ledger) -> None:
    """A --ledger naming a folder is a usage error (report, sweep --status, paper), said before anything is read."""
    if ledger.is_dir():
        raise UsageError(f"--ledger {ledger} is a directory; give the ledger file (e.g. {ledger / 'ledger.jsonl'})")


def _emit(args, payload: dict, text: str) -> None:
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return
    if getattr(args, "json", False):
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(text)


def _log_for(args) -> Callable[[str], None]:
    stream = sys.stderr if getattr(args, "json", False) else sys.stdout

    def log(message: str) -> None:
        # one write, the line end with it: print() writes them apart, and a SIGTERM taken between the two left
        # the run's last line without its end, the command's "error: interrupted" line joined to it
        stream.write(f"{message}\n")
        stream.flush()

    return log


def verb_module(name: str):
    """The module of a verb (`muonlab.cli.<name>`, dashes as underscores): its HELP, add_arguments and run."""
    return importlib.import_module(f"muonlab.cli.{name.replace('-', '_')}")


def build_parser(argv: list[str] | None = None, only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb, or with `only` (what `main` passes: the verb the command line names) of
    that verb alone, the others listed by their one-line help: a verb's flags come from the config
    sections, which import torch and the families, so `muonlab --help` and `--version` need none of it."""
    from muonlab.cli.context import Context
    from muonlab.version import __version__

    parser = _Parser(prog="muonlab", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"muonlab {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True
    context = Context(argv)  # once per parser, however many verbs take config flags
    for name in VERBS:
        verb = verb_module(name)
        p = sub.add_parser(name, help=verb.HELP, **getattr(verb, "PARSER", {}))
        if only is None or name == only:
            verb.add_arguments(p, context)
            p.set_defaults(func=verb.run)
    return parser
