"""The seed 000 pack: its arms (arms.py), its printed tables (tables.json) and the numbers it prints that its
diagnostics show beside their own (printed.py)."""

from importlib import resources

from muonlab.papers import PaperPack, register_pack
from muonlab.papers.seed000 import arms  # noqa: F401  (registers the pack's arms)

PACK = register_pack(PaperPack("seed000", "seed 000", resources.files(__name__) / "tables.json"))
