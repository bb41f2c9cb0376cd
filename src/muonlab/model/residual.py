"""Seed 003's residual-addition variants, re-exported from their variant modules (library API):
branch-credit backward rules (muonlab.model.variants.residual_rules, spec-000-003 §1.E) and
forward radius gates (muonlab.model.variants.radius_gate, spec-000-003 §1.F).
"""

from muonlab.model.variants.radius_gate import RADIUS_GATES, prefix_log_rms_z, radius_gate_scale
from muonlab.model.variants.residual_rules import RESIDUAL_RULES, residual_add

__all__ = ["RADIUS_GATES", "RESIDUAL_RULES", "prefix_log_rms_z", "radius_gate_scale", "residual_add"]
