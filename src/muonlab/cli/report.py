"""`muonlab report`: a ledger's statistics, one study per protocol: per-arm statistics, paired contrasts
and the other comparisons asked for, as Markdown, JSON and plots (and an upstream-style results.tsv)."""

from __future__ import annotations

import argparse

from muonlab.cli.parser import _emit, refuse_a_ledger_folder
from muonlab.errors import MuonlabError, UsageError
from muonlab.settings import finite_number, integer_at_least, token_count

HELP = "per-protocol studies: per-arm statistics, paired contrasts, Markdown/JSON/PNG"
DESCRIPTION = """Statistics of a run ledger, one study per protocol.

A run's protocol is its resolved config less its arm's overrides and its seed; runs record its
id (older ledger lines get one derived from their recorded config, and the report says so).
Runs of two protocols are never pooled: each protocol is reported as its own study, with its
settings that differ from the others; --where or --protocol selects one. Within a protocol the
latest ok run of each (arm, seed) is used. Paired contrasts print mean ± SD, the 95%
t-interval, the two-sided paired t-test's p and a decision under --rule and --threshold."""
EPILOG = """examples (seed 002's factorial arms, reference arm 00_dense_native):
  muonlab report --baseline 00_dense_native --where depth=6
  muonlab report --baseline 00_dense_native --dod 11_oe_opt:10_oe_native,01_dense_opt:00_dense_native
  muonlab report --baseline 00_dense_native --retention 11_oe_opt:10_oe_native,01_dense_opt:00_dense_native
  muonlab report --baseline 00_dense_native --dod 11_oe_opt:10_oe_native --across depth=6,8
seed 003's gate study (one seed, judged by the preregistered 0.0005 BPB alone):
  muonlab report --baseline p003_ordinary --single-seed p003_state_gate:p003_ordinary@246"""
