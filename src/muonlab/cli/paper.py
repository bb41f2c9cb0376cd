"""`muonlab paper [score|run|tables] [TABLE ...]`: the scorecard of the seed papers' tables against the
ledger's runs; `paper run` runs a table's missing runs as a sweep (--dry-run: what they would cost);
`paper tables` lists the tables."""

from __future__ import annotations

import json
import sys

from muonlab.cli.config_flags import add_config_flags, collect_overrides
from muonlab.cli.parser import _emit, _log_for, refuse_a_ledger_folder
from muonlab.cli.run_flags import RUN_FLAGS, add_run_flags, parse_slurm_options
from muonlab.errors import UsageError
from muonlab.settings import finite_number, integer_at_least

HELP = "the seed papers' tables beside the ledger's runs (a scorecard); run what is missing"
PARSER = dict(description="muonlab paper [score] [TABLE ...]: the scorecard (default: every table, under each "
                          "table's paper preset and rule); muonlab paper run TABLE ... (or --all): run the runs the "
                          "paper made that are missing, as a resumable sweep, then score them (--miniature: at a CPU "
                          "scale that keeps the protocol's structure); muonlab paper tables: list them")


def add_arguments(p, context) -> None:
    p.add_argument("tables", nargs="*", metavar="[score|run|tables] TABLE",
                   help="score (default), run or tables, then table ids (muonlab paper tables lists them)")
    p.add_argument("--preset", default=None, help="the protocol the runs were made under (default: each table's "
                                                  "paper preset; another of the same family and data kind is "
                                                  "said to differ)")
    p.add_argument("--miniature", action="store_true",
                   help="the table's miniature: its runs on the family's CPU preset, every duration in steps "
                        "divided by one factor, so the comparison point and its evaluation keep their place")
    from muonlab.lab.paper.runs import MIN_STEPS, MINI_STEPS

    p.add_argument("--miniature-steps", type=integer_at_least(MIN_STEPS), default=None, metavar="N",
                   help=f"with --miniature: the longest run about N steps (default {MINI_STEPS}; fewer is a quicker, "
                        "noisier table, the factor still dividing the comparison point)")
    p.add_argument("--full-grid", action="store_true",
                   help="every arm at every seed of the table (default: the seeds the paper ran for each arm)")
    p.add_argument("--all", action="store_true", help="paper run: every table")
    from muonlab.lab.paper.rules import RULES

    p.add_argument("--rule", default=None, choices=tuple(RULES),
                   help="judge every table by this rule instead of its paper's (`muonlab paper tables` lists "
                        "each table's)")
    p.add_argument("--threshold", type=finite_number(0), default=0.0005,
                   help="θ of the rules that have one (single_seed, threshold, ci+threshold; default 0.0005)")
    p.add_argument("--out", default=None, help="also write scorecard.md and scorecard.json there")
    add_run_flags(p, "paper run: ")
    p.add_argument("--dry-run", action="store_true",
                   help="paper run: list the table's runs still to do with each one's FLOPs and GPU-hours (at "
                        "--mfu of a --gpu); run nothing")
    p.add_argument("--mfu", type=finite_number(0, above=True, maximum=1), default=None,
                   help="paper run --dry-run: the model-FLOPs utilisation the GPU-hours assume (default: the "
                        "last measured for the preset on that GPU in the ledger, else 0.4, said)")
    p.add_argument("--gpu", default=None,
                   help="paper run --dry-run: the GPU whose dense bf16 peak the GPU-hours assume (default H100)")
    p.add_argument("--json", action="store_true", help="print the scorecard as JSON")
    # the defaults of paper's own options, which score and tables refuse where they are given
    p.set_defaults(option_defaults={a.dest: a.default for a in p._actions if a.option_strings and a.dest not in
                                    ("help", "json")})
    base, _, families = context.config
    add_config_flags(p, base, families, skip=("arm",))  # settings on top of the preset: run and score under them


def _options_given(args, dests) -> list[str]:
    """Those of the verb's own options `dests` given a value other than the parser's default, as flags."""
    return [f"--{d.replace('_', '-')}" for d in dests if getattr(args, d) != args.option_defaults[d]]


