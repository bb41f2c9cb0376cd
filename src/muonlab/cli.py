"""The `muonlab` command line: argument parsing only; every verb calls a library function.

Exit status: 0 success, 1 runtime failure (including a diverged run or a failed check),
2 usage error (unknown option, impossible configuration, missing input), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import sys
from typing import Any, Callable

from muonlab.cli_flags import add_config_flags, collect_overrides
from muonlab.settings import finite_number, integer_at_least, token_count
from muonlab.errors import MuonlabError, UsageError


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


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


def _resolve_config(args: argparse.Namespace):
    """The RunConfig of a verb's arguments: a RunRequest made from them, resolved by muonlab.lab.request."""
    from muonlab.lab.request import RunRequest, resolve_request

    return resolve_request(RunRequest(preset=getattr(args, "preset", None), arm=getattr(args, "arm", "baseline"),
                                      arm_name=getattr(args, "arm_name", None), config_file=getattr(args, "config", None),
                                      experiment=getattr(args, "experiment", None), overrides=collect_overrides(args)))


def _emit(args, payload: dict, text: str) -> None:
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return
    if getattr(args, "json", False):
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(text)


def _log_for(args) -> Callable[[str], None]:
    stream = sys.stderr if getattr(args, "json", False) else sys.stdout
    return lambda message: print(message, file=stream, flush=True)


# ------------------------------------------------------------------------------ verbs
def _downloaded(args, cfg):
    """`prepare --download`: fetch the paper preset's dataset and tokenizer; the config that reads them."""
    from muonlab.config import apply_overrides, canonical_overrides
    from muonlab.data.paper_data import fetch, paper_data
    from muonlab.lab.request import DEFAULT_PRESET
    from muonlab.paths import cache_root

    wanted = paper_data(args.preset or DEFAULT_PRESET)
    user = canonical_overrides(collect_overrides(args))
    if wanted.dataset is None and "data.path" not in user:
        raise UsageError(f"{args.preset} trains on UniRef50 2021_04, which the hub does not hold as FASTA: give "
                         f"--path, the release's uniref50.fasta.gz (--download fetches the tokenizer)")
    root = cache_root(cfg.data.cache_dir)
    log = _log_for(args)
    for asset, max_files in ((wanted.dataset, args.download_files), (wanted.tokenizer, None)):
        if asset is not None:
            fetch(asset, root, max_files, log)
    settings = {k: v for k, v in wanted.settings(root).items() if k not in user}
    cfg = apply_overrides(cfg, settings, origin="download")
    flags = " ".join(f"--{k.split('.')[-1].replace('_', '-')} {shlex.quote(str(v))}" for k, v in settings.items())
    return cfg, f"muonlab train --preset {args.preset} {flags}"


def cmd_prepare(args) -> int:
    from muonlab.families import get_family

    if args.download_files is not None and not args.download:
        raise UsageError("--download-files counts the shards --download fetches; give --download")
    cfg = _resolve_config(args)
    train_with = None
    if args.download:
        cfg, train_with = _downloaded(args, cfg)
    data = get_family(cfg.family).prepare_data(cfg, log=_log_for(args))
    payload = data.describe()
    if train_with:
        payload["train_with"] = train_with
    text = "\n".join(f"{k}: {v}" for k, v in payload.items())
    _emit(args, payload, text)
    return 0


def cmd_train(args) -> int:
    from muonlab.train import run_training
    from muonlab.train.run import format_summary, resume_training

    if args.resume:
        if collect_overrides(args) or args.config:
            raise UsageError("--resume continues a run with its saved config; give no other settings")
        result = resume_training(args.resume, log=_log_for(args), fallback=args.fallback,
                                 quiet=True if args.json else None)
    else:
        from muonlab.lab.plugin_methods import check_plugins_act

        cfg = _resolve_config(args)
        check_plugins_act([cfg], "this run selects none")
        if args.json:
            cfg.record.quiet = True
        result = run_training(cfg, log=_log_for(args))
    _emit(args, {"run_id": result.run_id, "run_dir": str(result.run_dir), "status": result.status,
                 "summary": result.summary, "metrics": result.metrics},
          format_summary(result.summary) + f"\nrun_dir:          {result.run_dir}")
    return 0


