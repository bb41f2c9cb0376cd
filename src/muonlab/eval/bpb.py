"""Bits per byte (BPB), the tokenizer-independent metric of upstream autoresearch.

BPB = sum of per-token cross-entropy (nats) / (ln 2 * sum of target byte lengths), where a
token's byte length is that of its UTF-8 text. Special tokens have byte length 0 and are
left out of both sums. Sums are kept in float64 on the device to avoid a sync per batch.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from typing import Iterable

import torch


@dataclass
class EvalResult:
    bpb: float
    ce: float  # mean nats per scored token
    ppl: float
    nats: float
    bytes: int
    tokens: int  # scored tokens (non-special targets)
    extra: dict[str, float] = field(default_factory=dict)  # a family's extras (e.g. MoE router statistics)

    def to_dict(self) -> dict:
        return asdict(self)

    def metrics(self) -> dict[str, float | int]:
        """Ledger keys without the split prefix (val_bpb, val_ce, ... once prefixed)."""
        return {"bpb": self.bpb, "ce": self.ce, "ppl": self.ppl, "tokens": self.tokens, "bytes": self.bytes,
                **self.extra}


@torch.no_grad()
def evaluate_bpb(model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], token_bytes: torch.Tensor,
                 autocast=contextlib.nullcontext, device: torch.device | None = None,
                 reduce=None) -> EvalResult:
    """Score every (x, y) batch; `token_bytes[id]` is the byte length of token id (0 = special).

    `reduce(tensor)` sums a tensor across processes in place (distributed eval: each rank
    scores a share of the batches; the sums of nats, bytes and tokens are exact to reduce).
    """
    device = device or token_bytes.device
    token_bytes = token_bytes.to(device)
    total_nats = torch.zeros((), dtype=torch.float64, device=device)
    total_bytes = torch.zeros((), dtype=torch.int64, device=device)
    total_tokens = torch.zeros((), dtype=torch.int64, device=device)
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast():
            loss = model(x, y, reduction="none").view(-1)
        nbytes = token_bytes[y.view(-1)]
        mask = nbytes > 0
        total_nats += torch.where(mask, loss.double(), 0.0).sum()  # not loss * mask: inf * 0 is NaN
        total_bytes += nbytes.sum()
        total_tokens += mask.sum()
    if reduce is not None:
        counts = torch.stack([total_bytes, total_tokens])
        reduce(total_nats)
        reduce(counts)
        total_bytes, total_tokens = counts[0], counts[1]
    nats, nbytes, ntok = total_nats.item(), int(total_bytes.item()), int(total_tokens.item())
    if nbytes == 0:
        raise ValueError("evaluation saw no bytes: the split is empty")
    ce = nats / max(ntok, 1)
    return EvalResult(bpb=nats / (math.log(2) * nbytes), ce=ce, ppl=math.exp(min(ce, 700.0)),
                      nats=nats, bytes=nbytes, tokens=ntok)
