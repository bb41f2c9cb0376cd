"""The run's own settings, which the training loop reads: batch and duration, the LR schedule's
shape, the runtime. They sit in the config layer (the loop above it reads them, nothing below does)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from muonlab.device import PRECISIONS
from muonlab.errors import UsageError
from muonlab.settings import (COUNT, FRACTION, NON_NEGATIVE, POSITIVE, POSITIVE_COUNT, TOKENS, Section,
                              setting)


@dataclass
class TrainingConfig(Section):
    """Batch, duration and evaluation (upstream train.py's names)."""

    sequence_len: int = setting(2048, "context length T: tokens per row", range=POSITIVE_COUNT)
    device_batch_size: int = setting(64, "rows per micro-step on one device", range=POSITIVE_COUNT)
    total_batch_size: int = setting(2**19, "tokens per optimizer step, over all micro-steps and processes",
                                    range=TOKENS)
    num_steps: int | None = setting(953, "fixed number of optimizer steps (seed 002 protocol); none: time_budget",
                                    range=POSITIVE_COUNT)
    time_budget: float | None = setting(None, "training-time budget in seconds (upstream); none: num_steps",
                                        range=POSITIVE)
    untimed_steps: int = setting(11, "compile/warm-up steps excluded from timing and progress", range=COUNT)
    grad_clip: float = setting(0.0, "global gradient-norm clip before each step (seed 004: 1.0); 0 = off",
                               range=NON_NEGATIVE)
    # what is logged, not what is trained (the divergence check always reads the last micro-batch, as upstream)
    loss_logged: Literal["last", "mean"] = setting(
        "last", "the training loss logged per step and its EMA: the last micro-batch's (upstream) or the mean over "
        "the step's micro-batches (seed 004's logs)", hashed=False)
    max_loss: float = setting(100.0, "fast fail above this training loss (upstream)", range=POSITIVE)
    eval_tokens: int = setting(40 * 2**19, "tokens scored per split (val and holdout)", range=TOKENS)
    eval_batch_size: int | None = setting(None, "rows per evaluation step; none: device_batch_size",
                                          range=POSITIVE_COUNT)
    # periodic evaluation reads the model and changes no trained number (tests/eval/test_periodic_eval.py):
    # it is outside the hash and the protocol (hashed at 0, as every run without it always was)
    eval_every: int = setting(0, "score the val split every N optimizer steps (val_bpb, val_ce in metrics.jsonl: "
                              "the validation curves of `muonlab report`); 0 = only at the end", hashed_as=0,
                                  range=COUNT)
    eval_every_tokens: int | None = setting(None, "tokens scored per periodic evaluation; none: eval_tokens",
                                            hashed=False, range=TOKENS)

    @property
    def tokens_per_micro_step(self) -> int:
        return self.device_batch_size * self.sequence_len

    def accum_steps_per_rank(self, world_size: int) -> int:
        """Micro-steps per rank when `world_size` processes share one global batch."""
        per_step = self.tokens_per_micro_step * world_size
        if self.total_batch_size % per_step != 0:
            raise UsageError(f"total_batch_size {self.total_batch_size} is not divisible by device_batch_size x "
                             f"sequence_len x world_size = {self.device_batch_size} x {self.sequence_len} x "
                             f"{world_size}")
        return self.total_batch_size // per_step

    def inactive(self) -> dict[str, str]:
        out = {"time_budget": "num_steps fixes the duration"} if self.num_steps is not None else {
            "num_steps": "time_budget fixes the duration"}
        if self.eval_every == 0:
            out["eval_every_tokens"] = "eval_every is 0 (no periodic evaluation)"
        return out

    def validate(self) -> None:  # each number's own range is its setting's (checked where it is set)
        if self.eval_tokens < self.sequence_len:  # evaluation scores whole sequences
            raise UsageError(f"eval_tokens ({self.eval_tokens}) must be at least sequence_len ({self.sequence_len})")
        if self.total_batch_size % self.tokens_per_micro_step != 0:
            raise UsageError(
                f"total_batch_size {self.total_batch_size} is not divisible by device_batch_size x "
                f"sequence_len = {self.device_batch_size} x {self.sequence_len} = {self.tokens_per_micro_step}")
        if (self.num_steps is None) == (self.time_budget is None):
            raise UsageError("give exactly one of num_steps and time_budget")
        if self.eval_every_tokens is not None and self.eval_every_tokens < self.sequence_len:
            raise UsageError(f"eval_every_tokens ({self.eval_every_tokens}) must be at least sequence_len "
                             f"({self.sequence_len})")


@dataclass
class ScheduleConfig(Section):
    """The shape of the LR multiplier over training progress (upstream: warmup, flat, linear warmdown)."""

    warmup_ratio: float = setting(0.0, "share of training spent warming the LR up", range=FRACTION)
    warmdown_ratio: float = setting(0.5, "share of training spent decaying the LR (0: constant LR, seed 004)",
                                    range=FRACTION)
    final_lr_frac: float = setting(0.0, "LR multiplier at the end of the warmdown", range=FRACTION)

    def inactive(self) -> dict[str, str]:
        return {"final_lr_frac": "warmdown_ratio is 0 (constant LR)"} if self.warmdown_ratio == 0 else {}

    def validate(self) -> None:
        if not (0 <= self.warmup_ratio <= 1 and 0 <= self.warmdown_ratio <= 1
                and self.warmup_ratio + self.warmdown_ratio <= 1):
            raise UsageError("need 0 <= warmup_ratio, 0 <= warmdown_ratio, warmup_ratio + warmdown_ratio <= 1")


@dataclass
class RuntimeConfig(Section):
    """Where and how the numbers are computed."""

    device: str = setting("auto", "auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps")
    precision: Literal[PRECISIONS] = setting("auto", "auto (bf16 autocast on CUDA, fp32 elsewhere), fp32 or bf16")
    compile: Literal["auto", "on", "off"] = setting("auto", "torch.compile the model and optimizer step "
                                                    "(auto: on CUDA only)")
    collectives: Literal["auto", "always"] = setting(
        "auto", "under torchrun: auto (a world of one steps as one process) or always (a world of one runs the "
        "N-rank optimizer step, its reduce_scatter, all_gather and all_reduce, as the GPU check does; the same "
        "numbers)", hashed=False)