def cmd_config(args) -> int:
    from muonlab.config.show import describe, to_toml

    cfg = _resolve_config(args)
    _emit(args, describe(cfg), to_toml(cfg).rstrip())
    return 0


def cmd_eval(args) -> int:
    from muonlab.train.rescore import rescore_every, rescore_run

    if args.every is not None:
        if args.step is not None:
            raise UsageError("--every scores the checkpoints at every multiple of N steps: drop --step")
        results = rescore_every(args.run, args.every, device=args.device, log=_log_for(args))
        text = [f"{r.step:>8}  " + "  ".join(f"{k} {v:.6f}" for k, v in r.scores.items()) for r in results]
        _emit(args, {"run_dir": args.run, "every": args.every, "evaluations": [r.to_dict() for r in results]},
              "\n".join([f"{args.run}: the val split after each multiple of {args.every} steps, recorded in its "
                         "evals.jsonl (report --at-step reads them)", "   steps  scores", *text]))
        return 0
    splits = tuple(s.strip() for s in args.splits.split(",") if s.strip())
    result = rescore_run(args.run, step=args.step, splits=splits, device=args.device, log=_log_for(args))
    _emit(args, result.to_dict(), result.format())
    return 0 if result.equal is not False else 1


def cmd_arms(args) -> int:
    from muonlab.arms import ARMS

    payload = {name: arm.to_dict() for name, arm in sorted(ARMS.items())}
    lines = []
    for arm in payload.values():
        origin = " / ".join(x for x in (arm["paper"], arm["experiment"]) if x) or "-"
        lines.append(f"{arm['name']:<20} [{arm['group']}] {arm['description']}")
        lines.append(f"{'':<20} reproduces: {origin}; overrides: {json.dumps(arm['overrides']) if arm['overrides'] else 'none'}")
    _emit(args, payload, "\n".join(lines))
    return 0


def cmd_methods(args) -> int:
    from muonlab.lab.methods import format_methods, method_catalog
    from muonlab.plugins import load_plugins

    load_plugins(args.plugin or "")  # their methods are listed too

    catalog = method_catalog()
    _emit(args, {"methods": catalog}, format_methods(catalog))
    return 0


def _parse_slurm_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--slurm expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


RUN_FLAGS = ("executor", "parallel", "gpus_per_run", "nodes", "detach", "retry_failed", "slurm")  # _add_run_flags' dests


def _options_given(args, dests) -> list[str]:
    """Those of the verb's own options `dests` given a value other than the parser's default, as flags."""
    return [f"--{d.replace('_', '-')}" for d in dests if getattr(args, d) != args.option_defaults[d]]


def cmd_sweep(args) -> int:
    from muonlab.lab.sweep import dry_run, format_dry_run, format_outcomes, run_sweep

    if args.status:
        return _sweep_status(args)
    arms, seeds, preset, overrides = _sweep_plan(args)
    if args.dry_run:
        from muonlab.lab.executors import make_executor

        if args.executor == "local":  # the SLURM-only flags are refused as a sweep refuses them, though nothing runs
            make_executor(args.executor, parallel=args.parallel, slurm=_parse_slurm_options(args.slurm),
                          gpus_per_run=args.gpus_per_run, nodes=args.nodes, detach=args.detach)
        plan = dry_run(arms, seeds, preset, overrides, retry_failed=args.retry_failed, log=_log_for(args))
        _emit(args, {"runs": plan}, format_dry_run(plan))
        return 0
    outcomes = run_sweep(arms, seeds, preset, overrides, executor=args.executor, parallel=args.parallel,
                         retry_failed=args.retry_failed, slurm=_parse_slurm_options(args.slurm),
                         log=_log_for(args), gpus_per_run=args.gpus_per_run, nodes=args.nodes, detach=args.detach)
    payload = [dict(arm=o.job.arm, seed=o.job.seed, config_hash=o.job.config_hash, action=o.action,
                    status=o.status, metrics=o.metrics) for o in outcomes]
    _emit(args, {"runs": payload}, format_outcomes(outcomes))
    # handed to SLURM and not yet back is not a failure: `sweep --status` follows it
    return 0 if all(o.status in ("ok", "queued", "running") for o in outcomes) else 1


