"""One training run end to end: data, model, loop, evaluation, run directory, ledger line.

Bad configuration and bad data fail before anything is written. Once the run directory exists,
every outcome is recorded as exactly one ledger line: `ok`; `diverged` (NaN/Inf or exploding loss,
with the step; earlier checkpoints are kept); `interrupted` (Ctrl-C, SIGTERM, a SLURM
preemption; during data preparation too, which then creates the run to record it), `resumable`
when a complete checkpoint exists; or `failed` (any other error). A line that is not `ok` says the
`phase` the run was in: data, build, train or evaluate.
`muonlab train --resume RUN_DIR` continues such a run in its own directory from its newest
checkpoint, with the same result as an uninterrupted run. Signals wait while the outcome is
written, and a summary that cannot be written never stops the ledger line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from muonlab.atomic import write_json
from muonlab.config import RunConfig, is_legacy, load_config_file, preset_of, read_config_values
from muonlab.data.prefetch import PrefetchLoader
from muonlab.data.prepare import PreparedData
from muonlab.device import (Runtime, detect_device, mfu_percent, peak_flops, peak_memory_mb, resolve_precision,
                            use_expandable_segments)
from muonlab.errors import MuonlabError, UsageError
from muonlab.eval import EvalResult
from muonlab.eval.text import evaluate_text_splits
from muonlab.families import get_family
from muonlab.host_memory import retain_freed_host_memory
from muonlab.optional import require
from muonlab.plugins import load_plugins
from muonlab.record import ledger, provenance
from muonlab.record.optimizer_groups import optimizer_groups
from muonlab.record.rundir import (RunDir, check_new_run, ledger_path, metrics_writer, new_run_id, periodic_evals,
                                   runs_dir)
from muonlab.record.sinks import SinkGroup, parse_sinks
from muonlab.stop_request import stop_if_requested
from muonlab.train.build import build_model, build_optimizer
from muonlab.train.checkpoint import (latest_checkpoint, newest_complete_checkpoint, rng_state, save_checkpoint,
                                      set_rng_state)
from muonlab.train.distributed import Dist, init_from_env, shutdown
from muonlab.train.loop import Diverged, LoopState, OutOfMemory, RunInterrupted, train_loop

COUNT_KEYS = ("tokens", "bytes")  # an evaluation's sizes, not its scores
SUMMARY_KEYS = ("val_bpb", "holdout_bpb", "training_seconds", "total_seconds", "peak_vram_mb",
                "mfu_percent", "total_tokens_M", "num_steps", "num_params_M", "depth")


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    status: str
    summary: dict
    metrics: dict = field(default_factory=dict)
    error: str | None = None


def format_summary(summary: dict) -> str:
    """Upstream's closing block: '---' then one `key: value` line per summary key; the family's own
    figures (seed 004's val_ce, seed 004 Table 3's statistics, seed 002's oe_params_M) stand between
    `depth` and `status` in the summary and follow upstream's keys, with 6 decimals."""
    keys = list(summary)
    family = keys[keys.index("depth") + 1:keys.index("status")] if {"depth", "status"} <= set(keys) else []
    lines = ["---"]
    for key in (*SUMMARY_KEYS, *family):
        value = summary.get(key)
        if isinstance(value, float):
            digits = 6 if key.startswith(("val_", "holdout_")) or key in family else (2 if key == "mfu_percent" else 1)
            text = f"{value:.{digits}f}"
        else:
            text = "n/a" if value is None else str(value)
        if key == "total_tokens_M" and isinstance(value, float) and 0 < value < 1:
            text = f"{value:.4f}"  # a short run's tokens, not 0.0
        if key == "peak_vram_mb" and summary.get("peak_memory_kind") == "process":
            key = "peak_rss_mb"  # on the CPU: the process's peak resident memory, not an accelerator's
        lines.append(f"{key + ':':<18}{text}")
    return "\n".join(lines)


def use_compile(cfg: RunConfig, runtime: Runtime) -> bool:
    return cfg.runtime.compile == "on" or (cfg.runtime.compile == "auto" and runtime.device.type == "cuda")


# SIGUSR2 is SLURM's advance notice of a time limit or preemption (sbatch --signal, as submitit sets
# it): the run checkpoints and stops the same way, and a sweep's task then requeues itself
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGUSR2,) if hasattr(signal, "SIGUSR2") else ())


