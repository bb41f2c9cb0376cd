"""Polar and post-polar precision of the Muon step (seed 002 §2.1 (Tier 1) "NS5 in FP32"; seed 000 §3.3).

Muon group keys: `polar.dtype` "bf16" (upstream) or "fp32" (the Polar Express iteration in
fp32); `polar.post_dtype` None (default: whatever Polar Express returns, i.e. the polar dtype),
"bf16" or "fp32" (`g = X.float()`: NorMuon, lr, wd, mask and update in fp32, which also drops
the bf16 rounding of beta2 0.95 -> 0.94921875 and of lr; upstream train.py's casts, unstated in seed 000).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch

from muonlab.optim.extensions import GroupSection
from muonlab.settings import MethodInfo, setting

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class PolarPrecision(GroupSection):
    """Seed 002 §2.1 (Tier 1), seed 000: the precision of Polar Express and of its output. The run
    config's `optim.polar` section and the muon groups' `polar.dtype` / `polar.post_dtype`."""

    NAMESPACE: ClassVar[str] = "polar"

    METHOD: ClassVar[MethodInfo] = MethodInfo('polar_precision', 'seed 002 §2.1 (Tier 1); seed 000 (post-polar fp32)', __name__, ('tests/optim/test_prepolar.py', 'tests/model/test_extensions.py'), None, None)

    dtype: Literal["bf16", "fp32"] = setting("bf16", "Polar Express dtype (fp32: seed 002's NS5 in FP32)",
                                             flag="polar-dtype")
    post_dtype: Literal[None, "bf16", "fp32"] = setting(None, "dtype after Polar Express (fp32: g = X.float()); "
                                                        "none keeps Polar Express's", flag="post-polar-dtype")

    def param_group_keys(self, optim) -> dict[str, dict]:
        """The muon groups' keys that differ from upstream's (none at the defaults)."""
        keys = self.group_options()
        return {"muon": keys} if keys else {}

    def configure(self, stages):
        """The muon_variant.MuonStages with this precision."""
        return replace(stages, polar=replace(stages.polar, dtype=DTYPES[self.dtype]),
                       post_polar_dtype=None if self.post_dtype is None else DTYPES[self.post_dtype])
