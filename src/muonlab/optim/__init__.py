"""Optimizers: MuonAdamW (the baseline) and its building blocks."""

from muonlab.optim.muon_adamw import MuonAdamW
from muonlab.optim.polar import POLAR_EXPRESS_COEFFS, polar_express

__all__ = ["MuonAdamW", "POLAR_EXPRESS_COEFFS", "polar_express"]

# the distributed variant (communication owned by the optimizer, ZeRO-1 sharded state)
from muonlab.optim.distributed import DistMuonAdamW  # noqa: E402

__all__ += ["DistMuonAdamW"]
