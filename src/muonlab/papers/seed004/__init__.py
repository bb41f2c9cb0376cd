"""The seed 004 pack: its arms (arms.py), its printed tables (tables.json) and the numbers it prints that its
diagnostics show beside their own (printed.py), and its diagnostics (diagnostics/, listed in DIAGNOSTICS)."""

from importlib import resources

from muonlab.arms import PaperPack, register_pack
from muonlab.papers.seed004 import arms  # noqa: F401  (registers the pack's arms)

DIAGNOSTICS = ("afmuon", "reuse", "overhead", "tied_table")  # its `muonlab diagnose` tools (diagnostics/<tool>.py)

PACK = register_pack(PaperPack("seed004", "seed 004", resources.files(__name__) / "tables.json",
                               tuple(f"{__name__}.diagnostics.{tool}" for tool in DIAGNOSTICS)))