def _sweep_plan(args) -> tuple[list[str], list[int], str, dict]:
    """(arms, seeds, preset, overrides) of the sweep the arguments name (muonlab.lab.request's rules)."""
    from muonlab.lab.request import SweepRequest, plan_request

    return plan_request(SweepRequest(arms=args.arms, seeds=args.seeds, preset=args.preset,
                                     experiment=getattr(args, "experiment", None), overrides=collect_overrides(args)))


def _sweep_status(args) -> int:
    """`muonlab sweep --status`: each (arm, seed) of the sweep the other arguments name, or of every
    run of --ledger's study: missing, queued, running, done, failed or interrupted."""
    from pathlib import Path

    from muonlab.lab.sweep import latest_records, plan_sweep
    from muonlab.lab.sweep_status import format_status, sweep_status
    from muonlab.record.rundir import ledger_path

    for name in ("detach", "retry_failed"):
        if getattr(args, name):
            raise UsageError(f"--status only reads where a sweep stands; drop --{name.replace('_', '-')}")
    overrides = collect_overrides(args)
    if args.arms or args.experiment:
        jobs = plan_sweep(*_sweep_plan(args))
        ledger = ledger_path(jobs[0].config)
        planned = [(j.arm, j.seed, j.config_hash, j.config.train.num_steps) for j in jobs]
    elif overrides.get("ledger"):
        ledger, planned = Path(overrides["ledger"]).expanduser(), None
    else:
        raise UsageError("muonlab sweep --status needs the sweep's --arms (with its --seeds, --preset and settings), "
                         "its --experiment or its --ledger")
    log = _log_for(args)
    states = sweep_status(ledger, latest_records(ledger, log), planned, warn=log)
    rows = [dict(arm=s.arm, seed=s.seed, config_hash=s.config_hash, state=s.state, detail=s.detail, job_id=s.job_id,
                 metrics=s.metrics) for s in states]
    _emit(args, {"ledger": str(ledger), "runs": rows}, f"ledger {ledger}\n" + format_status(states))
    return 0


def cmd_paper(args) -> int:
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
    plans = [table_plan(t, args.preset, overrides, args.full_grid, args.miniature) for t in tables]
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
                                 slurm=_parse_slurm_options(args.slurm), log=log, gpus_per_run=args.gpus_per_run,
                                 nodes=args.nodes, detach=args.detach,
                                 arm_overrides={a.arm: a.overrides for a in plan.arms})
            if not args.json:
                print(format_outcomes(outcomes), file=sys.stderr)
    first = plans[0]
    ledger = ledger_path(resolve_config(first.arms[0].arm, first.preset, first.arms[0].overrides))
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


def cmd_report(args) -> int:
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
    if ledger.is_dir():
        raise UsageError(f"--ledger {ledger} is a directory; give the ledger file (e.g. {ledger / 'ledger.jsonl'})")
    if args.tsv and Path(args.tsv).is_dir():  # before the report writes anything
        raise UsageError(f"--tsv {args.tsv} is a directory; give a file name (e.g. {Path(args.tsv) / 'results.tsv'})")
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


def cmd_diagnose(args) -> int:
    command = args.diagnostic
    result = command.run(args)
    _emit(args, result, command.format(result))
    return 1 if command.failed(result) else 0


def cmd_ledger(args) -> int:
    from muonlab.record.ledger import recover

    appended = recover(args.runs_dir, args.ledger)
    text = (f"appended {len(appended)} run(s) to the ledger: {', '.join(appended)}" if appended
            else "nothing to recover: every kept line is in the ledger")
    _emit(args, {"appended": appended}, text)
    return 0


