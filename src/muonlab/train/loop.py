"""The training loop of upstream autoresearch, with fixed-step or time-budget termination.

Per optimizer step: grad-accumulated micro-steps (each loss divided by the number of
micro-steps), the schedules applied to every group, one optimizer step, a fast-fail check on
the loss. The first `untimed_steps` steps (compilation, warm-up) are excluded from timing
and, for fixed-step runs, from progress (seed 002 §2.1). The loop's whole state is a
`LoopState`, so a run can be checkpointed after any step and resumed bit for bit.
"""

from __future__ import annotations

import gc
import math
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from muonlab.config import RunConfig
from muonlab.device import Runtime, mfu_percent, peak_flops, synchronize
from muonlab.errors import MuonlabError
from muonlab.families import get_family
from muonlab.optim.schedules import step_progress, time_progress
from muonlab.train.step_timer import StepTimer

EMA_BETA = 0.9


class Diverged(MuonlabError):
    """Training loss became NaN/Inf or exceeded the fast-fail threshold."""

    def __init__(self, step: int, loss: float):
        super().__init__(f"training diverged at step {step} (loss {loss})")
        self.step, self.loss = step, loss


class RunInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM arrived; the loop stopped after a finished step (and checkpointed it)."""

    def __init__(self, step: int, checkpoint: str | None):
        super().__init__(f"interrupted after step {step}")
        self.step, self.checkpoint = step, checkpoint
        self.signal: str | None = None  # the signal that asked for the stop (set by the run)


class OutOfMemory(MuonlabError):
    def __init__(self, step: int, cfg: RunConfig, device: torch.device):
        super().__init__(
            f"out of memory at step {step} on {device} with micro-batch {cfg.train.device_batch_size} x "
            f"{cfg.train.sequence_len} tokens ({cfg.describe_model()}); "
            "lower --device-batch-size (gradient accumulation keeps the total batch)")
        self.step = step


@dataclass
class LoopState:
    step: int = 0  # optimizer steps completed
    training_seconds: float = 0.0
    ema: float = 0.0  # un-debiased EMA of the training loss (upstream's logging)
    smooth_loss: float = math.nan
    last_loss: float = math.nan
    epoch: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def schedule_of(cfg: RunConfig):
    """The schedule the family's optimizer follows (LR multiplier, and Muon momentum/WD for MuonAdamW)."""
    return get_family(cfg.family).schedule(cfg)


def _format_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _finished(cfg: RunConfig, state: LoopState) -> bool:
    if cfg.train.num_steps is not None:
        return state.step >= cfg.train.num_steps
    return state.step > cfg.train.untimed_steps and state.training_seconds >= cfg.train.time_budget


Checkpointer = Callable[[LoopState, tuple], str]


def compiled_graphs() -> int:
    """The graphs dynamo has compiled in this process so far (every function, the optimizer's
    steps included)."""
    from torch._dynamo.utils import counters  # noqa: PLC0415 (only where something compiles)

    return int(counters["stats"]["unique_graphs"])


