"""`muonlab demo`: the CPU demo (stdlib corpus, cpu-demo preset), compared with xz."""

from __future__ import annotations

from muonlab.cli.parser import _emit, _log_for

HELP = "the CPU demo: stdlib corpus, cpu-demo preset, compare with xz"


def add_arguments(p, context) -> None:
    p.add_argument("--cache-dir", default=None, help="cache directory (default ~/.cache/muonlab)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    from muonlab.demo import format_demo, run_demo

    report = run_demo(cache_dir=args.cache_dir, log=_log_for(args), quiet=args.json)
    _emit(args, report, format_demo(report))
    return 0 if report["beats_xz"] else 1
