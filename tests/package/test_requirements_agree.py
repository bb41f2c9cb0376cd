"""pyproject.toml's ranges, the floor (requirements/floor.txt: the lowest of each range) and the lock
(requirements/lock.txt + torch.txt: the exact tested set) say the same thing about every dependency."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).parents[2]


def _pins(path: Path) -> dict[str, Version]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[canonicalize_name(name)] = Version(version)
    return out


def _declared() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(d) for d in project["dependencies"]]
    reqs += [Requirement(d) for name, ds in project["optional-dependencies"].items() if name not in ("all", "sinks")
             for d in ds]
    return {canonicalize_name(r.name): r for r in reqs}


def test_the_floor_pins_the_lowest_version_of_every_range_and_nothing_else():
    declared, floor = _declared(), _pins(ROOT / "requirements" / "floor.txt")
    assert set(floor) == set(declared)
    for name, req in declared.items():
        lowest = [Version(s.version) for s in req.specifier if s.operator == ">="]
        assert floor[name] == lowest[0], name


def test_the_lock_holds_every_dependency_inside_its_range():
    declared = _declared()
    lock = {**_pins(ROOT / "requirements" / "lock.txt"), **_pins(ROOT / "requirements" / "torch.txt")}
    for name, req in declared.items():
        assert name in lock and lock[name] in req.specifier, (name, lock.get(name), str(req.specifier))