PARSER = dict(description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_arguments(p, context) -> None:
    p.add_argument("--ledger", default=None, help="ledger to analyse (default <cache>/runs/ledger.jsonl)")
    p.add_argument("--baseline", default=None,
                   help="reference arm of the contrasts (default baseline, or the --experiment file's)")
    p.add_argument("--experiment", default=None, metavar="FILE",
                   help="report exactly the runs a TOML experiment file plans (its arms and seeds, under its "
                        "protocol), its baseline the reference")
    p.add_argument("--metric", default="auto", help="metrics key to compare: val_bpb, holdout_bpb, val_ce, ...; "
                   "auto (default): the runs' family metric (val_bpb; val_ce for seed 004's families)")
    p.add_argument("--threshold", type=finite_number(0), default=0.0005,
                   help="preregistered decision threshold in metric units (default 0.0005 BPB)")
    p.add_argument("--rule", default="ci+threshold", choices=("ci+threshold", "ci", "threshold"),
                   help="decision rule (default: CI excludes 0 and |mean delta| >= threshold)")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep the runs whose config holds KEY=VALUE (a flag name such as depth or num-steps, or a "
                        "dotted key such as model.depth); repeatable, all must hold")
    p.add_argument("--protocol-free", action="store_true",
                   help="pool the lines that record neither a protocol id nor a config (results imported from "
                        "elsewhere) into one protocol: you vouch that they ran alike (default: each its own)")
    p.add_argument("--at-step", type=integer_at_least(1), default=None, metavar="N",
                   help="compare each run at its last periodic evaluation at or before step N (val_ metrics; "
                        "the paper's comparison point) instead of its final value")
    p.add_argument("--at-tokens", type=token_count, default=None, metavar="T",
                   help="the same at T training tokens (458752000, 458.8M, 2.62B)")
    p.add_argument("--protocol", default=None, metavar="ID",
                   help="keep the one protocol whose id starts with ID (ids are printed per study)")
    p.add_argument("--contrast", action="append", default=[], metavar="A:B",
                   help="also the paired contrast A - B in each protocol; repeatable")
    p.add_argument("--dod", action="append", default=[], metavar="A:B,C:D",
                   help="difference-of-differences (A - B) - (C - D) per seed in each protocol; with --across, "
                        "A:B is the one contrast compared between two protocols; repeatable")
    p.add_argument("--retention", action="append", default=[], metavar="A:B,C:D",
                   help="retention ratio mean(A - B) / mean(C - D) (descriptive); with --across, A:B in the "
                        "first protocol over A:B in the second; repeatable")
    p.add_argument("--single-seed", action="append", default=[], metavar="A:B[@SEED]",
                   help="seed 003's preregistered gate rule: one seed's A - B against --threshold alone (no "
                        "interval); @SEED names the seed when the arms share several; repeatable")
    p.add_argument("--across", default=None, metavar="KEY[=V1,V2]",
                   help="compare a --dod/--retention A:B between two protocols that differ only in KEY "
                        "(V1 minus V2; default: the two values present, ascending)")
    p.add_argument("--out", default=None, help="report directory (default <ledger dir>/report)")
    p.add_argument("--tsv", default=None, metavar="PATH", help="also export upstream-style results.tsv")
    p.add_argument("--json", action="store_true", help="print the report's numbers as JSON")


def run(args) -> int:
    from pathlib import Path

    from muonlab.atomic import write_text
    from muonlab.lab.report import format_text, run_report
    from muonlab.lab.report.build import still_out
    from muonlab.paths import cache_root
    from muonlab.record.ledger import read_records_tolerant
    from muonlab.record.results_tsv import results_tsv

    only, baseline, jobs = None, args.baseline, None
    if args.experiment:  # exactly the runs the file plans: its arms and seeds under its protocol
        from muonlab.lab.experiment import load_experiment
        from muonlab.lab.sweep import plan_sweep

        study = load_experiment(args.experiment)
        jobs = plan_sweep(list(study.arms), list(study.seeds), study.preset, study.settings)
        only = {(j.arm, j.seed, j.config.protocol_id()) for j in jobs}
        baseline = study.baseline if args.baseline is None else args.baseline
    if args.ledger:
        ledger = Path(args.ledger)
    elif jobs:  # the ledger the file's runs went to (its record.runs_dir or record.ledger)
        from muonlab.record.rundir import ledger_path

        ledger = ledger_path(jobs[0].config)
    else:
        ledger = cache_root() / "runs" / "ledger.jsonl"
    refuse_a_ledger_folder(ledger)
    if args.tsv and Path(args.tsv).is_dir():  # before the report writes anything
        raise UsageError(f"--tsv {args.tsv} is a directory; give a file name (e.g. {Path(args.tsv) / 'results.tsv'})")
    if args.tsv:
        _check_can_write(Path(args.tsv), "--tsv", "a file name in a folder you can write")
    _check_can_write(Path(args.out) if args.out else ledger.parent / "report", "--out",
                     "a report folder you can write (--out DIR)")
    if not ledger.is_file():
        out = still_out(ledger)
        if out:  # a detached sweep none of whose runs has ended yet
            raise MuonlabError(f"no run has finished yet: {len(out)} submitted run(s) are still out "
                               f"(muonlab sweep --status --ledger {ledger})")
        raise UsageError(f"ledger not found: {ledger}")
    report = run_report(ledger, baseline=baseline or "baseline", metric=args.metric, threshold=args.threshold,
                        out_dir=args.out, rule=args.rule, where=args.where, protocol=args.protocol,
                        contrasts=args.contrast, dods=args.dod, retentions=args.retention,
                        single_seed=args.single_seed, across=args.across, only=only, at=_point(args),
                        protocol_free=args.protocol_free,
                        title=f"{Path(args.experiment).stem} ({args.experiment})" if args.experiment else None)
    if args.tsv:
        records, _ = read_records_tolerant(ledger)
        write_text(args.tsv, results_tsv(sorted(records, key=lambda r: r["_line"])))
    text = format_text(report)
    if args.tsv:
        text += f"\nresults.tsv: {args.tsv}"
    _emit(args, report, text)
    return 0


def _point(args):
    """report --at-step / --at-tokens as a comparison point (None: the final values)."""
    from muonlab.lab.report.loading import Point

    if args.at_step is None and args.at_tokens is None:
        return None
    if args.at_step is not None and args.at_tokens is not None:
        raise UsageError("give --at-step or --at-tokens, not both")
    return Point(step=args.at_step) if args.at_step is not None else Point(tokens=args.at_tokens)


def _check_can_write(target: Path, flag: str, instead: str) -> None:
    """Refuse, before the report writes anything, a target it could not write: a probe file is made and removed
    in the target folder where it exists, else in the nearest folder above it that exists (permissions alone do
    not say: root passes every access check, and /proc takes no new file)."""
    import tempfile  # noqa: PLC0415

    where = target if target.is_dir() else target.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        with tempfile.NamedTemporaryFile(dir=where, prefix=".muonlab-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {target}: cannot write in {where} ({exc.strerror or exc}); give {instead}") from None
