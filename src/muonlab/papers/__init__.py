"""The seed papers, one pack each (`papers/<seed>/`): its arms (`arms.py`, registered with muonlab.arms.register
as a plug-in registers its own), its printed tables (`tables.json`, read by muonlab.lab.paper) and the numbers
it prints that its diagnostics show beside their own (`printed.py`).

A pack is registered here by its `__init__`; muonlab.arms imports the built-in packs (its BUILTIN_PAPER_PACKS)
by name when it is first imported, so every registered arm is there for whoever reads the registry. A new paper
is a new pack: its folder and its name in that list.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources.abc import Traversable


@dataclass(frozen=True)
class PaperPack:
    name: str  # the pack's folder, e.g. "seed004"
    paper: str  # how arms and tables name the paper, e.g. "seed 004"
    tables: Traversable | None  # its printed tables (JSON), or None


PACKS: dict[str, PaperPack] = {}


def register_pack(pack: PaperPack) -> PaperPack:
    if pack.name in PACKS and PACKS[pack.name] != pack:
        raise ValueError(f"paper pack {pack.name!r} is already registered")
    PACKS[pack.name] = pack
    return pack


def all_packs() -> dict[str, PaperPack]:
    """Every registered pack (the built-in ones are registered once muonlab.arms is imported)."""
    import muonlab.arms  # noqa: F401, PLC0415  (imports the built-in packs)

    return PACKS
