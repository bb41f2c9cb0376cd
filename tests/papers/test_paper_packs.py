"""Each seed paper is one pack (muonlab.papers.<seed>): its arms, its printed tables, its printed numbers and its
diagnostics live there, registered through the registries a plug-in uses; the arms registry names no paper."""

from __future__ import annotations

import json
import re
from pathlib import Path

import muonlab
from muonlab.arms import ARMS, BUILTIN_PAPER_PACKS, all_packs
from muonlab.lab.paper.tables import load_tables

SRC = Path(muonlab.__file__).parent


def test_every_paper_arm_is_registered_by_its_own_pack():
    packs = all_packs()
    assert sorted(packs) == sorted(BUILTIN_PAPER_PACKS)
    for pack in packs.values():
        source = (SRC / "papers" / pack.name / "arms.py").read_text()
        own = [name for name, arm in ARMS.items() if arm.paper == pack.paper]
        assert own, pack.name
        # a name built in a loop appears as its stem; every arm of the paper is made in its pack's file
        stems = set(re.findall(r'"([A-Za-z0-9_]+?)(?:_\{|")', source)) | set(re.findall(r'f"([a-z0-9]+)_', source))
        assert all(any(name.startswith(stem) for stem in stems) for name in own), pack.name
    registry = (SRC / "arms.py").read_text()
    assert not re.search(r"seed 00[0-4]", registry)  # the registry names no paper


def test_each_packs_tables_are_its_papers_and_compare_its_arms():
    tables = load_tables()
    for pack in all_packs().values():
        raw = json.loads(pack.tables.read_text())
        assert raw["paper"] == pack.paper
        for t in raw["tables"]:
            arms = {arm.arm for arm in tables[t["id"]].arms}
            assert all(ARMS[a].paper in (pack.paper, "autoresearch 228791f", None) for a in arms), (t["id"], arms)
    assert len(tables) == sum(len(json.loads(p.tables.read_text())["tables"]) for p in all_packs().values())


def test_each_packs_diagnostics_are_its_own_and_nothing_else_imports_a_pack():
    """A pack's diagnose tools live in its folder; no module outside muonlab/papers/ imports a pack (the
    arms registry imports the built-in ones by name, and `diagnose` finds their tools through the registry)."""
    from muonlab.diagnostics import commands

    listed = [module for pack in all_packs().values() for module in pack.diagnostics]
    for pack in all_packs().values():
        assert pack.diagnostics, pack.name  # every seed paper has its diagnostics
        for module in pack.diagnostics:
            assert module.startswith(f"muonlab.papers.{pack.name}.diagnostics."), module
    assert len(commands()) == len(listed)
    assert not [p.name for p in (SRC / "diagnostics").glob("*.py")
                if p.name not in ("__init__.py", "runs.py", "run_selection.py")]  # the shared harness only
    importer = re.compile(r"^\s*(from|import) muonlab\.papers\b", re.M)
    outside = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
               if "papers" not in p.relative_to(SRC).parts and importer.search(p.read_text())]
    assert outside == []
