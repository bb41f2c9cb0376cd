"""Optimizers: MuonAdamW (the baseline) and its building blocks."""

from muonlab.optim.muon_adamw import MuonAdamW
from muonlab.optim.polar import POLAR_EXPRESS_COEFFS, polar_express

__all__ = ["MuonAdamW", "POLAR_EXPRESS_COEFFS", "polar_express"]

# the distributed variant (communication owned by the optimizer, ZeRO-1 sharded state)
from muonlab.optim.distributed import DistMuonAdamW  # noqa: E402

__all__ += ["DistMuonAdamW"]

# seed 004: AF-Muon for tied-embedding models and its clipped-row LMO
from muonlab.optim.af_muon import AFMuon, build_optimizer, gradient_sources, partition_by_role  # noqa: E402
from muonlab.optim.lmo import clipped_row_lmo  # noqa: E402

__all__ += ["AFMuon", "build_optimizer", "clipped_row_lmo", "gradient_sources", "partition_by_role"]
