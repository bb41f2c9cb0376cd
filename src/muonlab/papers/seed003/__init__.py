"""The seed 003 pack: its arms (arms.py) and its printed tables (tables.json)."""

from importlib import resources

from muonlab.papers import PaperPack, register_pack
from muonlab.papers.seed003 import arms  # noqa: F401  (registers the pack's arms)

PACK = register_pack(PaperPack("seed003", "seed 003", resources.files(__name__) / "tables.json"))
