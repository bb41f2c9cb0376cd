"""Optimizers: MuonAdamW (the baseline) and its building blocks."""

from muonlab.optim.muon_adamw import MuonAdamW
from muonlab.optim.polar import POLAR_EXPRESS_COEFFS, polar_express

__all__ = ["MuonAdamW", "POLAR_EXPRESS_COEFFS", "polar_express"]