def cmd_demo(args) -> int:
    from muonlab.demo import format_demo, run_demo

    report = run_demo(cache_dir=args.cache_dir, log=_log_for(args), quiet=args.json)
    _emit(args, report, format_demo(report))
    return 0 if report["beats_xz"] else 1


def cmd_doctor(args) -> int:
    from muonlab.doctor import gpu

    if not args.gpu:
        raise UsageError("say what to check: --gpu (the only check so far)")
    options = gpu.GpuCheckOptions(out=args.out, tests=args.tests, budget_s=args.budget_s,
                                  skip=tuple(s.strip() for s in args.skip.split(",") if s.strip()),
                                  pytest_workers=args.pytest_workers, require_fa3=args.require_fa3,
                                  work_dir=args.work_dir)
    if args.plan:  # no GPU needed: what would run, and whether it fits
        planned = gpu.plan(options.validate())
        _emit(args, planned, gpu.format_plan(planned))
        return 0 if planned["fits"] else 1
    report = gpu.run_gpu_check(options, log=_log_for(args))
    if report is None:  # no CUDA: one line, nothing run, nothing written
        print(json.dumps({"cuda_available": False, "ran": False, "message": gpu.NO_CUDA_LINE})
              if args.json else gpu.NO_CUDA_LINE)
        return 0
    _emit(args, report, gpu.format_summary(report))
    return 0 if report["passed"] else 1


def cmd_verify_reference(args) -> int:
    from muonlab.reference import verify_bundle

    report = verify_bundle(args.bundle)
    _emit(args, report.to_dict(), report.format_table())
    return 0 if report.passed else 1


DESCRIPTION = "muonlab: controlled small-scale LLM pretraining research with the Muon optimizer family"
REPORT_DESCRIPTION = """Statistics of a run ledger, one study per protocol.

A run's protocol is its resolved config less its arm's overrides and its seed; runs record its
id (older ledger lines get one derived from their recorded config, and the report says so).
Runs of two protocols are never pooled: each protocol is reported as its own study, with its
settings that differ from the others; --where or --protocol selects one. Within a protocol the
latest ok run of each (arm, seed) is used. Paired contrasts print mean ± SD, the 95%
t-interval, the two-sided paired t-test's p and a decision under --rule and --threshold."""
REPORT_EPILOG = """examples (seed 002's factorial arms, reference arm 00_dense_native):
  muonlab report --baseline 00_dense_native --where depth=6
  muonlab report --baseline 00_dense_native --dod 11_oe_opt:10_oe_native,01_dense_opt:00_dense_native
  muonlab report --baseline 00_dense_native --retention 11_oe_opt:10_oe_native,01_dense_opt:00_dense_native
  muonlab report --baseline 00_dense_native --dod 11_oe_opt:10_oe_native --across depth=6,8
seed 003's gate study (one seed, judged by the preregistered 0.0005 BPB alone):
  muonlab report --baseline p003_ordinary --single-seed p003_state_gate:p003_ordinary@246"""


DOCTOR_DESCRIPTION = """Acceptance checks of this machine.

--gpu runs, within --budget-s (8 minutes, sized for one H100/H200 from a cold start), four
sections and writes one JSON file (--out): environment (device, capability, torch/CUDA/driver
versions, FlashAttention-3, Triton, torch.compile), pytest (`pytest -m gpu` over the test files
holding gpu tests: attention kernels against fp32, compiled against eager, the LMO), throughput
(a compiled 50-step gpu-d8 run whose loss must fall with no recompile after warm-up: tokens/s,
MFU and peak memory beside upstream's) and distributed (a 1-GPU torchrun of both distributed
optimizers on NCCL: checkpoint, resume, continuation). Runs train on the embedded stdlib corpus
(no network). A failed section does not stop the others; one the budget did not reach is "not
run". Exit 0 when none failed, 1 otherwise. --plan prints the sections' limits and their sum
(no GPU needed). Without CUDA it prints one line, runs nothing, writes no file (even with
--out) and exits 0. benchmarks/gpu_acceptance.sh runs it from a checkout on a GPU image."""


