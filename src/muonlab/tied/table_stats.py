"""Seed 004 Table 3's weight statistics of a tied model: the tied table's RMS and largest entry and the
hidden matrices' RMS (and Table 19's tied columns for the MoE).

tied_rms = sqrt(mean E_ij^2) over the whole V x d table, tied_max = max |E_ij|, matrix_rms = the RMS
over every entry of every AF-Muon "matrix" tensor together (the paper does not say how it pools the
matrices; one RMS over all their entries is our choice). Models without a tied table have none.
"""

from __future__ import annotations

import math

import torch
from torch import nn


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
