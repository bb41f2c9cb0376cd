"""Moved to addons/neumann_whitening.py (seed 002 §1.4d); this name stays importable."""

from muonlab.optim.addons.neumann_whitening import (WHITEN_DEFAULTS, WHITENS, binomial_coefficients,  # noqa: F401
                                                    neumann_whiten, options, validate_group, whiten_grad)
