"""A test's tier, derived, never written at the test.

The tiers (gpu, slurm, multiprocess, slow; else fast) decide what `make test-fast` runs and which CPU budget a
test answers to (support.budget). Nothing in a test file names them; they come from:

- **what the test uses, read at collection**: a test that asks for the `cuda` fixture (the CUDA device; its tests
  are skipped where none exists) is gpu, one that asks for the `slurm_cluster` fixture (the one-node SLURM of
  tests/slurm/local_slurm.sh) is slurm, through any fixture that asks for them too (pytest's fixture closure);
- **what the test did when the suite last measured it**, recorded in tests/suite/tiers.json by a whole-suite run
  (`make test-tiers`): a test that started a process (a subprocess, a multiprocessing process: torchrun's ranks, a
  sweep's runs, a command line in a new interpreter; a helper program such as git aside) is multiprocess, and slow instead when it cost more
  than half that tier's budget; one that entered the product's training loop, in its body or a fixture (a run, a
  sweep, a diagnostic that takes steps), or spent more than a quarter of the fast tier's budget in CPU time (its
  fixtures' setups included) is slow: `make test-fast`, the tier a developer runs on every change, stays about a
  minute on 2 cores.
  PyTorch's own CI keeps its slow tests so, as a measured list (its slow-tests.json), not as decorators.

Every run measures each test again (support.budget): a test the record calls fast that now trains, starts a process
or spends more than the fast tier's budget, itself or in its fixtures, fails the session, named, with the command that records it; a test that
carries a tier mark written by hand fails, named. The margins between the line a measurement draws and the budget a run
holds (a quarter of the fast budget, half the multiprocess one) keep a test near a line from failing a run for a
measurement's noise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

TIERS = ("gpu", "slurm", "multiprocess", "slow")  # the first a test has names its tier; none: fast
USES = {"cuda": "gpu", "slurm_cluster": "slurm"}  # fixture -> the tier of every test whose closure holds it
RECORD = Path(__file__).resolve().parents[1] / "suite" / "tiers.json"
RECORD_COMMAND = "make test-tiers"  # a whole-suite run with MUONLAB_TEST_TIERS=write


@dataclass(frozen=True)
class Measured:
    """What one test's setup and call did, as support.budget counts it (a fixture an earlier test set up included)."""

    cpu_s: float  # the call's, and its fixtures' setups
    training_loops: int
    processes: int


def measured_tier(m: Measured, budgets: dict[str, float]) -> str:
    """The tier a measurement puts a test in (a static tier, gpu or slurm, is never measured)."""
    if m.processes:
        return "multiprocess" if m.cpu_s <= budgets["multiprocess"] / 2 else "slow"
    if m.training_loops or m.cpu_s > budgets["fast"] / 4:
        return "slow"
    return "fast"


def static_tier(fixturenames) -> str | None:
    return next((USES[name] for name in fixturenames if name in USES), None)


def read_record(path: Path = RECORD) -> dict[str, str]:
    """nodeid -> tier for every recorded test that is not fast."""
    if not path.is_file():
        return {}
    return {nodeid: tier for tier, nodeids in json.loads(path.read_text()).items() for nodeid in nodeids}


def still_there(nodeid: str, root: Path) -> bool:
    """The test a record's entry names still exists: its file, and a function of its name in it."""
    path, _, rest = nodeid.partition("::")
    name = rest.split("::")[-1].split("[")[0]
    try:
        return f"def {name}(" in (root / path).read_text()
    except OSError:
        return False


def write_record(tiers: dict[str, str], path: Path = RECORD) -> None:
    grouped = {tier: sorted(n for n, t in tiers.items() if t == tier) for tier in ("multiprocess", "slow")}
    path.write_text(json.dumps(grouped, indent=0) + "\n")


def hand_written(item) -> list[str]:
    """The tier marks a test carries that the derivation did not give it (a decorator, a pytestmark, a param's)."""
    return [mark.name for mark in item.iter_markers() if mark.name in TIERS]


def assign(items, record: dict[str, str]) -> None:
    """Give each collected test its derived tier as a marker (so `-m "not slow"` selects by it). A test that writes
    a tier mark by hand fails, whatever tier is selected: its marks are taken off (so no -m leaves it out) and its call
    replaced by the failure, which names it (an error at collection would reach pytest-xdist's workers only)."""
    for item in items:
        marks = hand_written(item)
        if marks:
            _refuse(item, f"marked {', '.join(marks)} by hand: a tier is derived (tests/support/tiers.py), "
                          "remove the mark")
            continue
        name = static_tier(getattr(item, "fixturenames", ())) or record.get(item.nodeid)
        if name:
            item.add_marker(getattr(pytest.mark, name))


def _refuse(item, message: str) -> None:
    for node in item.listchain():  # the decorator's, a parameter's, the class's or the module's pytestmark
        node.own_markers[:] = [mark for mark in node.own_markers if mark.name not in TIERS]

    def refused() -> None:
        pytest.fail(f"{item.nodeid} is {message}", pytrace=False)

    item.runtest = refused