def train_loop(cfg: RunConfig, model, optimizer, loader, runtime: Runtime, flops_per_token: int,
               on_step: Callable[[dict], None] | None = None, state: LoopState | None = None,
               pending: tuple | None = None, checkpoint: Checkpointer | None = None,
               stop_requested: Callable[[], bool] = lambda: False, dist=None,
               periodic_eval: Callable[[], dict] | None = None) -> LoopState:
    """Run optimizer steps until done; resumable from (state, pending batch).

    `periodic_eval()` runs after every cfg.train.eval_every-th step, outside the step's timing,
    and its values join that step's record (so a resumed run redoes them with the step).

    `checkpoint(state, pending)` is called every cfg.record.checkpoint_every steps, after the first
    step that ends cfg.record.checkpoint_minutes of wall time after the last one, at the end, and
    when `stop_requested()` turns true (then RunInterrupted is raised). Raises Diverged on
    NaN/Inf or loss > cfg.train.max_loss, OutOfMemory when the device runs out of memory.
    """
    from muonlab.train.distributed import Dist

    dist = dist or Dist()
    family = get_family(cfg.family)
    trajectory = cfg.record.trajectory_step_set()
    # under torchrun only the optimizer holds the averaged gradient: it clips (DistAFMuon), or clipping is refused
    clip_here = cfg.train.grad_clip > 0 and not dist.active
    if cfg.train.grad_clip > 0 and dist.active and getattr(optimizer, "max_grad_norm", None) != cfg.train.grad_clip:
        raise MuonlabError("grad_clip under torchrun needs an optimizer that clips the averaged gradient "
                           "(the seed-004 families' AF-Muon and its baselines); this one does not")
    # the methods' hooks around the step (e.g. Over-Encoding visit counts, seed 002's step-0 controls)
    hooks = family.step_hooks(cfg, model)
    micro_hooks = [h.before_micro_step for h in hooks if hasattr(h, "before_micro_step")]
    before = [h.before_step for h in hooks if hasattr(h, "before_step")]
    after = [h.after_step for h in hooks if hasattr(h, "after_step")]
    schedule = schedule_of(cfg)
    compiled = hasattr(model, "_orig_mod")  # a torch.compile'd module
    accum = cfg.train.accum_steps_per_rank(dist.world_size)
    peak = peak_flops(runtime.device)
    state = state or LoopState()
    interactive = sys.stdout.isatty() and not cfg.record.quiet and dist.is_main
    x, y, state.epoch = pending if pending is not None else next(loader)
    recent: deque = deque(maxlen=ETA_WINDOW)
    mean_logged = cfg.train.loss_logged == "mean"
    every_s = 60 * cfg.record.checkpoint_minutes
    last_checkpoint = time.monotonic()
    x, y = x.to(runtime.device), y.to(runtime.device)
    timer = StepTimer(runtime.device)  # where each step's time goes (muonlab.train.step_timer)
    try:  # the GC is off after step 0 (below); whatever ends the loop turns it back on
        while not _finished(cfg, state):
            step = state.step
            synchronize(runtime.device)
            t0 = time.perf_counter()
            timer.start()
            data_wait = 0.0  # seconds the step waited for its next batch (0 when the loader keeps ahead)
            try:
                micro_losses = []
                for _ in range(accum):
                    for hook in micro_hooks:
                        hook(x)
                    with runtime.autocast():
                        loss = model(x, y)
                    micro_losses.append(loss.detach())
                    (loss / accum).backward()
                    t_data = time.perf_counter()
                    x, y, state.epoch = next(loader)
                    data_wait += time.perf_counter() - t_data
                if cfg.train.num_steps is not None:
                    progress = step_progress(step, cfg.train.num_steps, cfg.train.untimed_steps)
                else:
                    progress = time_progress(state.training_seconds, cfg.train.time_budget)
                values = schedule.apply(optimizer, step, progress)
                # the gradient norm (seed 004 Table 13) of the step's mean gradient, before any clip; under
                # torchrun only the optimizer holds the averaged gradient: it reports the norm (DistAFMuon)
                grad_norm = None
                if clip_here:  # seed 004: global gradient-norm clip before the step
                    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
                elif not dist.active:
                    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
                timer.mark("t_forward_backward")  # the micro-steps, their data waits and the gradient norm
                for hook in before:
                    hook(step, optimizer)
                optimizer.step()
                if grad_norm is None:
                    grad_norm = getattr(optimizer, "last_grad_norm", None)
                for hook in after:
                    hook(step, optimizer)
                model.zero_grad(set_to_none=True)
                timer.mark("t_optimizer")
                # upstream's fast-fail looks at the last micro-batch; the log shows it or the step's mean. One
                # device->host read a step for all three (tests/test_host_syncs.py pins it)
                logged = torch.stack(micro_losses).mean() if mean_logged else micro_losses[-1]
                read = [micro_losses[-1].float(), logged.float()]
                if isinstance(grad_norm, torch.Tensor):
                    read.append(grad_norm.detach().float().to(read[0].device))
                train_loss, logged_loss, *norm = torch.stack(read).tolist()
                grad_norm = norm[0] if norm else grad_norm
            except torch.OutOfMemoryError as exc:
                raise OutOfMemory(step, cfg, runtime.device) from exc
            stop_now = stop_requested()
            # wall time since the last checkpoint: a preempted run loses at most checkpoint_minutes
            due = every_s > 0 and time.monotonic() - last_checkpoint >= every_s
            if dist.active:  # every rank must take the same decision to stop, diverge, checkpoint or go on
                shared = torch.tensor([train_loss, float(stop_now), float(due), logged_loss], dtype=torch.float64,
                                      device=runtime.device)
                dist.all_reduce_(shared)
                train_loss, stop_now, due = shared[0].item() / dist.world_size, shared[1].item() > 0, shared[2].item() > 0
                logged_loss = shared[3].item() / dist.world_size
            if not math.isfinite(train_loss) or train_loss > cfg.train.max_loss:
                raise Diverged(step, train_loss)
            timer.mark("t_rest")  # the loss read, the stop and divergence checks
            synchronize(runtime.device)
            dt = time.perf_counter() - t0
            if step >= cfg.train.untimed_steps:
                state.training_seconds += dt

            state.ema = EMA_BETA * state.ema + (1 - EMA_BETA) * logged_loss
            state.smooth_loss = state.ema / (1 - EMA_BETA ** (step + 1))
            state.last_loss = logged_loss
            state.step = step + 1
            tok_per_sec = cfg.train.total_batch_size / dt
            mfu = mfu_percent(flops_per_token, cfg.train.total_batch_size, dt, peak, dist.world_size)
            record = dict(step=step, loss=logged_loss, smooth_loss=state.smooth_loss, progress=progress,
                          dt=dt, data_wait=data_wait, **timer.phases(), tok_per_sec=tok_per_sec, mfu=mfu,
                          epoch=state.epoch, **values)
            if grad_norm is not None:  # seed 004 Table 13's gradient norm (before the clip); not under torchrun
                record["grad_norm"] = grad_norm  # with an optimizer that does not report it (DistMuonAdamW)
            if compiled:  # a count that still grows after the first steps is a recompile
                record["compiled_graphs"] = compiled_graphs()
            if step in trajectory:
                record.update(family.trajectory(model))
            if periodic_eval is not None and state.step % cfg.train.eval_every == 0:
                record.update(periodic_eval())
            if on_step is not None and dist.is_main:
                on_step(record)
            recent.append(dt)
            if dist.is_main:
                _print_progress(cfg, state, record, interactive, recent)

            if step == 0:  # Python's GC causes long stalls; freeze the start-up garbage, as upstream
                gc.collect()
                gc.freeze()
                gc.disable()
            if checkpoint is not None:
                if stop_now:
                    raise RunInterrupted(state.step, checkpoint(state, (x, y, state.epoch)))
                periodic = due or (cfg.record.checkpoint_every > 0 and state.step % cfg.record.checkpoint_every == 0)
                if periodic or _finished(cfg, state):
                    checkpoint(state, (x, y, state.epoch))
                    last_checkpoint = time.monotonic()
            elif stop_now:
                raise RunInterrupted(state.step, None)
        if interactive:
            print()
    finally:
        gc.enable()
    return state


