"""LeRoPE (seed 000 §4.2), re-exported from its variant module muonlab.model.variants.lerope."""

from muonlab.model.variants.lerope import (VARIANTS, apply_lerope, inv_frequencies, lerope_angles,
                                           lerope_grad_agreement)

__all__ = ["VARIANTS", "apply_lerope", "inv_frequencies", "lerope_angles", "lerope_grad_agreement"]
