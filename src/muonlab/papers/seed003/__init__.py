"""The seed 003 pack: its arms (arms.py), its printed tables (tables.json) and its diagnostics (diagnostics/,
listed in DIAGNOSTICS)."""

from importlib import resources

from muonlab.arms import PaperPack, register_pack
from muonlab.papers.seed003 import arms  # noqa: F401  (registers the pack's arms)

DIAGNOSTICS = ("gauge", "replay")  # its `muonlab diagnose` tools (diagnostics/<tool>.py)

PACK = register_pack(PaperPack("seed003", "seed 003", resources.files(__name__) / "tables.json",
                               tuple(f"{__name__}.diagnostics.{tool}" for tool in DIAGNOSTICS)))
