"""Moved to addons/moment_free.py (seed 002 §1.3, §1.11); this name stays importable."""

from muonlab.optim.addons.moment_free import (OE_MFREE_DEFAULTS, OE_TABLE_ROWS, moment_free_step,  # noqa: F401
                                              oe_learning_rate, state_bytes, table_neumann_beta)
