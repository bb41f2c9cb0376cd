"""The seed 002 pack: its arms (arms.py), its printed tables (tables.json) and the numbers it prints that its
diagnostics show beside their own (printed.py), and its diagnostics (diagnostics/, listed in DIAGNOSTICS)."""

from importlib import resources

from muonlab.arms import PaperPack, register_pack
from muonlab.papers.seed002 import arms  # noqa: F401  (registers the pack's arms)

DIAGNOSTICS = ("step0_audit", "step0_trajectory", "accounting", "audit_tables")  # its `muonlab diagnose` tools (diagnostics/<tool>.py)

PACK = register_pack(PaperPack("seed002", "seed 002", resources.files(__name__) / "tables.json",
                               tuple(f"{__name__}.diagnostics.{tool}" for tool in DIAGNOSTICS)))