def _first_pass(argv: list[str] | None):
    """--preset/--arm/--config/--plugin before the full parse: plug-ins are imported, and the
    flags' defaults are those of the config they resolve to (the family's settings shown)."""
    from muonlab.lab.plugin_methods import load_tracked

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)  # --pre is not --preset
    for flag in ("--preset", "--arm", "--config", "--plugin"):
        pre.add_argument(flag, default=None)
    try:
        known, _ = pre.parse_known_args(argv)
    except argparse.ArgumentError:  # e.g. `--plugin --`: the real parse says so, in one line
        known = argparse.Namespace(preset=None, arm=None, config=None, plugin=None)
    load_tracked(known.plugin or "")  # what each plug-in registers, seen at its first import
    from muonlab.lab.request import DEFAULT_PRESET

    try:
        from muonlab.arms import resolve_config
        from muonlab.config import load_config_file

        if known.config:
            return load_config_file(known.config)
        return resolve_config(known.arm or "baseline", known.preset or DEFAULT_PRESET)
    except MuonlabError:  # the real parse reports it; defaults are the plain preset's meanwhile
        from muonlab.config import preset

        return preset(DEFAULT_PRESET)


def _chosen_verb(argv: list[str] | None) -> str | None:
    """The verb the command line names (its first word that is not an option), if any."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    return words[0] if words else None


def _add_run_flags(p, prefix: str = "") -> None:
    """Where and how a sweep's runs go (sweep, and paper run, which runs a table as a sweep)."""
    p.add_argument("--executor", default="local", choices=("local", "slurm"), help=f"{prefix}where the runs go")
    p.add_argument("--parallel", type=integer_at_least(1), default=None,
                   help=f"{prefix}runs at a time (local; default: one per GPU group of --gpus-per-run, else 1)")
    p.add_argument("--gpus-per-run", type=integer_at_least(1), default=1, metavar="N",
                   help=f"{prefix}processes (one GPU each) of each run: N > 1 makes it a torch.distributed run; "
                        "locally torchrun on N GPUs of its own (runs at a time = visible GPUs // N; on CPU: N gloo "
                        "processes), on SLURM N tasks and N GPUs per node (no GPU for a CPU run)")
    p.add_argument("--nodes", type=integer_at_least(1), default=1, metavar="M",
                   help=f"{prefix}nodes of each run (slurm): M x --gpus-per-run processes")
    p.add_argument("--detach", action="store_true",
                   help=f"{prefix}slurm: submit the array and return with its job id (follow it with sweep --status)")
    p.add_argument("--retry-failed", action="store_true", help=f"{prefix}run failed or diverged (arm, seed)s again")
    p.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                   help=f"{prefix}submitit parameter, e.g. slurm_partition=gpu, timeout_min=60, cluster=local")


