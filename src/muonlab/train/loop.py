"""The training loop of upstream autoresearch, with fixed-step or time-budget termination.

Per optimizer step: grad-accumulated micro-steps (each loss divided by the number of
micro-steps), the schedules applied to every group, one optimizer step, a fast-fail check on
the loss. The first `untimed_steps` steps (compilation, warm-up) are excluded from timing
and, for fixed-step runs, from progress (seed 002 §4).
"""

from __future__ import annotations

import gc
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from muonlab.config import TrainConfig
from muonlab.device import Runtime, peak_flops, synchronize
from muonlab.errors import MuonlabError
from muonlab.optim.schedules import Schedule, step_progress, time_progress


class Diverged(MuonlabError):
    """Training loss became NaN/Inf or exceeded the fast-fail threshold."""

    def __init__(self, step: int, loss: float):
        super().__init__(f"training diverged at step {step} (loss {loss})")
        self.step, self.loss = step, loss


@dataclass
class LoopStats:
    steps: int = 0
    training_seconds: float = 0.0
    last_loss: float = math.nan
    smooth_loss: float = math.nan
    epoch: int = 1
    history: list[dict] = field(default_factory=list)


def schedule_of(cfg: TrainConfig) -> Schedule:
    return Schedule(warmup_ratio=cfg.warmup_ratio, warmdown_ratio=cfg.warmdown_ratio,
                    final_lr_frac=cfg.final_lr_frac, weight_decay=cfg.weight_decay,
                    momentum_start=cfg.muon_momentum_start, momentum_end=cfg.muon_momentum_end,
                    momentum_warmup_steps=cfg.muon_momentum_warmup_steps)


def _format_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def train_loop(cfg: TrainConfig, model, optimizer, loader, runtime: Runtime, flops_per_token: int,
               on_step: Callable[[dict], None] | None = None) -> LoopStats:
    """Run the optimizer steps; raises Diverged on NaN/Inf or loss > cfg.max_loss."""
    schedule = schedule_of(cfg)
    accum = cfg.grad_accum_steps
    peak = peak_flops(runtime.device)
    stats = LoopStats()
    ema_beta, smooth = 0.9, 0.0
    interactive = sys.stdout.isatty() and not cfg.quiet
    x, y, stats.epoch = next(loader)
    step = 0
    while True:
        synchronize(runtime.device)
        t0 = time.perf_counter()
        micro_losses = []
        for _ in range(accum):
            with runtime.autocast():
                loss = model(x, y)
            micro_losses.append(loss.detach())
            (loss / accum).backward()
            x, y, stats.epoch = next(loader)
        if cfg.num_steps is not None:
            progress = step_progress(step, cfg.num_steps, cfg.untimed_steps)
        else:
            progress = time_progress(stats.training_seconds, cfg.time_budget)
        values = schedule.apply(optimizer, step, progress)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        train_loss = micro_losses[-1].item()  # upstream's fast-fail looks at the last micro-batch
        if not math.isfinite(train_loss) or train_loss > cfg.max_loss:
            raise Diverged(step, train_loss)
        synchronize(runtime.device)
        dt = time.perf_counter() - t0
        if step >= cfg.untimed_steps:
            stats.training_seconds += dt

        smooth = ema_beta * smooth + (1 - ema_beta) * train_loss
        stats.smooth_loss = smooth / (1 - ema_beta ** (step + 1))
        stats.last_loss = train_loss
        tok_per_sec = cfg.total_batch_size / dt
        mfu = 100 * flops_per_token * cfg.total_batch_size / dt / peak if peak else None
        record = dict(step=step, loss=train_loss, smooth_loss=stats.smooth_loss, progress=progress,
                      dt=dt, tok_per_sec=tok_per_sec, mfu=mfu, epoch=stats.epoch, **values)
        if on_step is not None:
            on_step(record)

        if cfg.num_steps is not None:
            eta = (cfg.num_steps - step - 1) * dt
        else:
            eta = cfg.time_budget - stats.training_seconds
        if not cfg.quiet and (interactive or step % cfg.log_every == 0):
            mfu_text = f" | mfu {mfu:.1f}%" if mfu is not None else ""
            line = (f"step {step:05d} ({100 * progress:.1f}%) | loss {stats.smooth_loss:.4f} | "
                    f"lrm {values['lrm']:.2f} | dt {dt * 1000:.0f}ms | tok/s {tok_per_sec:,.0f}"
                    f"{mfu_text} | epoch {stats.epoch} | eta {_format_eta(eta)}")
            print("\r" + line + "   " if interactive else line, end="" if interactive else "\n", flush=True)

        if step == 0:  # Python's GC causes long stalls; freeze the start-up garbage, as upstream
            gc.collect()
            gc.freeze()
            gc.disable()
        step += 1
        stats.steps = step
        if cfg.num_steps is not None and step >= cfg.num_steps:
            break
        if cfg.time_budget is not None and step > cfg.untimed_steps and stats.training_seconds >= cfg.time_budget:
            break
    if interactive:
        print()
    gc.enable()
    return stats
