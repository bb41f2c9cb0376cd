"""`muonlab verify-reference BUNDLE`: the teacher-forced check against an upstream reference bundle."""

from __future__ import annotations

from muonlab.cli.parser import _emit

HELP = "teacher-forced check against an upstream reference bundle"


def add_arguments(p, context) -> None:
    p.add_argument("bundle", help="path to an autoresearch-reference/1 bundle (.pt)")
    p.add_argument("--json", action="store_true", help="print every per-tensor figure as JSON")


def run(args) -> int:
    from muonlab.reference import verify_bundle

    report = verify_bundle(args.bundle)
    _emit(args, report.to_dict(), report.format_table())
    return 0 if report.passed else 1