def build_parser(argv: list[str] | None = None, only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb, or with `only` (what `main` passes: the verb the command line names) of
    that verb alone, the others listed by their one-line help: a verb's flags come from the config
    sections, which import torch and the families, so `muonlab --help` and `--version` need none of it."""
    from muonlab.version import __version__

    parser = _Parser(prog="muonlab", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"muonlab {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True

    def verb(name: str, **kwargs):
        """The verb's parser when it is the chosen one, else None (listed by its help only)."""
        p = sub.add_parser(name, **kwargs)
        return p if only is None or name == only else None

    @functools.cache  # once per parser, however many verbs take config flags
    def config_context():
        from muonlab.config import all_presets
        from muonlab.families import all_families

        return _first_pass(argv), sorted(all_presets()), all_families()

    def with_config(p, data_only: bool = False):
        base, presets, families = config_context()  # first: the first pass loads the plug-ins
        from muonlab.lab.request import DEFAULT_PRESET

        p.add_argument("--preset", default=DEFAULT_PRESET, choices=presets,
                       help="protocol preset the flags override (default: gpu-d8; a GPU preset on a machine "
                            "without one needs --device cpu)")
        from muonlab.config import family_leaves

        skip = ("arm",) + tuple(l.key for f in families for l in family_leaves(f)
                                if data_only and not l.key.startswith("data."))
        add_config_flags(p, base, families, skip=skip)
        p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = verb("prepare", help="download/materialise a corpus and train its tokenizer")
    if p:
        with_config(p, data_only=True)
        p.add_argument("--download", action="store_true",
                       help="seed 004's presets: fetch the paper's dataset and tokenizer from the Hugging Face hub "
                            "(checked, resumable; nothing is fetched when they are here) and prepare them")
        p.add_argument("--download-files", type=integer_at_least(1), default=None, metavar="K",
                       help="with --download: only the first K shards of each split (default: all)")
        p.set_defaults(func=cmd_prepare)

    p = verb("train", help="train one run and evaluate val/holdout BPB")
    if p:
        p.add_argument("--arm", default="baseline", help="registered arm to train (see `muonlab arms`)")
        p.add_argument("--arm-name", default=None, metavar="NAME",
                       help="record the run as a new arm NAME: --arm (default baseline) plus the model and optimizer "
                            "settings given here (the run's other settings stay its protocol's, so `report` "
                            "contrasts NAME with the baseline); a NAME recorded with other settings is refused")
        p.add_argument("--config", default=None, help="start from a saved config (a run's config.json, or the TOML "
                                                      "`muonlab config` prints) instead of --preset/--arm")
        p.add_argument("--resume", default=None, metavar="RUN_DIR",
                       help="continue an interrupted run from its newest checkpoint, in its own directory")
        p.add_argument("--fallback", action="store_true",
                       help="with --resume: if the newest checkpoint is corrupted, use the previous valid one")
        with_config(p)
        p.set_defaults(func=cmd_train)

    p = verb("arms", help="list the registered arms")
    if p:
        p.add_argument("--json", action="store_true", help="print the registry as JSON")
        p.set_defaults(func=cmd_arms)

    p = verb("methods", help="list the registered methods (paper, config key, module, arms, tests)")
    if p:
        p.add_argument("--plugin", default=None, help="comma-separated plug-in modules or .py files to list too")
        p.add_argument("--json", action="store_true", help="print the registry as JSON")
        p.set_defaults(func=cmd_methods)

    p = verb("config", help="print the resolved config of a preset, arm and flags: each value with the layer it "
                            "came from, its hash and protocol id (TOML, or --json)")
    if p:
        p.add_argument("--arm", default="baseline", help="registered arm (see `muonlab arms`)")
        p.add_argument("--arm-name", default=None, metavar="NAME",
                       help="as `train --arm-name`: NAME is --arm plus the model and optimizer settings given")
        p.add_argument("--config", default=None,
                       help="a saved config (a run's config.json, or the TOML this verb prints) instead of --preset/--arm")
        p.add_argument("--experiment", default=None, metavar="FILE",
                       help="a TOML experiment file: --arm is one of its arms, under its preset and settings")
        with_config(p)
        p.set_defaults(func=cmd_config)

    p = verb("eval", help="score a run's final weights or a checkpoint again, in a process of its own, and compare "
                          "with what the run recorded (equal bit for bit on the machine that trained it)")
    if p:
        p.add_argument("run", metavar="RUN_DIR", help="a run directory (holding config.json)")
        p.add_argument("--step", type=integer_at_least(0), default=None, metavar="N",
                       help="the checkpoint after N steps (checkpoints/step-NNNNNN.pt) instead of the final weights")
        p.add_argument("--every", type=integer_at_least(1), default=None, metavar="N",
                       help="score the val split of each kept checkpoint after a multiple of N steps, as a periodic "
                            "evaluation, and record them where report --at-step reads them")
        p.add_argument("--splits", default="val,holdout", help="val, holdout or both (default: both)")
        p.add_argument("--device", default=None, help="score on this device instead of the run's (cpu, cuda, ...)")
        p.add_argument("--json", action="store_true", help="print the scores and the recorded values as JSON")
        p.set_defaults(func=cmd_eval)

    p = verb("sweep", help="run arms x seeds under one preset, resumable from the ledger")
    if p:
        p.add_argument("--arms", default=None, help="comma-separated arm names")
        p.add_argument("--seeds", default=None,
                       help="comma-separated seeds, e.g. 41,42,47 (default: the seeds the arms' paper used)")
        _add_run_flags(p)
        p.add_argument("--status", action="store_true",
                       help="print where each (arm, seed) of the sweep stands (the same arguments, or --ledger): "
                            "missing, queued, running (step, loss, ETA), done, failed or interrupted")
        p.add_argument("--experiment", default=None, metavar="FILE",
                       help="run the study a TOML file describes (its preset, seeds, arms, plug-ins and settings; "
                            "see docs/experiments.md) instead of --arms/--seeds/--preset")
        p.add_argument("--dry-run", action="store_true",
                       help="list every (arm, seed) with its config hash, protocol and what the sweep would do "
                            "(run, resume, done, skip); run nothing")
        with_config(p)
        p.set_defaults(func=cmd_sweep, preset=None)

    p = verb("report", help="per-protocol studies: per-arm statistics, paired contrasts, Markdown/JSON/PNG",
             description=REPORT_DESCRIPTION, epilog=REPORT_EPILOG,
             formatter_class=argparse.RawDescriptionHelpFormatter)
    if p:
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
        p.set_defaults(func=cmd_report)

    p = verb("paper", help="the seed papers' tables beside the ledger's runs (a scorecard); run what is missing",
             description="muonlab paper [score] [TABLE ...]: the scorecard (default: every table, under each "
                         "table's paper preset and rule); muonlab paper run TABLE ... (or --all): run the runs the "
                         "paper made that are missing, as a resumable sweep, then score them (--miniature: at a CPU "
                         "scale that keeps the protocol's structure); muonlab paper tables: list them")
    if p:
        p.add_argument("tables", nargs="*", metavar="[score|run|tables] TABLE",
                       help="score (default), run or tables, then table ids (muonlab paper tables lists them)")
        p.add_argument("--preset", default=None, help="the protocol the runs were made under (default: each table's "
                                                      "paper preset; another of the same family and data kind is "
                                                      "said to differ)")
        p.add_argument("--miniature", action="store_true",
                       help="the table's miniature: its runs on the family's CPU preset, every duration in steps "
                            "divided by one factor, so the comparison point and its evaluation keep their place")
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
        _add_run_flags(p, "paper run: ")
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
        base, _, families = config_context()
        add_config_flags(p, base, families, skip=("arm",))  # settings on top of the preset: run and score under them
        p.set_defaults(func=cmd_paper)

    p = verb("diagnose", help="read-only diagnostics of the seed papers (a sub-command per tool)")
    if p:
        tools = p.add_subparsers(dest="tool", metavar="TOOL", parser_class=_Parser)
        tools.required = True
        from muonlab.diagnostics import commands

        for name, command in commands().items():  # each declared beside its code (its module's COMMAND)
            t = tools.add_parser(name, help=command.help, description=command.help)
            for flag, kwargs in command.options:
                t.add_argument(flag, **kwargs)
            t.add_argument("--json", action="store_true", help="print the numbers as JSON")
            t.set_defaults(func=cmd_diagnose, diagnostic=command)

    p = verb("ledger", help="recover the ledger lines finished runs kept when their ledger refused them")
    if p:
        p.add_argument("action", choices=("recover",), help="recover: append each run directory's kept line "
                       "(ledger_line.json) the ledger lacks, once")
        p.add_argument("runs_dir", metavar="RUNS_DIR", help="the runs directory (its ledger.jsonl, unless --ledger)")
        p.add_argument("--ledger", default=None, help="the ledger to append to (default RUNS_DIR/ledger.jsonl)")
        p.add_argument("--json", action="store_true", help="print the recovered run ids as JSON")
        p.set_defaults(func=cmd_ledger)

    p = verb("demo", help="the CPU demo: stdlib corpus, cpu-demo preset, compare with xz")
    if p:
        p.add_argument("--cache-dir", default=None, help="cache directory (default ~/.cache/muonlab)")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(func=cmd_demo)

    p = verb("doctor", help="acceptance checks of this machine: --gpu checks every CUDA path in ~8 minutes",
             description=DOCTOR_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    if p:
        from muonlab.doctor.gpu import DEFAULT_BUDGET_S, DEFAULT_OUT, SECTIONS

        p.add_argument("--gpu", action="store_true", help="check every CUDA path on this machine's GPU")
        p.add_argument("--out", default=DEFAULT_OUT, metavar="PATH",
                       help=f"the JSON report, written atomically (default ./{DEFAULT_OUT}; never written without CUDA)")
        p.add_argument("--tests", default=None, metavar="PATH",
                       help="the tests folder `pytest -m gpu` runs (default: the checkout's tests/)")
        p.add_argument("--budget-s", type=finite_number(0, above=True), default=DEFAULT_BUDGET_S, metavar="SECONDS",
                       help=f"time budget of the whole check; each section's limit is cut to what is left "
                            f"(default {DEFAULT_BUDGET_S:.0f})")
        p.add_argument("--skip", default="", metavar="SECTIONS",
                       help=f"comma-separated sections not to run: {', '.join(SECTIONS)}")
        p.add_argument("--pytest-workers", type=integer_at_least(0), default=None, metavar="N",
                       help="pytest-xdist workers sharing the GPU (default 4 with pytest-xdist on a shared GPU, else 1)")
        p.add_argument("--require-fa3", action="store_true",
                       help="fail the environment section when FlashAttention-3 cannot be loaded (default: a warning)")
        p.add_argument("--work-dir", default=None, metavar="DIR",
                       help="keep the runs, their cache and the pytest report here (default: a temporary folder, removed)")
        p.add_argument("--plan", action="store_true",
                       help="print the sections, their time limits and their sum against the budget; run nothing "
                            "(exit 1 when they do not fit)")
        p.add_argument("--json", action="store_true", help="print the report as JSON instead of the summary")
        p.set_defaults(func=cmd_doctor)

    p = verb("verify-reference", help="teacher-forced check against an upstream reference bundle")
    if p:
        p.add_argument("bundle", help="path to an autoresearch-reference/1 bundle (.pt)")
        p.add_argument("--json", action="store_true", help="print every per-tensor figure as JSON")
        p.set_defaults(func=cmd_verify_reference)
    return parser


def _signal_as_interrupt(signum, frame):
    raise KeyboardInterrupt  # a SLURM preemption or `kill` ends a run like Ctrl-C: recorded, then exit


def main(argv: list[str] | None = None) -> int:
    import signal

    # SIGUSR2: SLURM's advance notice (sbatch --signal), whose default action would end the process unrecorded
    stops = [signal.SIGTERM] + ([signal.SIGUSR2] if hasattr(signal, "SIGUSR2") else [])
    previous = {sig: signal.signal(sig, _signal_as_interrupt) for sig in stops} if threading_is_main() else {}
    try:
        args = build_parser(argv, only=_chosen_verb(argv) or "").parse_args(argv)
        return args.func(args)
    except MuonlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # disk full, permissions, a vanished file: the run is already recorded
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug or an unforeseen failure: one line; a run keeps its traceback
        if os.environ.get("MUONLAB_DEBUG"):
            raise
        verb = _chosen_verb(argv) or ""
        where = "a run records the traceback in its ledger line; " if verb in ("train", "sweep") else ""
        print(f"error: {exc.__class__.__name__}: {exc} ({where}MUONLAB_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    raise SystemExit(main())
