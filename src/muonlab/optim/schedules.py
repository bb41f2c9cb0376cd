"""Training schedules of upstream autoresearch, plus the fixed-step progress of seed paper 002.

Progress p in [0, 1] drives the LR multiplier and the weight-decay decay. Upstream measures
it in training seconds over a time budget; for fixed-step runs seed 002 (§2.1) uses
p_t = min(max(step - 11, 0) / (N - 11), 1), skipping the 11 untimed warm-up steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WD_SCHEDULES = ("linear", "cosine")


def step_progress(step: int, num_steps: int, untimed_steps: int = 11) -> float:
    """Fixed-step progress: 0 through the untimed steps, then linear to 1 at the last step + 1."""
    span = num_steps - untimed_steps
    if span <= 0:
        return 1.0 if step >= untimed_steps else 0.0
    return min(max(step - untimed_steps, 0) / span, 1.0)


def time_progress(training_seconds: float, time_budget: float) -> float:
    """Upstream's time-based progress."""
    return min(training_seconds / time_budget, 1.0)


@dataclass(frozen=True)
class Schedule:
    """LR multiplier (warmup, flat, linear warmdown), Muon momentum warmup, linear WD decay.

    Seed 002 options (§2.1 Tier 1, §4.4), all off by default:
    - `momentum_cooldown`: in the warmdown the Nesterov momentum anneals back,
      beta = min(ramp(step), start + (end - start) * lrm), i.e. 0.95 -> 0.85 as lrm -> 0, computed
      from the unscaled lrm (the min() form, unstated in seed 002 §2.1; equal to ramp-then-cooldown when the ramp ends first).
    - `wd_schedule="cosine"`: wd = wd0 * (1 + cos(pi p)) / 2 instead of wd0 * (1 - p). The paper
      gives no formula; this is our choice (seed 002 §2.1 names only "cosine weight decay"), endpoints equal to linear.
    - `lr_scale` k: every group's LR x k and the Muon weight decay x 1/k (seed 002 `lr141`, k = sqrt 2),
      momentum unchanged.
    """

    warmup_ratio: float = 0.0
    warmdown_ratio: float = 0.5
    final_lr_frac: float = 0.0
    weight_decay: float = 0.2
    momentum_start: float = 0.85
    momentum_end: float = 0.95
    momentum_warmup_steps: int = 300
    momentum_cooldown: bool = False
    wd_schedule: str = "linear"
    lr_scale: float = 1.0

    def lr_multiplier(self, progress: float) -> float:
        if progress < self.warmup_ratio:
            return progress / self.warmup_ratio if self.warmup_ratio > 0 else 1.0
        if progress < 1.0 - self.warmdown_ratio or self.warmdown_ratio == 0:  # 0: constant LR (seed 004)
            return 1.0
        cooldown = (1.0 - progress) / self.warmdown_ratio
        return cooldown * 1.0 + (1 - cooldown) * self.final_lr_frac

    def muon_momentum(self, step: int, lrm: float = 1.0) -> float:
        frac = min(step / self.momentum_warmup_steps, 1) if self.momentum_warmup_steps > 0 else 1.0
        ramp = (1 - frac) * self.momentum_start + frac * self.momentum_end
        if self.momentum_cooldown:
            return min(ramp, self.momentum_start + (self.momentum_end - self.momentum_start) * lrm)
        return ramp

    def muon_weight_decay(self, progress: float) -> float:
        if self.wd_schedule == "cosine":
            decay = 0.5 * (1 + math.cos(math.pi * progress))
        else:
            decay = 1 - progress
        return self.weight_decay * decay / self.lr_scale

    def apply(self, optimizer, step: int, progress: float) -> dict[str, float]:
        """Set every group's LR (initial_lr x multiplier) and the Muon momentum / WD."""
        lrm = self.lr_multiplier(progress)
        values = dict(lrm=lrm, muon_momentum=self.muon_momentum(step, lrm),
                      muon_weight_decay=self.muon_weight_decay(progress))
        set_schedule_values(optimizer, lrm * self.lr_scale, values["muon_momentum"], values["muon_weight_decay"])
        return values


def set_schedule_values(optimizer, lrm: float, muon_momentum: float, muon_weight_decay: float) -> None:
    """Apply one step's schedule to the groups, exactly as upstream's training loop does."""
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * lrm
        if group.get("kind") == "muon":  # AF-Muon groups carry a "role" instead and keep their momentum
            group["momentum"] = muon_momentum
            group["weight_decay"] = muon_weight_decay
