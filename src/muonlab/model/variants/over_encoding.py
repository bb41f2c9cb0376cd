"""Hashed n-gram Over-Encoding (OE) input tables.

Seed paper 002 §2.1 Family A "Moment-Free Hashed N-Gram Input Tables (Over-Encoding)"
(hash, tables, visit counts), §3 (FLOPs, memory, accounting).

k(n-1) zero-initialised bf16 tables E_j of m + 2j rows and width d / (k(n-1)); table j serves
n-gram order i = 2 + j // k. With the sentinel V padding only the row start,
    prev_r[b, t] = idx[b, t - r] if t >= r else V        (F.pad(idx, (r, 0), value=V)[:, :T])
    id^(2) = x + (V+1) prev_1,   id^(i) = id^(i-1) + (V+1)^(i-1) prev_(i-1),   h_j = id^(i) mod (m+2j)
and the embedding is cat_j E_j[h_j] (B x T x d), added by the caller to wte(idx) before the
first RMSNorm. n-grams cross document boundaries inside packed rows, as in the paper.

Choices:
- All index arithmetic is int64; the constructor rejects (V+1)^n > 2^63 - 1 (key overflow).
  Token ids are assumed to lie in [0, V) (not checked: that would need a host sync).
- The padded sequence is built once per batch; every order's key is formed incrementally.
- Zero init consumes no RNG (tables are built from zero tensors, never `reset_parameters` of
  nn.Embedding), which keeps seed pairing with dense arms; `reset_parameters()` re-zeroes after
  a meta-device build + `to_empty`.
- Visit counts live in non-persistent fp32 buffers `counts_0..` (not parameters, not in the
  state_dict: the optimizer zeroes them every step, so nothing is lost at step boundaries).
  The training loop calls `count_(idx)` once per gradient-accumulation micro-step, outside the
  compiled forward and outside autograd; it refuses to run in eval mode. `oe_mfree_step` reads
  `counts()` and calls `reset_counts_()`.
- `count(idx, counts)` is the functional form (fresh zero buffers when counts is None).
- Gradients are ordinary dense bf16 `nn.Embedding` grads (sparse=False).

The variant (`over_encoding`) puts it at the token-embedding point: x0 = norm(wte(idx) + oe(idx)).
Submodule `oe` (state-dict keys `oe.tables.j.weight`): zero-initialised without RNG, counted apart
from the backbone (`oe_tables`, `total_with_oe`, as seed 002's result.json), left out of the 6N
FLOPs; its tables form one moment-free group (kind "oe_mfree", lr embedding_lr x (d/768)^-1/2,
no weight decay, seed 002 §2.1; table-Neumann options §4.3) wired to the visit counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from muonlab.model.extensions import ModelVariant, VariantConfig, register_variant
from muonlab.settings import COUNT, POSITIVE_COUNT, MethodInfo, Range, setting

DEFAULT_M = 150_855  # seed 002 §2.1's table size m (the tables have m + 2j rows)


class OverEncoding(nn.Module):
    """`ids` / `forward` / `count_` of the OE tables; see the module docstring."""

    def __init__(self, vocab_size: int, n_embd: int, m: int = DEFAULT_M, n: int = 3, k: int = 2,
                 *, dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None):
        super().__init__()
        if vocab_size < 1:
            raise ValueError(f"OverEncoding: vocab_size must be >= 1, got {vocab_size}")
        if m < 1:
            raise ValueError(f"OverEncoding: m must be >= 1 (m = 0 means OE off: do not build it), got {m}")
        if n < 2:
            raise ValueError(f"OverEncoding: max n-gram order n must be >= 2, got {n}")
        if k < 1:
            raise ValueError(f"OverEncoding: tables per order k must be >= 1, got {k}")
        n_tab = k * (n - 1)
        if n_embd < n_tab or n_embd % n_tab:
            raise ValueError(f"OverEncoding: n_embd={n_embd} must be a positive multiple of "
                             f"k*(n-1) = {n_tab} tables")
        if (vocab_size + 1) ** n > torch.iinfo(torch.int64).max:
            raise ValueError(f"OverEncoding: (V+1)^n = {vocab_size + 1}^{n} overflows the int64 hash key")
        self.vocab_size, self.n_embd, self.m, self.n, self.k = vocab_size, n_embd, m, n, k
        self.width = n_embd // n_tab
        self.rows = [m + 2 * j for j in range(n_tab)]
        self.tables = nn.ModuleList(
            nn.Embedding(r, self.width, _weight=torch.zeros(r, self.width, dtype=dtype, device=device))
            for r in self.rows)
        for j, r in enumerate(self.rows):
            self.register_buffer(f"counts_{j}", torch.zeros(r, dtype=torch.float32, device=device),
                                 persistent=False)

    def order(self, j: int) -> int:
        """n-gram order served by table j."""
        return 2 + j // self.k

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Zero the tables and the counts (no RNG); for a meta-device build after `to_empty`."""
        for t in self.tables:
            t.weight.zero_()
        self.reset_counts_()

    def ids(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Hashed row index h_j [B, T] (int64, in [0, m + 2j)) of every table j."""
        if idx.dim() != 2:
            raise ValueError(f"OverEncoding.ids: idx must be [B, T], got shape {tuple(idx.shape)}")
        T, V = idx.shape[1], self.vocab_size
        x = idx.long()
        padded = F.pad(x, (self.n - 1, 0), value=V)  # once per batch; prev_r is a slice of it
        key, out = x, []
        for i in range(2, self.n + 1):
            r = i - 1
            prev = padded[:, self.n - 1 - r:self.n - 1 - r + T]
            key = key + (V + 1) ** r * prev
            for c in range(self.k):
                out.append(torch.remainder(key, self.rows[self.k * (i - 2) + c]))
        return out

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """cat_j E_j[h_j] along the last dim: [B, T, n_embd] in the tables' dtype."""
        return torch.cat([t(h) for t, h in zip(self.tables, self.ids(idx))], dim=-1)

    def counts(self) -> list[torch.Tensor]:
        """The module's accumulated per-table fp32 visit counts (live buffers)."""
        return [getattr(self, f"counts_{j}") for j in range(len(self.rows))]

    @torch.no_grad()
    def count(self, idx: torch.Tensor, counts: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Add the visits of idx to counts (fresh fp32 zeros when None) in place; return them."""
        if counts is None:
            counts = [torch.zeros(r, dtype=torch.float32, device=idx.device) for r in self.rows]
        if len(counts) != len(self.rows):
            raise ValueError(f"OverEncoding.count: expected {len(self.rows)} count tensors, "
                             f"got {len(counts)}")
        for c, h, r in zip(counts, self.ids(idx), self.rows):
            if c.dtype != torch.float32 or c.shape != (r,):
                raise TypeError(f"OverEncoding.count: counts must be fp32 of shape ({r},), got "
                                f"{c.dtype} {tuple(c.shape)} (was the module cast with .to(dtype)?)")
            c.index_add_(0, h.reshape(-1), torch.ones(h.numel(), dtype=c.dtype, device=c.device))
        return counts

    def count_(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Accumulate one micro-step's visits into `counts_j` (training only)."""
        if not self.training:
            raise RuntimeError("OverEncoding.count_ must not run in eval mode (counts feed the optimizer)")
        return self.count(idx, self.counts())

    @torch.no_grad()
    def reset_counts_(self) -> None:
        for c in self.counts():
            c.zero_()

    def num_parameters(self) -> int:
        return sum(self.rows) * self.width

    def memory_bytes(self) -> int:
        """Analytical: weights + same-dtype grads per parameter, plus 4 B fp32 count per row."""
        elem = self.tables[0].weight.element_size()
        return 2 * elem * self.num_parameters() + 4 * sum(self.rows)


@dataclass(frozen=True)
class OverEncodingConfig(VariantConfig):
    """Seed 002 §2.1 (Family A): hashed n-gram Over-Encoding tables with their moment-free update. The run
    config's `model.oe` section and the configuration OverEncodingVariant reads (table-Neumann on
    these tables' update is an optimizer setting: optim.table_whiten adds its keys to their group)."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('over_encoding', 'seed 002 §2.1 (Family A Over-Encoding; table-Neumann §4.3)', __name__,
                                              ('tests/model/test_over_encoding.py', 'tests/model/test_over_encoding_model.py', 'tests/papers/test_table_update.py', 'tests/papers/test_diagnostics_accounting.py'), 'm', 0)

    m: int = setting(0, f"table size (0: off; the paper {DEFAULT_M})", flag="oe-m", range=COUNT)
    n: int = setting(3, "largest n-gram order", flag="oe-n", range=Range(2, 64, why="an n-gram order no table holds"))
    k: int = setting(2, "tables per order", flag="oe-k", range=POSITIVE_COUNT)

    def step_hooks(self, model) -> list:
        """Each micro-step's table visits, counted outside the (compiled) forward."""
        return [CountVisits(model.oe)] if self.is_on() else []

    def check_model(self, config) -> None:
        super().check_model(config)
        self.build(config, device="meta")  # the module's own checks, without allocating

    def build(self, config, device=None) -> OverEncoding:
        return OverEncoding(config.vocab_size, config.n_embd, m=self.m, n=self.n, k=self.k, device=device)


@register_variant("over_encoding", OverEncodingConfig)  # its record: OverEncodingConfig.METHOD
class OverEncodingVariant(ModelVariant):
    def create(self) -> None:
        self.model.oe = self.cfg.build(self.config)

    def init_weights(self) -> None:
        self.model.oe.reset_parameters()  # zero tables (no RNG: seeds stay paired with dense arms), bf16

    def parameters(self):
        return {}  # the tables are counted apart

    def counts_apart(self, total: int) -> dict[str, int]:
        n = self.model.oe.num_parameters()
        return {"oe_tables": n, "total_with_oe": total + n}

    def summary_counts(self, counts: dict[str, int]) -> dict[str, float]:
        return {"oe_params_M": counts["oe_tables"] / 1e6}  # apart from num_params_M, as seed 002's result.json

    def flop_excluded(self) -> int:
        return self.model.oe.num_parameters()

    def param_groups(self, lrs):
        return [dict(kind="oe_mfree", params=list(self.model.oe.parameters()), lr=lrs.embedding_lr * lrs.dim_scale)]

    def attach(self, optimizer) -> None:
        optimizer.attach_visit_counts(list(self.model.oe.parameters()), self.model.oe.counts())

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model.oe(idx)


class CountVisits:
    """Seed 002 §2.1 (Family A): a step hook counting each micro-step's table visits (the moment-free
    update's per-row counts), outside the (compiled) forward."""

    def __init__(self, tables):
        self.tables = tables

    def before_micro_step(self, x) -> None:
        self.tables.count_(x)