class StopSignals:
    """While active, SIGINT/SIGTERM/SIGUSR2 ask the loop to stop after the current step (and
    checkpoint); a second signal interrupts at once. `signal` names the first.

    With `at_once`, a signal that arrives before the loop's first poll (`poll`, after the first step's
    work) interrupts at once: that step compiles the model, which can take minutes, and stopping
    after it would keep nothing a checkpoint does not already hold (the stop is asked for too: should C code
    discard the interrupt, the poll after the step still stops). A distributed run waits for the step all the
    same: its ranks must stop together."""

    def __init__(self, at_once: bool = False):
        self.requested = False
        self.signal: str | None = None
        self.at_once = at_once
        self._previous = {}

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        first = not self.requested
        if first:  # noted before any raise: an interrupt that C code discards still stops the loop after its step
            self.requested, self.signal = True, name
        if not first or self.at_once:
            exc = KeyboardInterrupt(f"interrupted ({self.signal})")
            exc.signal = self.signal  # a SLURM task requeues itself on SIGUSR2
            raise exc

    def poll(self) -> bool:
        """The loop's question after each step: stop now?"""
        self.at_once = False
        return self.requested

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


@contextlib.contextmanager
def signals_deferred():
    """SIGINT/SIGTERM/SIGUSR2 wait until the block is done (a record cut short is a record lost), then
    are delivered as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received:
            signal.raise_signal(received[0])


def evaluate_splits(model, data: PreparedData, cfg: RunConfig, runtime: Runtime, ctx: Dist = Dist(),
                    splits: tuple[str, ...] = ("val", "holdout"), tokens: int | None = None) -> dict[str, EvalResult]:
    """Bits per byte of a text family's run (muonlab.eval.text.evaluate_text_splits)."""
    return evaluate_text_splits(model, data, cfg, runtime, ctx, splits, tokens)


def resume_training(run_dir: str | Path, log: Callable[[str], None] = print, fallback: bool = False,
                    quiet: bool | None = None) -> "RunResult":
    """Continue an interrupted run in its own directory from its newest valid checkpoint."""
    run_dir = Path(run_dir).resolve()  # `--resume .` names the run by its folder
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.json)")
    saved = read_config_values(run_dir / "config.json")
    if is_legacy(saved):
        raise UsageError(f"{run_dir} was written by an older muonlab (config format 1): `muonlab report` reads "
                         "it, but it cannot be resumed")
    _refuse_finished(run_dir)
    load_plugins(saved.get("record", {}).get("plugins", ""))  # before resolving: they register methods
    cfg = load_config_file(run_dir / "config.json", values=saved)
    if quiet is not None:
        cfg.record.quiet = quiet
    # the run lives where it is, whatever runs_dir said where it was created
    cfg.record.runs_dir, cfg.record.run_name = str(run_dir.parent), run_dir.name
    return run_training(cfg, log=log, resume=(run_dir, fallback))


def _refuse_finished(run_dir: Path) -> None:
    """A run that finished has nothing to resume: its summary says ok and its newest checkpoint is whole and at
    its last step, so a resume would train nothing, evaluate it again and add a second `ok` line for one run.
    (One whose later checkpoints were removed, or whose last one is damaged, resumes from an earlier one.)"""
    from muonlab.train.checkpoint import list_checkpoints, verify_checkpoint  # noqa: PLC0415

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        status, steps = summary.get("status"), int(summary.get("num_steps"))
    except (OSError, ValueError, AttributeError, TypeError):
        return
    newest = list_checkpoints(run_dir)[-1:]
    if status == "ok" and newest and int(newest[0].stem.split("-")[1]) == steps and verify_checkpoint(newest[0]) is None:
        raise UsageError(f"{run_dir.name} finished (ok): there is nothing to resume; `muonlab eval {run_dir}` "
                         "re-scores its weights")


