"""Seed 000's learned scalar scalings, re-exported from their variant modules (library API):
pre-sublayer channel gains (muonlab.model.variants.presub_gains, seed 000 §3.1) and post-QK-norm
scaling with its freeze mask (muonlab.model.variants.qk_scale, seed 000 §3.2, seed 002 QMASK).
"""

from muonlab.model.variants.presub_gains import PRESUB_GAINS, PRESUB_PARAMS, gain_init, gain_value
from muonlab.model.variants.qk_scale import (QK_SCALES, apply_qk_scale, qk_freeze_mask, qk_init, qk_multiplier,
                                             qk_param_shape, stop_exp)

__all__ = ["PRESUB_GAINS", "PRESUB_PARAMS", "QK_SCALES", "apply_qk_scale", "gain_init", "gain_value",
           "qk_freeze_mask", "qk_init", "qk_multiplier", "qk_param_shape", "stop_exp"]
