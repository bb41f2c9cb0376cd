"""The built-in optimizer add-ons; importing this package registers each one (extensions.py)."""

from muonlab.optim.addons import hbieq, zeta, turbo_aol, muon2f, polar_precision  # noqa: F401  (muon)
from muonlab.optim.addons import neumann_whitening, master32, moment_free  # noqa: F401  (adamw, group kinds)