class WeightsNotWritten(MuonlabError):
    """The run trained and evaluated, but its final weights could not be written (a full disk): its scores
    and its final checkpoint stand, and `--resume` writes the weights from that checkpoint."""

    def __init__(self, cause: Exception, metrics: dict, run_dir: Path):
        super().__init__(f"writing the final weights failed ({cause.__class__.__name__}: {cause}); the run trained "
                         "and evaluated (its scores are in its ledger line): free the space and `muonlab train "
                         f"--resume {run_dir}` writes them from its final checkpoint, bit for bit")
        self.metrics = metrics


def cpu_presets() -> list[str]:
    """The presets made for the CPU (they pin runtime.device to cpu)."""
    from muonlab.config import all_presets

    return [name for name, values in all_presets().items() if values.get("runtime.device") == "cpu"]


def training_device(cfg: RunConfig) -> torch.device:
    """The device a run trains on. `auto` means a GPU (CUDA, then MPS): the presets made for a GPU leave
    the device at auto, so on a machine without one they are refused, never silently run for hours on
    the CPU; `--device cpu` insists."""
    device = detect_device(cfg.runtime.device)
    if cfg.runtime.device == "auto" and device.type == "cpu":
        raise UsageError(f"this run is made for a GPU (device auto) and this machine has none: add --device cpu "
                         f"to run it on the CPU anyway, or use a CPU preset ({', '.join(cpu_presets())})")
    return device


def run_training(cfg: RunConfig, log: Callable[[str], None] = print, data: PreparedData | None = None,
                 resume: tuple[Path, bool] | None = None) -> RunResult:
    """Train and evaluate one run; raises on failure after recording it."""
    cfg.validate()
    cfg.check_plugin_code("resuming it" if resume is not None else "this run")
    for module in get_family(cfg.family).requires(cfg):  # a missing package: one line, nothing written
        require(module, f"the {cfg.family} family's {getattr(cfg.model, 'preset', 'model')}")
    t_start = time.time()
    device = training_device(cfg)
    use_expandable_segments(device)  # before the first CUDA allocation (init_from_env's)
    if device.type == "cpu":
        retain_freed_host_memory()  # a step's large tensors reuse the last step's pages (muonlab.host_memory)
    ctx, device = init_from_env(device)
    if cfg.runtime.collectives == "always" and not ctx.active:
        shutdown(ctx)
        raise UsageError("--collectives always runs the N-rank optimizer step in a torchrun world (torchrun "
                         "--nproc_per_node 1 -m muonlab train ...); this run has no process group")
    try:
        return _run(cfg, log if ctx.is_main else (lambda _: None), data, resume, ctx, device, t_start)
    finally:
        shutdown(ctx)


