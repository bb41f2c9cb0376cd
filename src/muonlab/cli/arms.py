"""`muonlab arms`: the registered arms, each with its paper, experiment and overrides."""

from __future__ import annotations

import json

from muonlab.cli.parser import _emit

HELP = "list the registered arms"


def add_arguments(p, context) -> None:
    p.add_argument("--json", action="store_true", help="print the registry as JSON")


def run(args) -> int:
    from muonlab.arms import ARMS

    payload = {name: arm.to_dict() for name, arm in sorted(ARMS.items())}
    lines = []
    for arm in payload.values():
        origin = " / ".join(x for x in (arm["paper"], arm["experiment"]) if x) or "-"
        lines.append(f"{arm['name']:<20} [{arm['group']}] {arm['description']}")
        lines.append(f"{'':<20} reproduces: {origin}; overrides: {json.dumps(arm['overrides']) if arm['overrides'] else 'none'}")
    _emit(args, payload, "\n".join(lines))
    return 0
