"""`muonlab diagnose TOOL`: the read-only diagnostics of the seed papers, a sub-command per tool, each
declared beside its code in its paper's pack (its module's COMMAND; muonlab.diagnostics.commands)."""

from __future__ import annotations

from muonlab.cli.parser import _emit, _Parser

HELP = "read-only diagnostics of the seed papers (a sub-command per tool)"


def add_arguments(p, context) -> None:
    tools = p.add_subparsers(dest="tool", metavar="TOOL", parser_class=_Parser)
    tools.required = True
    from muonlab.diagnostics import commands

    for name, command in commands().items():  # each declared beside its code (its module's COMMAND)
        t = tools.add_parser(name, help=command.help, description=command.help)
        for flag, kwargs in command.options:
            t.add_argument(flag, **kwargs)
        t.add_argument("--json", action="store_true", help="print the numbers as JSON")
        t.set_defaults(diagnostic=command)


def run(args) -> int:
    command = args.diagnostic
    result = command.run(args)
    _emit(args, result, command.format(result))
    return 1 if command.failed(result) else 0