def _run(cfg, log, data, resume, ctx: Dist, device, t_start) -> RunResult:
    runtime = Runtime(device, resolve_precision(cfg.runtime.precision, device))
    if getattr(cfg.model, "attn_backend", None):  # refused before anything is written, not at the model's build
        from muonlab.model.attention import check_backend_runs_on  # noqa: PLC0415

        check_backend_runs_on(cfg.model.attn_backend, device)
    cfg.train.accum_steps_per_rank(ctx.world_size)  # the global batch must split evenly over the ranks
    checkpoint = None
    if resume is not None:
        run = RunDir(Path(resume[0]))
        ckpt_path, checkpoint = latest_checkpoint(run.path, fallback=resume[1], log=log)
        if checkpoint.get("config_hash") != cfg.config_hash():
            raise UsageError(f"checkpoint {ckpt_path} belongs to another configuration")
        if checkpoint.get("world_size", 1) != ctx.world_size:
            raise UsageError(f"checkpoint {ckpt_path} was written by {checkpoint.get('world_size', 1)} "
                             f"process(es); resume it with the same number, not {ctx.world_size} (the data "
                             "loaders' positions are per rank)")
        log(f"resuming {run.path.name} from {ckpt_path.name} (step {checkpoint['step']})")
    # a finished run must reach the ledger: refuse one it could not append to, and a run directory that
    # could not be made, before anything (every rank: each refuses alike, none waits on another)
    ledger.check_writable(ledger_path(cfg))
    if resume is None:
        check_new_run(cfg)
    if data is None:
        data = _prepare_data(cfg, log, ctx, runtime, None if resume is None else run, checkpoint)
    if resume is None:
        run_id = ctx.broadcast_object(new_run_id(cfg) if ctx.is_main else None)
        run = RunDir(runs_dir(cfg) / run_id)
    record = _run_record(cfg, run, ctx, runtime, data, checkpoint)  # before the directory: nothing between
    if resume is None and ctx.is_main:
        RunDir.create(cfg, run.path.name)
    run_id = run.path.name
    summary: dict = {"status": "failed", "run_id": run_id}
    try:
        summary, metrics = _train_and_evaluate(cfg, data, runtime, run, t_start, log, checkpoint, ctx, record)
        record.update(status="ok", metrics=metrics)
        return RunResult(run_id, run.path, "ok", summary, metrics)
    except Diverged as exc:
        summary = {"status": "diverged", "run_id": run_id, "diverged_step": exc.step, "loss": exc.loss}
        record.update(status="diverged", metrics={"diverged_step": exc.step, "loss": exc.loss},
                      error=str(exc))
        raise
    except BaseException as exc:
        summary = _stopped(record, exc, run)
        raise
    finally:
        if ctx.is_main:  # one run, one record, whatever the number of processes
            if record.get("status") == "ok":
                del record["phase"]  # where a run that did not finish stopped
            record["finished_at"] = time.strftime(ledger.STAMP_FORMAT)
            with signals_deferred():
                _record_outcome(run, summary, record, ledger_path(cfg), log)


def _run_record(cfg: RunConfig, run: RunDir, ctx: Dist, runtime: Runtime, data: PreparedData | None,
                checkpoint: dict | None) -> dict:
    """The ledger line as the run starts; its outcome is added when it ends. `phase` says what the run
    was doing (data, build, train, evaluate): an interrupted or failed line keeps it."""
    prov = provenance.collect(runtime.device, corpus_hash=None if data is None else data.corpus_hash,
                              tokenizer_hash=None if data is None else data.tokenizer_hash,
                              data_source=cfg.data.source)
    return dict(run_id=run.path.name, arm=cfg.arm, seed=cfg.seed, config_hash=cfg.config_hash(),
                protocol=cfg.protocol_id(), run_dir=str(run.path), config=cfg.to_dict(), provenance=prov,
                resumed_from_step=checkpoint["step"] if checkpoint else None,
                world_size=ctx.world_size,
                process_group=ctx.backend,  # "nccl" / "gloo" under torchrun (a world of one too), else None
                phase="data" if data is None else "build")


