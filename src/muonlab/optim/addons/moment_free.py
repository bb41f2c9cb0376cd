"""Moment-free, count-normalised, table-RMS-normalised update of the Over-Encoding tables.

Seed 002 §2.1, Family A (`MFREE`, `oe_mfree_step`), for one table E [rows, w] with its dense
bf16 gradient g (the batch-mean loss, accumulated as loss/K over the step's K micro-steps) and
its fp32 visit counts n (summed over the same micro-steps):

    V      = {r : n_r > 0}                                            (visited rows)
    gbar_r = g_r / n_r                                                (per-occurrence mean, r in V)
    RMS    = max(sqrt(sum_{r in V} ||gbar_r||^2 / (|V| w)), 1e-30)    (one scalar per table)
    E_r   <- bf16(E_r - lr * gbar_r / RMS)                            (r in V; other rows untouched)
    n     <- 0

No moments, no weight decay; the state is the counts alone (`state_bytes`). lr = initial lr x
the global schedule multiplier (the caller passes the current value; `oe_learning_rate` gives
the initial one, 0.6 (d/768)^-1/2).

Optional table-Neumann (seed 002 §4.3 item 1, `TNEU`): the §2.1 (Tier 1) right-projected Neumann-Gram of
whitening.py (called, not re-implemented) applied to the [|V|, w] matrix of visited gbar rows,
before the RMS normalisation (spec-assumed order: NG, then RMS, then the update).

As a param-group kind (`kind="oe_mfree"`, registered here): options `lr`, `weight_decay` (0:
none), `table_whiten.kind` (None or "neumann": table-Neumann) and `table_whiten.tau` (80); the tables'
visit counts come from MuonAdamW.attach_visit_counts. Under DistMuonAdamW the tables are
replicated: gradients and counts are summed across ranks, then every rank applies the update.

Choices (where the paper is silent or the brief asked to decide):
- fp32 compute on the visited rows only (gathered by their indices: no Python loop over rows and
  no fp32 copy of the whole table); one rounding, on the write, to the table's dtype.
- the sum of squares is taken as a 2-norm (torch.linalg.vector_norm, fp32): the same quantity,
  without a squared temporary.
- host syncs: gathering the visited rows needs their number, so there is exactly one sync
  (`nonzero`). The returned "rms" is a 0-D fp32 tensor (no second sync); `float(stats["rms"])`
  when logging. "rms" is 0 when nothing is updated.
- grad None: no update, but the counts are still zeroed (they belong to this step, whose
  micro-steps produced no table gradient); no sync. An empty visited set is a no-op, no NaN.
- an all-zero gbar gives RMS = rms_floor and a zero update (no NaN).
- table-Neumann: `neumann_beta` is beta_t itself (the caller ramps it, e.g. with
  homotopy.homotopy_alpha(t, 80)); centring is over the visited rows (spec assumption), the mean
  row is dropped unless `neumann_mean_addback` (whitening's default). beta = 0 still centres, so it
  differs from None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from muonlab.errors import UsageError
from muonlab.optim.addons.neumann_whitening import neumann_whiten
from muonlab.optim.extensions import GroupSection, group_key
from muonlab.optim.homotopy import HOMOTOPY_FIRST_T, homotopy_alpha, homotopy_t
from muonlab.settings import METHOD_OFF, NON_NEGATIVE, MethodInfo, setting



def oe_learning_rate(n_embd: int, embedding_lr: float = 0.6) -> float:
    """Initial OE learning rate EMBEDDING_LR (d/768)^-1/2: 0.848528 at d = 384, 0.734847 at 512."""
    return embedding_lr * (n_embd / 768) ** -0.5


def state_bytes(rows: int) -> int:
    """Optimizer state of one table: its fp32 visit counts (4 B/row); no moments."""
    return 4 * rows


@torch.no_grad()
def moment_free_step(table: torch.Tensor, grad: torch.Tensor | None, counts: torch.Tensor,
                     lr: float | torch.Tensor, rms_floor: float = 1e-30, neumann_beta: float | None = None,
                     *, neumann_mean_addback: bool = False) -> dict:
    """One moment-free update of `table` [rows, w] in place; zeroes `counts` [rows].

    Returns {"visited": |V| (int; 0 when grad is None), "rms": 0-D fp32 tensor on the table's
    device (the RMS used, after the floor; 0 when nothing was updated)}.
    """
    if table.dim() != 2 or counts.shape != table.shape[:1]:
        raise ValueError(f"need table [rows, w] and counts [rows], got {tuple(table.shape)}, {tuple(counts.shape)}")
    if grad is not None and grad.shape != table.shape:
        raise ValueError(f"grad shape {tuple(grad.shape)} != table shape {tuple(table.shape)}")
    stats = {"visited": 0, "rms": torch.zeros((), dtype=torch.float32, device=table.device)}
    if grad is not None:
        idx = (counts > 0).nonzero().squeeze(1)  # the one host sync: |V| sizes what follows
        if idx.numel() > 0:
            gbar = grad.index_select(0, idx).float().div_(counts.index_select(0, idx).float().unsqueeze(1))
            if neumann_beta is not None:
                gbar = neumann_whiten(gbar, neumann_beta, mean_addback=neumann_mean_addback)
            rms = (torch.linalg.vector_norm(gbar) / (gbar.numel() ** 0.5)).clamp_min(rms_floor)
            new = table.index_select(0, idx).float().sub_(gbar.mul_(lr / rms))
            table.index_copy_(0, idx, new.to(table.dtype))
            stats = {"visited": idx.numel(), "rms": rms.detach()}
    counts.zero_()
    return stats


@dataclass(frozen=True)
class TableNeumann(GroupSection):
    """Seed 002 §4.3 item 1: Neumann-Gram whitening of the Over-Encoding tables' visited rows. The run
    config's `optim.table_whiten` section and the Over-Encoding group's `table_whiten.*` keys."""

    NAMESPACE: ClassVar[str] = "table_whiten"

    METHOD: ClassVar[MethodInfo] = MethodInfo('table_neumann', 'seed 002 §4.3 item 1', __name__, ('tests/papers/test_table_update.py',), 'kind', None)

    kind: Literal[None, "neumann"] = setting(None, "none | neumann", flag="table-whiten")
    tau: float = setting(80.0, "homotopy horizon", flag="table-whiten-tau", range=NON_NEGATIVE)

    def inactive(self) -> dict[str, str]:
        return {"tau": METHOD_OFF} if self.kind is None else {}

    def param_group_keys(self, optim) -> dict[str, dict]:
        """The Over-Encoding tables' group (named by its model variant) takes table-Neumann's keys."""
        if self.kind is None:
            return {}
        return {"over_encoding": {**self.group_values(), FIRST_T: optim.homotopy_first_t}}

    def check_with(self, cfg) -> None:
        if self.kind is not None and cfg.model.oe.m == 0:
            raise UsageError("table_whiten acts on the Over-Encoding tables: set oe_m")


# seed 002 §2.1 (Family A): no weight decay, no moments; table-Neumann (§4.3 item 1) off (t = 1 first)
KIND, TAU = TableNeumann.group_keys()["kind"], TableNeumann.group_keys()["tau"]
FIRST_T = group_key(TableNeumann.NAMESPACE, "first_t")
OE_MFREE_DEFAULTS = {"lr": 0.0, "weight_decay": 0.0, **TableNeumann.group_defaults(), FIRST_T: HOMOTOPY_FIRST_T}


def table_neumann_beta(group: dict, optimizer_state, p) -> float | None:
    """beta_t of the optional table-Neumann (advances the table's step counter); None when off
    (then the table has no optimizer state at all). t = the table's completed steps +
    `table_whiten.first_t` (muonlab.optim.homotopy's convention: t = 1 at the first update)."""
    if group[KIND] is None:
        return None
    state = optimizer_state[p]
    completed = state.get("step", 0)
    state["step"] = completed + 1
    return homotopy_alpha(homotopy_t(completed, int(group[FIRST_T])), group[TAU])


class MomentFreeKind:
    """The `oe_mfree` group kind, MuonAdamW's third beside muon and adamw (eager: the number of visited rows
    changes every step). Its params are replicated under DistMuonAdamW: every rank sums each gradient (zeros
    where it has none) and the tensors of `reduced_alongside`, divides the gradient by the world size, and
    applies `update`."""

    defaults = OE_MFREE_DEFAULTS

    def validate(self, group: dict) -> None:
        if group[KIND] not in (None, "neumann"):
            raise ValueError(f"{KIND} must be None or 'neumann', got {group[KIND]!r}")

    def counts(self, optimizer, p) -> torch.Tensor:
        counts = optimizer.visit_counts.get(p)
        if counts is None:
            raise RuntimeError("oe_mfree group: no visit counts attached (MuonAdamW.attach_visit_counts)")
        return counts

    def reduced_alongside(self, optimizer, p) -> list[torch.Tensor]:
        return [self.counts(optimizer, p)]  # the global batch's counts

    def update(self, optimizer, group: dict, p, grad) -> None:
        moment_free_step(p, grad, self.counts(optimizer, p), group["lr"],
                         neumann_beta=table_neumann_beta(group, optimizer.state, p))
