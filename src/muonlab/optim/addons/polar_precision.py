"""Polar and post-polar precision of the Muon step (seed 002 §2.1 (Tier 1) "NS5 in FP32"; seed 000 §3.3).

Muon group keys: `polar_dtype` "bf16" (upstream) or "fp32" (the Polar Express iteration in
fp32); `post_polar_dtype` None (default: whatever Polar Express returns, i.e. the polar dtype),
"bf16" or "fp32" (`g = X.float()`: NorMuon, lr, wd, mask and update in fp32, which also drops
the bf16 rounding of beta2 0.95 -> 0.94921875 and of lr; upstream train.py's casts, unstated in seed 000).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from muonlab.optim.extensions import MuonStageAddon, register_muon_stage
from dataclasses import dataclass
from typing import ClassVar, Literal
from muonlab.settings import MethodInfo, Section, setting

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
OPTIONS = dict(polar_dtype="bf16", post_polar_dtype=None)


def validate(o: dict) -> None:
    if o["polar_dtype"] not in DTYPES:
        raise ValueError(f"polar_dtype must be one of {tuple(DTYPES)}, got {o['polar_dtype']!r}")
    if o["post_polar_dtype"] is not None and o["post_polar_dtype"] not in DTYPES:
        raise ValueError(f"post_polar_dtype must be None or one of {tuple(DTYPES)}, got {o['post_polar_dtype']!r}")


def configure(o: dict, stages):
    post = o["post_polar_dtype"]
    return replace(stages, polar=replace(stages.polar, dtype=DTYPES[o["polar_dtype"]]),
                   post_polar_dtype=None if post is None else DTYPES[post])


register_muon_stage("polar_precision", MuonStageAddon(OPTIONS, configure, validate),
                    paper="seed 002 §2.1 (Tier 1) (NS5 in FP32); seed 000 exp40 (post-polar fp32)",
                    tests=("tests/test_prepolar.py", "tests/test_prepolar_arms.py"),
                    summary="Polar Express and the post-polar update in bf16 or fp32")


# run-config settings of this method: its flags, their help, which options act when
@dataclass
class PolarSettings(Section):
    """Seed 002 §2.1 (Tier 1), seed 000: the precision of Polar Express and of its output."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('polar_precision', 'seed 002 §2.1 (Tier 1); seed 000 (post-polar fp32)', __name__, ('tests/test_prepolar.py', 'tests/test_extensions.py'), None, None)

    dtype: Literal["bf16", "fp32"] = setting("bf16", "Polar Express dtype (fp32: seed 002's NS5 in FP32)",
                                             flag="polar-dtype")
    post_dtype: Literal[None, "bf16", "fp32"] = setting(None, "dtype after Polar Express (fp32: g = X.float()); "
                                                        "none keeps Polar Express's", flag="post-polar-dtype")

    def param_group_keys(self, optim) -> dict[str, dict]:
        """The muon groups' keys that differ from upstream's (none at the defaults)."""
        keys = {k: v for k, v in dict(polar_dtype=self.dtype, post_polar_dtype=self.post_dtype).items() if v != OPTIONS[k]}
        return {"muon": keys} if keys else {}
