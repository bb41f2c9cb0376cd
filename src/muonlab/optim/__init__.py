"""Optimizers: MuonAdamW (the baseline), its add-ons and extension registry, AF-Muon and its LMO."""

from muonlab.optim.muon_adamw import MuonAdamW
from muonlab.optim.polar import POLAR_EXPRESS_COEFFS, polar_express

__all__ = ["MuonAdamW", "POLAR_EXPRESS_COEFFS", "polar_express"]

# the built-in add-ons: the conditioners register at the extension point, the rest record their metadata
from muonlab.optim import extensions  # noqa: E402
from muonlab.optim.addons.hbieq import hbieq  # noqa: E402
from muonlab.optim.addons.master32 import MASTER32  # noqa: E402
from muonlab.optim.addons.moment_free import moment_free_step  # noqa: E402
from muonlab.optim.addons.muon2f import muon2f_precondition  # noqa: E402
from muonlab.optim.addons.neumann_whitening import neumann_whiten  # noqa: E402
from muonlab.optim.addons.turbo_aol import aol_scale  # noqa: E402
from muonlab.optim.addons.zeta import zeta_update, zeta_whiten  # noqa: E402
from muonlab.optim.extensions import PrePolar, register_prepolar  # noqa: E402
from muonlab.optim.homotopy import homotopy_alpha  # noqa: E402

__all__ += ["MASTER32", "PrePolar", "aol_scale", "extensions", "hbieq", "homotopy_alpha", "moment_free_step",
            "muon2f_precondition", "neumann_whiten", "register_prepolar", "zeta_update", "zeta_whiten"]

# the distributed variant (communication owned by the optimizer, ZeRO-1 sharded state)
from muonlab.optim.distributed import DistMuonAdamW  # noqa: E402

__all__ += ["DistMuonAdamW"]

# seed 004: AF-Muon for tied-embedding models and its clipped-row LMO
from muonlab.optim.af_muon import AFMuon, build_optimizer, gradient_sources, partition_by_role  # noqa: E402
from muonlab.optim.lmo import clipped_row_lmo  # noqa: E402

__all__ += ["AFMuon", "build_optimizer", "clipped_row_lmo", "gradient_sources", "partition_by_role"]
