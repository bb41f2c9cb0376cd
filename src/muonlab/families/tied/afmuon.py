"""What seed 004's tied-token families share (tied, t5, imagegpt, hf, reuse): the AF-Muon optimizer
section and its builder (AF-Muon and its baselines, muonlab.optim.af_muon), the schedule their
groups follow, and Table 3's weight statistics.

Table 3's statistics of a tied model: the tied table's RMS and largest entry and the
hidden matrices' RMS (and Table 19's tied columns for the MoE).

tied_rms = sqrt(mean E_ij^2) over the whole V x d table, tied_max = max |E_ij|, matrix_rms = the RMS
over every entry of every AF-Muon "matrix" tensor together (the paper does not say how it pools the
matrices; one RMS over all their entries is our choice). Models without a tied table have none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn

from muonlab.errors import UsageError
from muonlab.settings import POSITIVE, MethodInfo, Range, Section, setting

AF_OPTIMIZERS = ("afmuon", "hybrid", "sign", "factorial_lmo_rms", "factorial_lmo_adamw", "factorial_adamw_rms",
                 "factorial_adamw_adamw", "adamw")


# the families seed 004's Table-1 optimizers run under, each with a tied token table (reuse: K.9's own arm)
TABLE1_FAMILIES = ("tied", "t5", "imagegpt", "hf")
PAPER_MATRIX_LR = 0.02  # seed 004 §3: the Muon lr of every Table-1 setting
PAPER_BATCH_TOKENS = 2**19  # seed 004 App. J: 524,288 tokens an update (target tokens for the T5s)


def cpu_matrix_lr(cpu_batch_tokens: int, paper_batch_tokens: int = PAPER_BATCH_TOKENS) -> float:
    """The Muon lr of a seed-004 CPU stand-in: 0.02 * sqrt(B_cpu / B_paper).

    Eq. 6 already scales the tied table's lr to the width (rho * s / d), and Muon's orthogonalized
    hidden updates need no width factor for square matrices (muP's spectral rule), so width is not what
    breaks the CPU stand-ins: their batches are 500 to 4,000 times smaller than the paper's, and at the
    paper's lr Sign and AF-Muon diverge within 30 steps. The square-root rule for normalized (sign-like)
    updates (Malladi et al. 2022, "On the SDEs and scaling rules for adaptive gradient algorithms")
    scales the lr by sqrt(B_cpu / B_paper); through eq. 6 the tied lr follows. The vector / AdamW lrs stay
    the paper's (Hybrid's tied table on AdamW 3e-4 already learns slowly at this size).
    """
    return PAPER_MATRIX_LR * math.sqrt(cpu_batch_tokens / paper_batch_tokens)


@dataclass
class AFMuonConfig(Section):
    """Seed 004 §3: AF-Muon (c 3, s 0.5, rho 60, Muon lr 0.02, vector lr 3e-4) and its baselines."""

    METHOD: ClassVar[MethodInfo] = MethodInfo(
        "af_muon", "seed 004 §3 (Table 1; K.1, K.3, K.7)", "muonlab.optim.af_muon; muonlab.optim.lmo",
        ("tests/optim/test_af_muon.py", "tests/optim/test_lmo.py", "tests/families/test_tied_lab.py"), "kind", None)

    kind: Literal[AF_OPTIMIZERS] = setting("afmuon", "AF-Muon, Hybrid Muon, Sign (c = 1), the K.1 factorial "
                                           "(tied rule x vector rule), or plain AdamW", flag="optimizer")
    cap: float | None = setting(None, "the clipped-row LMO's cap c (none: the optimizer's own, AF-Muon 3; "
                                "Sign fixes 1; inf allowed)", flag="af-cap", allow_inf=True, range=Range(1, None))
    scale: float | None = setting(None, "the tied table's scale s (none: the optimizer's own, AF-Muon 0.5, "
                                  "Sign 1)", flag="af-scale", range=POSITIVE)
    rho: float = setting(60.0, "the tied table's rho", flag="af-rho", range=POSITIVE)
    matrix_lr: float = setting(0.02, "Muon / tied-table base lr", flag="af-matrix-lr", range=POSITIVE)
    vector_lr: float = setting(3e-4, "vector (and auxiliary AdamW) lr", flag="af-vector-lr", range=POSITIVE)
    adamw_lr: float = setting(6e-4, "the AdamW baseline's lr (seed 004's tuned pilot value)", flag="af-adamw-lr",
                              range=POSITIVE)

    def tied_rule(self) -> str:
        return "lmo" if self.kind in ("afmuon", "sign", "factorial_lmo_rms", "factorial_lmo_adamw") else "adamw"

    def inactive(self) -> dict[str, str]:
        if self.kind == "adamw":
            why = "optimizer adamw trains every tensor with AdamW"
            return {k: why for k in ("cap", "scale", "rho", "matrix_lr", "vector_lr")}
        out = {"adamw_lr": f"only optimizer adamw reads it (optimizer is {self.kind})"}
        if self.tied_rule() == "adamw":
            why = f"optimizer {self.kind} puts the tied table on AdamW"
            out.update(cap=why, scale=why, rho=why)
        return out

    def validate(self) -> None:
        if self.kind == "sign" and self.cap not in (None, 1.0):
            raise UsageError(f"optimizer sign fixes af_cap = 1, got {self.cap}")


def build_optimizer(model, cfg, compile_step: bool, distributed: bool = False):
    from muonlab.optim import af_muon  # noqa: PLC0415

    o = cfg.optim
    if distributed and o.kind == "adamw":
        raise UsageError("optimizer adamw (torch's AdamW) runs in one process; under torchrun use the AF-Muon "
                         "optimizers (afmuon, hybrid, sign, factorial_*)")
    if o.kind == "adamw":  # seed 004's protein baseline: plain AdamW everywhere
        optimizer = af_muon.build_optimizer(model, "adamw", lr=o.adamw_lr)
    elif o.kind == "hybrid" and not af_muon.is_tied(model):  # seed 004 Table 15's untied control
        optimizer = af_muon.build_optimizer(model, "hybrid_untied", lr=o.matrix_lr, aux_lr=o.vector_lr)
    else:
        lmo = {k: v for k, v in (("cap", o.cap), ("scale", o.scale)) if v is not None and o.tied_rule() == "lmo"}
        if o.kind == "sign":
            lmo.pop("cap", None)  # fixed at 1 by the optimizer (validated above)
        optimizer = af_muon.build_optimizer(model, o.kind, lr=o.matrix_lr, vector_lr=o.vector_lr,
                                            aux_lr=o.vector_lr, rho=o.rho, **lmo)
    if distributed:  # the same groups, averaged, clipped and sharded across the ranks by the optimizer
        from muonlab.optim.af_muon_distributed import DistAFMuon  # noqa: PLC0415

        dist_opt = DistAFMuon(optimizer.param_groups, max_grad_norm=cfg.train.grad_clip or None,
                              clip_params=model.parameters())
        dist_opt.roles = optimizer.roles
        dist_opt.always_collective = cfg.runtime.collectives == "always"
        optimizer = dist_opt
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]  # the lab's schedule scales every group from here
    return optimizer


class LRSchedule:
    """AF-Muon's groups follow only the LR multiplier (their momentum and decay are fixed)."""

    def __init__(self, cfg):
        from muonlab.optim.schedules import Schedule  # noqa: PLC0415

        s = cfg.schedule
        self._shape = Schedule(warmup_ratio=s.warmup_ratio, warmdown_ratio=s.warmdown_ratio,
                               final_lr_frac=s.final_lr_frac)

    def apply(self, optimizer, step: int, progress: float) -> dict[str, float]:
        lrm = self._shape.lr_multiplier(progress)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lrm
        return {"lrm": lrm}


TABLE3_KEYS = ("tied_rms", "tied_max", "matrix_rms")


@torch.no_grad()
def table_stats(model: nn.Module) -> dict[str, float]:
    from muonlab.optim.af_muon import partition_by_role

    try:
        roles = partition_by_role(model)
    except ValueError:  # untied (Table 15's control, K.9's model): no tied table, no Table 3
        return {}
    (_, table), = roles["tied"]
    E = table.detach().double()
    squares = sum(p.detach().double().square().sum() for _, p in roles["matrix"])
    entries = sum(p.numel() for _, p in roles["matrix"])
    return {"tied_rms": float(E.square().mean().sqrt()), "tied_max": float(E.abs().max()),
            "matrix_rms": math.sqrt(float(squares) / entries) if entries else math.nan}
