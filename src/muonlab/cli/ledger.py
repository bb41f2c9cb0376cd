"""`muonlab ledger recover RUNS_DIR`: append the ledger lines finished runs kept when their ledger
refused them."""

from __future__ import annotations

from muonlab.cli.parser import _emit

HELP = "recover the ledger lines finished runs kept when their ledger refused them"


def add_arguments(p, context) -> None:
    p.add_argument("action", choices=("recover",), help="recover: append each run directory's kept line "
                   "(ledger_line.json) the ledger lacks, once")
    p.add_argument("runs_dir", metavar="RUNS_DIR", help="the runs directory (its ledger.jsonl, unless --ledger)")
    p.add_argument("--ledger", default=None, help="the ledger to append to (default RUNS_DIR/ledger.jsonl)")
    p.add_argument("--json", action="store_true", help="print the recovered run ids as JSON")


def run(args) -> int:
    from muonlab.record.ledger import recover

    appended = recover(args.runs_dir, args.ledger)
    text = (f"appended {len(appended)} run(s) to the ledger: {', '.join(appended)}" if appended
            else "nothing to recover: every kept line is in the ledger")
    _emit(args, {"appended": appended}, text)
    return 0
