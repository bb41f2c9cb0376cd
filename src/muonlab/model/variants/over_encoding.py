"""Hashed n-gram Over-Encoding (seed 002 §Family A, spec-002 §1.1) at the token-embedding
point: x0 = norm(wte(idx) + oe(idx)). The tables, hash and visit counts are in
muonlab.model.over_encoding.

Submodule `oe` (state-dict keys `oe.tables.j.weight`): zero-initialised without RNG, counted
apart from the backbone (`oe_tables`, `total_with_oe`, as seed 002's result.json), left out of
the 6N FLOPs; its tables form one moment-free group (kind "oe_mfree", lr embedding_lr x
(d/768)^-1/2, no weight decay, §1.3; table-Neumann options §1.11) wired to the visit counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from muonlab.model.extensions import ModelVariant, register_variant
from muonlab.model.over_encoding import DEFAULT_M, OverEncoding


@dataclass(frozen=True)
class OverEncodingConfig:
    m: int = DEFAULT_M  # base table rows (the paper: 150,855)
    n: int = 3  # max n-gram order
    k: int = 2  # tables per order
    table_whiten: str | None = None  # None | neumann: table-Neumann on the moment-free update (§1.11)
    table_whiten_tau: float = 80.0

    def validate(self, config) -> None:
        self.build(config, device="meta")  # the module's own checks, without allocating

    def build(self, config, device=None) -> OverEncoding:
        return OverEncoding(config.vocab_size, config.n_embd, m=self.m, n=self.n, k=self.k, device=device)


@register_variant("over_encoding", OverEncodingConfig, paper="seed 002",
                  section="§Family A Over-Encoding (spec-002 §1.1, §1.3, §1.11)", switch=("oe_m", 0),
                  keys={"oe_m": "m", "oe_n": "n", "oe_k": "k", "table_whiten": "table_whiten",
                        "table_whiten_tau": "table_whiten_tau"},
                  lenient=("table_whiten_tau",),
                  tests=("tests/test_over_encoding.py", "tests/test_over_encoding_model.py",
                         "tests/test_table_update.py", "tests/test_diagnostics_accounting.py"))
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

    def flop_excluded(self) -> int:
        return self.model.oe.num_parameters()

    def param_groups(self, lrs):
        whiten = {} if self.cfg.table_whiten is None else dict(
            table_whiten=self.cfg.table_whiten, table_whiten_tau=self.cfg.table_whiten_tau)
        return [dict(kind="oe_mfree", params=list(self.model.oe.parameters()),
                     lr=lrs.embedding_lr * lrs.dim_scale, **whiten)]

    def attach(self, optimizer) -> None:
        optimizer.attach_visit_counts(list(self.model.oe.parameters()), self.model.oe.counts())

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model.oe(idx)
