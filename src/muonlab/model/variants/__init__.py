"""The built-in model variants, one module per method family; importing registers them.

Registration order is the order of their optimizer groups (after x0_lambdas), as before.
"""

from muonlab.model.variants import routing  # noqa: F401  (seed 002, first: its groups precede the tables')
from muonlab.model.variants import over_encoding  # noqa: F401  (seed 002)
from muonlab.model.variants import presub_gains  # noqa: F401  (seed 000)
from muonlab.model.variants import qk_scale  # noqa: F401  (seed 000, seed 002's QMASK)
from muonlab.model.variants import lerope  # noqa: F401  (seed 000)
from muonlab.model.variants import radius_gate  # noqa: F401  (seed 003)
from muonlab.model.variants import residual_rules  # noqa: F401  (seed 003)
from muonlab.model.variants import memory  # noqa: F401  (seed 003)