def _stopped(record: dict, exc: BaseException, run: RunDir) -> dict:
    """Mark the ledger line with how the run stopped short (interrupted: Ctrl-C, SIGTERM, a preemption,
    or submitit's exit before it requeues a task; failed: any other error); the run's summary."""
    interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit))
    status = "interrupted" if interrupted else "failed"
    message = (str(exc) or "interrupted") if interrupted else (str(exc) or exc.__class__.__name__)
    # the checkpoint the loop wrote on the way out, else (a second signal) the newest complete one
    unsaved = isinstance(exc, WeightsNotWritten)  # trained and evaluated: its final checkpoint finishes it
    ckpt = getattr(exc, "checkpoint", None) or (newest_complete_checkpoint(run.path) if interrupted or unsaved
                                                else None)
    ckpt = None if ckpt is None else str(ckpt)
    record.update(status=status, metrics=exc.metrics if unsaved else {}, error=message, resumable=ckpt is not None,
                  checkpoint=ckpt,
                  error_kind="oom" if isinstance(exc, OutOfMemory) else exc.__class__.__name__,
                  traceback=None if interrupted else traceback.format_exc(limit=8))
    return {"status": status, "run_id": record["run_id"], "error": message, "checkpoint": ckpt,
            "phase": record["phase"]}


def _prepare_data(cfg: RunConfig, log, ctx: Dist, runtime: Runtime, run: RunDir | None,
                  checkpoint: dict | None) -> PreparedData:
    """The family's data. A refusal or a failure here writes nothing (the data is checked before the run
    exists), but a signal is a run interrupted as it began: it gets its directory (a resumed run keeps
    its own) and an `interrupted` line with phase `data`, like an interruption at any later phase."""
    try:
        data = get_family(cfg.family).prepare_data(cfg, log=log)
        stop_if_requested()  # a stop taken in the data phase whose interrupt C code discarded (muonlab.stop_request)
        return data
    except (KeyboardInterrupt, SystemExit) as exc:
        if ctx.is_main:
            with signals_deferred():
                run = run or RunDir.create(cfg, new_run_id(cfg))
                record = _run_record(cfg, run, ctx, runtime, None, checkpoint)  # phase data
                summary = _stopped(record, exc, run)
                record["finished_at"] = time.strftime(ledger.STAMP_FORMAT)
                _record_outcome(run, summary, record, ledger_path(cfg), log)
        raise


def _record_outcome(run: RunDir, summary: dict, record: dict, ledger_file: Path, log) -> None:
    """The failure summary (an ok run wrote its own) and the ledger line: the line is the record
    of truth, so a summary that cannot be written (a full disk) is a warning, and a line that
    cannot be appended leaves a summary that says failed."""
    if summary.get("status") != "ok":
        try:
            run.write_summary(summary)
        except OSError as exc:
            log(f"warning: the failure summary was not written: {exc}")
    try:
        ledger.append_record(ledger_file, record)
    except MuonlabError as exc:
        # the run keeps its outcome; its line waits in the run directory for `muonlab ledger recover`
        with contextlib.suppress(OSError):
            write_json(run.path / ledger.PENDING, ledger.strict_json(record))
            run.write_summary({**summary, "ledger_error": str(exc)})
        raise MuonlabError(f"{exc}; the run's line is kept in {run.path / ledger.PENDING}: `muonlab ledger recover "
                           f"{run.path.parent}` appends it") from None