def run(args) -> int:
    """`muonlab paper [score|run|tables] [TABLE ...]`: the scorecard against the seed papers' tables."""
    from pathlib import Path

    from muonlab.arms import resolve_config
    from muonlab.atomic import write_text
    from muonlab.lab.paper import format_scorecard, load_tables, scorecard, select_tables
    from muonlab.lab.paper.runs import table_plan
    from muonlab.lab.plugin_methods import check_plugins_act
    from muonlab.lab.report.build import still_out
    from muonlab.record.ledger import read_records_tolerant
    from muonlab.record.rundir import ledger_path

    args.action = args.tables.pop(0) if args.tables and args.tables[0] in ("score", "run", "tables") else "score"
    run_flags = _options_given(args, RUN_FLAGS + ("dry_run", "mfu", "gpu", "all"))
    if args.action != "run" and run_flags:
        raise UsageError(f"{', '.join(run_flags)}: options of `muonlab paper run`, not of paper {args.action}")
    if args.action == "tables":
        given = [f"--{k.replace('_', '-')}" for k in collect_overrides(args)]
        given += _options_given(args, [d for d in args.option_defaults if d not in RUN_FLAGS])
        if given or args.tables:
            raise UsageError(f"muonlab paper tables lists the tables and takes no table or settings "
                             f"({', '.join(given) or ' '.join(args.tables)})")
        rows = [{"id": t.id, "paper": t.paper, "source": t.source, "preset": t.preset, "rule": t.rule,
                 "arms": [a.arm for a in t.arms]} for t in load_tables().values()]
        _emit(args, {"tables": rows}, "\n".join(f"{r['id']:<18} {r['paper']}: {r['source']} (preset {r['preset']}, "
                                                f"rule {r['rule']})" for r in rows))
        return 0
    if args.action == "run" and not args.tables and not args.all:
        raise UsageError("muonlab paper run takes TABLE ... (muonlab paper tables lists them) or --all")
    if args.all and args.tables:
        raise UsageError(f"--all runs every table: drop {' '.join(args.tables)}")
    tables = select_tables(args.tables)
    overrides = collect_overrides(args)  # e.g. --ledger, --runs-dir, or settings that change the protocol
    plans = [table_plan(t, args.preset, overrides, args.full_grid, args.miniature, args.miniature_steps)
             for t in tables]
    if args.action == "run":
        from muonlab.lab.sweep import format_outcomes, run_sweep

        for plan in plans:
            check_plugins_act((resolve_config(a.arm, plan.preset, a.overrides) for a in plan.arms),
                              f"no arm of table {plan.table.id} selects any")
        if args.dry_run or args.mfu is not None or args.gpu is not None:
            if not args.dry_run:
                raise UsageError("--mfu and --gpu price a --dry-run: give --dry-run")
            return _price_tables(args, plans)
        log = _log_for(args)
        for plan in plans:
            log(f"paper run {plan.table.id}: {plan.describe()}")
            outcomes = run_sweep([a.arm for a in plan.arms], plan.seeds(), plan.preset, {"quiet": True},
                                 executor=args.executor, parallel=args.parallel, retry_failed=args.retry_failed,
                                 slurm=parse_slurm_options(args.slurm), log=log, gpus_per_run=args.gpus_per_run,
                                 nodes=args.nodes, detach=args.detach,
                                 arm_overrides={a.arm: a.overrides for a in plan.arms})
            if not args.json:
                print(format_outcomes(outcomes), file=sys.stderr)
    first = plans[0]
    ledger = ledger_path(resolve_config(first.arms[0].arm, first.preset, first.arms[0].overrides))
    refuse_a_ledger_folder(ledger)
    records = read_records_tolerant(ledger)[0] if ledger.is_file() else []
    card = scorecard(plans, records, rule=args.rule, threshold=args.threshold)
    card["ledger"] = str(ledger)
    card["unfinished"] = still_out(ledger)  # submitted to SLURM, not recorded yet
    text = format_scorecard(card)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "scorecard.md", text + "\n")
        write_text(out / "scorecard.json", json.dumps(card, indent=2) + "\n")
    _emit(args, card, text)
    return 0


def _price_tables(args, plans) -> int:
    """`paper run TABLE --dry-run`: the runs still to do, each with its FLOPs and GPU-hours."""
    from pathlib import Path

    from muonlab.lab.paper.cost import format_price, measured_mfu, price
    from muonlab.lab.sweep import dry_run, plan_sweep
    from muonlab.record.ledger import read_records_tolerant

    out, texts = [], []
    for plan in plans:
        arms, seeds, own = [a.arm for a in plan.arms], plan.seeds(), {a.arm: a.overrides for a in plan.arms}
        run_plan = dry_run(arms, seeds, plan.preset, {"quiet": True}, retry_failed=args.retry_failed,
                           log=_log_for(args), arm_overrides=own)
        configs = {job.key: job.config for job in plan_sweep(arms, seeds, plan.preset, {"quiet": True}, own)}
        if args.gpu is not None and not args.gpu.strip():
            raise UsageError("--gpu names a GPU (H100, A100, ...): give one or leave the option out")
        gpu = args.gpu or "H100"
        ledger = Path(run_plan[0]["ledger"])
        records = read_records_tolerant(ledger)[0] if ledger.is_file() else []
        mfu, basis = ((args.mfu, "given (--mfu)") if args.mfu is not None
                      else measured_mfu(records, plan.preset, gpu))
        priced = price(run_plan, configs, gpu, mfu, basis)
        done = sum(p["action"] == "done (ok)" for p in run_plan)
        out.append({"table": plan.table.id, "preset": plan.preset, **priced, "done": done})
        texts.append(f"## {plan.table.id} ({plan.describe()})\n" + format_price(priced, done))
    _emit(args, out[0] if len(out) == 1 else {"tables": out}, "\n\n".join(texts))
    return 0
