"""master32: fp32 master weights and moments for low-precision AdamW params (seed 002 §2.1 (Tier 1), §3 item 3).

An adamw group with `master32=True` keeps, for each param whose dtype is not fp32, an fp32
copy `master` in its state, fp32 moments made like it, runs the AdamW update on the master
with the fp32 gradient and writes the param from it (one rounding per step). Off (the upstream
"bf16state"), the moments live in the param's own dtype. An fp32 param is unaffected. The
master is a state key like the moments, so it is saved, row-sharded by DistMuonAdamW and kept
fp32 on load (MuonAdamW.load_state_dict).
"""

from __future__ import annotations

import torch

from dataclasses import dataclass
from typing import Callable



@dataclass(frozen=True)
class AdamWPrecision:
    """The precision of an adamw param's state: where the update runs and how the param is written.

    `applies(group, p)`: whether a new state of p uses it; `create(state, share)` adds its state
    and returns the tensor the AdamW step updates (its moments are made like it); `owns(state)`
    tells an existing state (e.g. loaded) apart; `grad(g)`, `target(state)` and
    `write_back(share, state)` wrap the update.
    """

    key: str
    applies: Callable[[dict, torch.Tensor], bool]
    create: Callable[[dict, torch.Tensor], torch.Tensor]
    owns: Callable[[dict], bool]
    target: Callable[[dict], torch.Tensor]
    grad: Callable[[torch.Tensor], torch.Tensor]
    write_back: Callable[[torch.Tensor, dict], None]


def _create(state: dict, share: torch.Tensor) -> torch.Tensor:
    state["master"] = share.detach().float().clone()
    return state["master"]


MASTER32 = AdamWPrecision(
    key="master32",
    applies=lambda group, p: bool(group.get("master32", False)) and p.dtype != torch.float32,
    create=_create,
    owns=lambda state: "master" in state,
    target=lambda state: state["master"],
    grad=lambda grad: grad.float(),
    write_back=lambda share, state: share.copy_(state["master"]),
)


def precision_for(group: dict, p: torch.Tensor) -> AdamWPrecision | None:
    """The precision a new AdamW state of p takes in `group` (None: the param's own dtype)."""
    return MASTER32 if MASTER32.applies(group, p) else None


def precision_of(state: dict) -> AdamWPrecision | None:
    """The precision an existing (or loaded) AdamW state was made with."""
    return MASTER32 if MASTER32.owns(state) else None
