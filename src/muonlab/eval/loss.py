"""Loss-based metrics of seed 004's families: validation loss (mean nats per target token),
perplexity, and for ImageGPT bits per dimension and the top-half completion loss.

Seed 004 scores every setting by its validation cross-entropy (Table 1): PPL = exp(loss), and
for RGB554 images bits/dim = loss / (3 ln 2) (three colour channels per token), bits/token =
loss / ln 2, and the top-half completion NLL = the mean loss of tokens T/2 .. T-1 given the
true tokens before them (App. J.7, Table 23). The mean here is weighted by target count (the
Hugging Face and T5 runners'); with equal, full batches (drop_last, as every loader here) it
equals the NanoGPT runner's mean of per-batch means exactly. Sums are float64 on the device.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

LN2 = math.log(2.0)


@dataclass
class LossResult:
    """One split's score: `ce` (mean nats per scored target), `ppl`, counts, and the family's extras."""

    ce: float
    nats: float
    tokens: int
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def ppl(self) -> float:
        return math.exp(min(self.ce, 700.0))

    def metrics(self) -> dict[str, float | int]:
        """Ledger keys without the split prefix: ce, ppl, tokens and the extras."""
        return {"ce": self.ce, "ppl": self.ppl, "tokens": self.tokens, **self.extra}


@torch.no_grad()
def evaluate_loss(score: Callable[[tuple], torch.Tensor], batches: Iterable[tuple],
                  autocast=contextlib.nullcontext, device: torch.device | str = "cpu", reduce=None,
                  completion_from: int | None = None) -> LossResult:
    """Mean nats per target over `batches`; `score(batch)` returns per-target nats [B, T] and every
    target counts (these loaders ignore none). `completion_from` adds the mean loss of positions
    >= it (ImageGPT's top half). `reduce` sums the float64 totals across processes."""
    device = torch.device(device)
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # nats, tokens, tail nats, tail tokens
    for batch in batches:
        with autocast():
            per_token = score(batch)
        per_token = per_token.double()
        sums[0] += per_token.sum()
        sums[1] += per_token.numel()
        if completion_from is not None:
            tail = per_token[:, completion_from:]
            sums[2] += tail.sum()
            sums[3] += tail.numel()
    if reduce is not None:
        reduce(sums)
    nats, tokens = sums[0].item(), int(sums[1].item())
    if tokens == 0:
        raise ValueError("evaluation saw no target tokens: the split is empty")
    extra = {}
    if completion_from is not None and sums[3].item() > 0:
        extra["completion_nll"] = sums[2].item() / sums[3].item()
    return LossResult(ce=nats / tokens, nats=nats, tokens=tokens, extra=extra)


def image_metrics(result: LossResult) -> LossResult:
    """Add seed 004's image metrics: bits/dim = ce / (3 ln 2), bits/token = ce / ln 2, and the
    completion loss in bits/dim (Table 23)."""
    result.extra["bpd"] = result.ce / (3 * LN2)
    result.extra["bits_per_token"] = result.ce / LN2
    if "completion_nll" in result.extra:
        result.extra["completion_bpd"] = result.extra["completion_nll"] / (3 * LN2)
    return result
