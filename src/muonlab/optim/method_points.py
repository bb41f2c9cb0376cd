"""The optimizer's points that have one method each, wired to it: plain calls, no registry.

MuonAdamW and DistMuonAdamW call these where a method acts, so the baseline's files name no method
(DESIGN, "The baseline and its extension points"); the one extension point that plug-ins extend, the
pre-polar conditioner, stays a registry (extensions.py). A second method at one of these points is a
change here, beside the first, with its test.

  adamw gradient transform   the Neumann-Gram whitening of a vocabulary table's gradient (seed 002 §2.1)
  adamw state precision      fp32 master weights and moments for bf16 params (seed 002 §2.1, §3 item 3)
  group kind                 oe_mfree, the Over-Encoding tables' moment-free update (seed 002 §2.1)
  (the polar and post-polar precision is read by muon_variant, which composes the muon stages)
"""

from __future__ import annotations

from muonlab.optim.addons.master32 import precision_for as adamw_precision_for
from muonlab.optim.addons.master32 import precision_of as adamw_precision_of
from muonlab.optim.addons.moment_free import MomentFreeKind
from muonlab.optim.addons.neumann_whitening import adamw_transform, validate_adamw_group

GROUP_KINDS = {"oe_mfree": MomentFreeKind()}  # MuonAdamW's kinds besides "muon" and "adamw"

__all__ = ["GROUP_KINDS", "adamw_precision_for", "adamw_precision_of", "adamw_transform", "validate_adamw_group"]
