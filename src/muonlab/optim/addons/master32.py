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

from muonlab.optim.extensions import AdamWPrecision, register_adamw_state


def _create(state: dict, share: torch.Tensor) -> torch.Tensor:
    state["master"] = share.detach().float().clone()
    return state["master"]


MASTER32 = register_adamw_state("master32", AdamWPrecision(
    key="master32",
    applies=lambda group, p: bool(group.get("master32", False)) and p.dtype != torch.float32,
    create=_create,
    owns=lambda state: "master" in state,
    target=lambda state: state["master"],
    grad=lambda grad: grad.float(),
    write_back=lambda share, state: share.copy_(state["master"]),
), paper="seed 002 §2.1 (Tier 1), §3 item 3", tests=("tests/optim/test_embedding_state.py", "tests/optim/test_step0.py"),
    summary="fp32 master copy and moments of the bf16 embedding tables")
