"""Each seed paper is one pack (muonlab.papers.<seed>): its arms, its printed tables and its printed
diagnostics live there, registered through the registries a plug-in uses; the arms registry names no paper."""

from __future__ import annotations

import json
import re
from pathlib import Path

import muonlab
from muonlab.arms import ARMS, BUILTIN_PAPER_PACKS
from muonlab.lab.paper.tables import load_tables
from muonlab.papers import all_packs

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