def _train_and_evaluate(cfg, data, runtime, run, t_start, log, checkpoint, ctx: Dist, record: dict):
    """Build, train, evaluate; `record` (the ledger line) learns the attention kernel as soon
    as it is chosen, so a run that fails later still says which one it ran on."""
    torch.manual_seed(cfg.seed)
    if runtime.device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed)
        torch.cuda.reset_peak_memory_stats(runtime.device)
        torch.set_float32_matmul_precision("high")
    compile_on = use_compile(cfg, runtime)
    model = build_model(cfg, data.vocab_size, runtime)
    family = get_family(cfg.family)
    attention = record["attention_backend"] = family.attention_backend(model)  # "fa3" | "sdpa"
    counts = model.num_scaling_params()
    flops_per_token = model.estimate_flops()
    optimizer = build_optimizer(model, cfg, compile_step=compile_on, distributed=ctx.active)
    record["optimizer_groups"] = optimizer_groups(optimizer)  # as built (before any schedule moves it)
    train_model = torch.compile(model, dynamic=False) if compile_on else model
    loader = data.loader(cfg.train.device_batch_size, cfg.train.sequence_len, "train", device=runtime.device,
                         rank=ctx.rank, world_size=ctx.world_size, seed=cfg.seed)
    if cfg.data.prefetch_batches > 0:  # tokenizing and packing off the step's critical path (same batches)
        loader = PrefetchLoader(loader, cfg.data.prefetch_batches)
    state, pending = None, None
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])  # the full layout; each rank keeps its shard
        loader.load_state_dict(checkpoint["loader"][ctx.rank])
        set_rng_state(checkpoint["rng"], runtime.device)
        state, pending = LoopState(**checkpoint["loop"]), tuple(checkpoint["pending"][ctx.rank])
        if ctx.is_main:
            run.truncate_metrics(state.step)  # steps after the checkpoint are redone
    log(f"run {run.path.name}: {counts['total']:,} params, {cfg.describe_model()}, "
        f"{ctx.world_size} process(es) x {cfg.train.accum_steps_per_rank(ctx.world_size)} micro-steps x "
        f"{cfg.train.tokens_per_micro_step:,} tokens, device {runtime.device}, "
        f"precision {runtime.precision}, attention {attention}, compile {compile_on}")
    saved = cfg.to_dict()
    tags = [f"family:{cfg.family}", f"seed:{cfg.seed}", *([f"preset:{p}"] if (p := preset_of(saved)) else []),
            *([f"protocol:{saved['protocol']}"] if saved.get("protocol") else [])]
    sinks = SinkGroup(parse_sinks(cfg.record.sinks) if ctx.is_main else [], run.path.name, run.path,
                      saved, cfg.record.sink_project, group=cfg.arm, tags=tags)

    def save(loop_state: LoopState, next_batch: tuple) -> str | None:
        """Collective: every rank calls it; rank 0 writes one world-size-tagged checkpoint."""
        x, y, epoch = next_batch
        full_optimizer = optimizer.full_state_dict() if ctx.active else optimizer.state_dict()
        loaders = ctx.gather_objects(loader.state_dict())
        pendings = ctx.gather_objects((x.cpu(), y.cpu(), epoch))
        if not ctx.is_main:
            return None
        payload = dict(model=model.state_dict(), optimizer=full_optimizer, loader=loaders, pending=pendings,
                       loop=loop_state.to_dict(), rng=rng_state(runtime.device), config_hash=cfg.config_hash(),
                       world_size=ctx.world_size)
        return str(save_checkpoint(run.path, loop_state.step, payload, keep=cfg.record.checkpoint_keep))

    def on_step(rec: dict) -> None:
        write_metrics(rec)
        sinks.log_step(rec)

    evaluate = family.evaluate or evaluate_splits

    def periodic_eval() -> dict:
        """The val split after a step (every rank: distributed evaluation is collective), on the
        model as it trains (compiled where the run compiles)."""
        val = evaluate(train_model, data, cfg, runtime, ctx, splits=("val",),
                       tokens=cfg.train.eval_every_tokens)["val"]
        return {f"val_{k}": v for k, v in val.metrics().items() if k not in COUNT_KEYS}

    t_train = time.time()
    metrics_path = run.path / "metrics.jsonl" if ctx.is_main else Path(os.devnull)
    record["phase"] = "train"  # the first step compiles the model where the run compiles
    # the signals' handler first: once metrics.jsonl exists, a signal is the loop's (a test waits for the file)
    with StopSignals(at_once=not ctx.active) as stop, metrics_writer(metrics_path) as write_metrics:
        try:
            state = train_loop(cfg, train_model, optimizer, loader, runtime, flops_per_token, on_step=on_step,
                               state=state, pending=pending, checkpoint=save, stop_requested=stop.poll,
                               dist=ctx, periodic_eval=periodic_eval if cfg.train.eval_every > 0 else None)
        except RunInterrupted as exc:  # say by what: a SLURM task requeues itself on SIGUSR2
            if stop.signal is not None:
                exc.signal = stop.signal
                exc.args = (f"{exc} ({stop.signal})",)
            raise
        finally:  # the prefetching thread and the tokenizing processes end with the training
            if hasattr(loader, "close"):
                loader.close()
    record["phase"] = "evaluate"
    log("evaluating the trained weights")  # a long final evaluation is not mistaken for a hang
    evals = evaluate(train_model, data, cfg, runtime, ctx)  # compiled, as upstream scores it
    timed_steps = state.step - min(cfg.train.untimed_steps, state.step)
    mfu = mfu_percent(flops_per_token, cfg.train.total_batch_size * timed_steps, state.training_seconds,
                      peak_flops(runtime.device), ctx.world_size)
    total_tokens = state.step * cfg.train.total_batch_size
    scores = {f"{split}_{k}": v for split, result in evals.items() for k, v in result.metrics().items()}
    final = family.final_metrics(model)  # e.g. seed 004 Table 3's tied-table and matrix RMS
    scores.update(final)
    if ctx.is_main:  # what a reader needs besides config.json to rebuild the model (muonlab.load_run)
        record["phase"] = "save"
        try:
            run.save_weights(model, {"family": cfg.family, "vocab_size": str(data.vocab_size),
                                     "config_hash": cfg.config_hash()})
        except Exception as exc:  # a full disk (torch.save turns its OSError into a RuntimeError)
            raise WeightsNotWritten(exc, {**scores, "steps": state.step, "tokens": total_tokens}, run.path) from exc
    summary = {
        "val_bpb": scores.get("val_bpb"),
        "holdout_bpb": scores.get("holdout_bpb"),
        "training_seconds": state.training_seconds,
        "total_seconds": time.time() - t_start,
        "peak_vram_mb": peak_memory_mb(runtime.device),
        "mfu_percent": mfu,
        "total_tokens_M": total_tokens / 1e6,
        "num_steps": state.step,
        "num_params_M": counts["total"] / 1e6,  # the backbone (seed 002's result.json num_params)
        "depth": family.depth(cfg),
        # the family's own (format_summary: between depth and status): its metric (seed 004: validation
        # loss, perplexity, bits per dimension), then its final figures
        **{k: scores[k] for k in family.summary_metrics if k in scores}, **final,
        "status": "ok",
        "run_id": run.path.name,
        "startup_seconds": t_train - t_start,
        "tokens_per_second": (cfg.train.total_batch_size * timed_steps / state.training_seconds
                              if state.training_seconds > 0 else math.nan),
        "final_train_loss": state.smooth_loss,
        "entropy_bpb": data.entropy_bits_per_byte,
        "attention_backend": attention,
        "optimizer_groups": record["optimizer_groups"],
        # what peak_vram_mb (upstream's key) measured: the accelerator's allocator, or on the CPU the process
        "peak_memory_kind": "process" if runtime.device.type == "cpu" else "device",
    }
    if ctx.is_main:
        run.write_summary(summary)
        # the ledger line carries the periodic evaluations: reports compare at a step (report --at-step)
        record["evals"] = periodic_evals(run.path / "metrics.jsonl", cfg.train.total_batch_size)
    sinks.close(summary)
    metrics = {
        **scores,
        "peak_memory_mb": summary["peak_vram_mb"], "training_seconds": state.training_seconds,
        "total_seconds": summary["total_seconds"], "steps": state.step, "tokens": total_tokens,
        "tokens_per_second": summary["tokens_per_second"], "mfu_percent": mfu,
        "num_params": counts["total"], "param_counts": counts, "flops_per_token": flops_per_token,
        "final_train_loss": state.smooth_loss, "entropy_bpb": data.entropy_bits_per_byte,
    }
    return summary, metrics