ETA_WINDOW = 20  # steps whose mean time gives the ETA (one step's time jumps with compiles and evaluations)


def _print_progress(cfg: RunConfig, state: LoopState, rec: dict, interactive: bool, recent: deque) -> None:
    if cfg.record.quiet or not (interactive or rec["step"] % cfg.record.log_every == 0):
        return
    if cfg.train.num_steps is not None:  # steps done of steps to do; the ETA from the recent steps' mean time
        done = state.step / cfg.train.num_steps
        eta = (cfg.train.num_steps - state.step) * (sum(recent) / len(recent))
    else:
        done = min(state.training_seconds / cfg.train.time_budget, 1.0)
        eta = cfg.train.time_budget - state.training_seconds
    mfu_text = f" | mfu {rec['mfu']:.1f}%" if rec["mfu"] is not None else ""
    line = (f"step {rec['step'] + 1:05d} ({100 * done:.1f}%) | loss {state.smooth_loss:.4f} | "
            f"lrm {rec['lrm']:.2f} | dt {rec['dt'] * 1000:.0f}ms | tok/s {rec['tok_per_sec']:,.0f}"
            f"{mfu_text} | epoch {state.epoch} | eta {_format_eta(eta)}")
    print("\r" + line + "   " if interactive else line, end="" if interactive else "\n", flush=True)
