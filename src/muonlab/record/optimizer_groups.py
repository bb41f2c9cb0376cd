"""What the run's optimizer was built with, per parameter group, for its record (the ledger line and
summary.json): the settings that act, read off the optimizer itself rather than off the config, so the
record says what ran (seed 004: AF-Muon's tied table at eq. 6's effective lr, not the Muon lr it stores).
"""

from __future__ import annotations

from typing import Any

import torch

_SCALARS = (bool, int, float, str)


def optimizer_groups(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Per group: its scalar settings (lr, momentum, weight decay, betas, eps, role, cap, ...), its
    tensor and element counts; an AF-Muon tied group also its effective lr (eq. 6)."""
    from muonlab.optim.af_muon import ROLE_KEYS, tied_lr

    out = []
    for group in optimizer.param_groups:
        keys = group.keys()
        if group.get("role") in ROLE_KEYS:  # AF-Muon: only what the role's update reads
            keys = ("role", "part", *ROLE_KEYS[group["role"]], "initial_lr")
        row = {k: (list(v) if isinstance(v, tuple) else v) for k in keys if k in group
               for v in (group[k],) if k != "params" and (v is None or isinstance(v, _SCALARS)
                                                         or (isinstance(v, tuple) and all(isinstance(x, _SCALARS) for x in v)))}
        row["tensors"] = len(group["params"])
        row["elements"] = sum(p.numel() for p in group["params"])
        if group.get("role") == "tied" and group["params"]:
            row["effective_lr"] = tied_lr(group["lr"], group, group["params"][0])
        out.append(row)
    return out
