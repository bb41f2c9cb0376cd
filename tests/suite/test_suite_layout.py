"""The suite's own rules: tests are laid out like src/ (tests/<area>/ for muonlab.<area>), no test module
imports another (shared helpers live in tests/support, fixtures in conftest.py)."""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_test_module_imports_another():
    test_modules = {p.stem for p in TESTS.rglob("test_*.py")} | {"conftest"}
    offenders = {p.name: sorted(_imported_modules(p) & test_modules)
                 for p in sorted(TESTS.rglob("test_*.py")) if _imported_modules(p) & test_modules}
    support = {p.name: sorted(_imported_modules(p) & test_modules) for p in (TESTS / "support").glob("*.py")
               if _imported_modules(p) & test_modules}
    assert not offenders and not support, {**offenders, **support}


# folders that are not a muonlab module: the shared helpers and data, and tests of the whole package
NOT_AN_AREA = {"support": "shared helpers", "golden": "recorded numbers", "slurm": "the local SLURM",
               "package": "the package as a whole: layers, installs, requirements, public API",
               "docs": "the docs' examples", "suite": "the suite's own rules"}


def test_tests_are_laid_out_like_src():
    """Each test file sits in tests/<area>/, <area> a module or package of muonlab (or a folder named in
    NOT_AN_AREA); none at the top, and two files never share a name (pytest imports them by basename)."""
    import muonlab

    src = Path(muonlab.__file__).resolve().parent
    areas = {p.stem for p in src.glob("*.py")} | {p.name for p in src.iterdir() if (p / "__init__.py").exists()}
    files = sorted(TESTS.rglob("test_*.py"))
    assert not [p.name for p in files if p.parent == TESTS]
    misplaced = sorted({p.relative_to(TESTS).parts[0] for p in files} - areas - set(NOT_AN_AREA))
    assert misplaced == []
    names = [p.name for p in files]
    assert len(names) == len(set(names))
    assert len(files) > 100  # the walk saw the suite


BUDGETED = '''
import time

import pytest
from support.budget import TierBudget


def pytest_configure(config):
    config.pluginmanager.register(TierBudget(), "muonlab-tier-budget")
'''
BURN = "import time\n\ndef burn(seconds):\n    end = time.process_time() + seconds\n    while time.process_time() < end:\n        pass\n"


@pytest.mark.slow
def test_a_fast_test_over_the_budget_fails_the_session_and_a_slow_one_does_not(pytester, monkeypatch):
    """The budget counts CPU seconds: a fast test burning more than its tier's budget fails the run (and is
    named), the same test marked slow passes, and sleeping (a loaded machine's wall time) costs nothing."""
    import shutil

    shutil.copytree(TESTS / "support", pytester.path / "support")
    pytester.makeconftest(BUDGETED)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    multiprocess: multiprocess\n")
    from support.budget import FAST_BUDGET_CPU_S

    monkeypatch.setenv("MUONLAB_TEST_BUDGET_SCALE", str(0.2 / FAST_BUDGET_CPU_S))  # a budget of 0.2 CPU s
    monkeypatch.syspath_prepend(str(pytester.path))
    pytester.makepyfile(test_fast=BURN + "\ndef test_burns():\n    burn(0.6)\n\n"
                                  "def test_sleeps():\n    time.sleep(0.6)\n")
    run = pytester.runpytest("-p", "no:cacheprovider")
    assert run.ret == 1, run.stdout.str()
    run.stdout.fnmatch_lines(["*1 fast test(s) over the fast tier's budget of 0.2 CPU s*", "*test_fast.py::test_burns*"])
    assert "test_fast.py::test_sleeps" not in run.stdout.str().split("over the fast tier")[1]
    pytester.makepyfile(test_fast="import pytest\n" + BURN + "\n@pytest.mark.slow\ndef test_burns():\n    burn(0.6)\n")
    run = pytester.runpytest("-p", "no:cacheprovider")
    assert run.ret == 0, run.stdout.str()
    run.stdout.fnmatch_lines(["*slowest 10 tests*", "*slow*test_fast.py::test_burns*"])
    # the multi-process tier has its own budget (scaled to 0.2 CPU s here): a test over it fails the run too
    from support.budget import TIER_BUDGET_CPU_S

    monkeypatch.setenv("MUONLAB_TEST_BUDGET_SCALE", str(0.2 / TIER_BUDGET_CPU_S["multiprocess"]))
    pytester.makepyfile(test_fast="import pytest\n" + BURN + "\n@pytest.mark.multiprocess\ndef test_burns():\n"
                                  "    burn(0.6)\n")
    run = pytester.runpytest("-p", "no:cacheprovider")
    assert run.ret == 1, run.stdout.str()
    run.stdout.fnmatch_lines(["*1 multiprocess test(s) over the multiprocess tier's budget of 0.2 CPU s*"])


TRAINS = ("from muonlab.train.loop import train_loop\n\n"  # held by the test module before the plug-in counts it
          "def trains():\n    try:\n        train_loop(None, None, None, None, None, 0)\n"
          "    except Exception:\n        pass  # entered the loop: what the rule counts\n")


@pytest.mark.slow
def test_a_fast_test_that_enters_the_training_loop_fails_the_session(pytester, monkeypatch):
    """What a test uses decides its tier: an unmarked test that runs the training loop (in its body or a fixture,
    through a name imported before the suite started counting) fails the session and is named; marked slow, it
    passes."""
    import shutil

    shutil.copytree(TESTS / "support", pytester.path / "support")
    pytester.makeconftest(BUDGETED)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    multiprocess: multiprocess\n")
    monkeypatch.syspath_prepend(str(pytester.path))
    from muonlab.train import loop

    def uncounted(*args, **kwargs):  # as a new process has it: this process's own session counts the real one already
        raise TypeError("not a run")

    monkeypatch.setattr(loop, "train_loop", uncounted)
    fixture = "@pytest.fixture\ndef run():\n    trains()\n\n"
    pytester.makepyfile(test_fast="import pytest\n" + TRAINS + "\n" + fixture + "def test_in_body():\n    trains()\n\n"
                                  "def test_in_fixture(run):\n    pass\n\ndef test_pure():\n    pass\n")
    run = pytester.runpytest("-p", "no:cacheprovider")
    assert run.ret == 1, run.stdout.str()
    run.stdout.fnmatch_lines(["*2 fast test(s) ran the training loop (mark them slow)*", "*test_fast.py::test_in_body*",
                              "*test_fast.py::test_in_fixture*"])
    assert "test_pure" not in run.stdout.str().split("ran the training loop")[1]
    pytester.makepyfile(test_fast="import pytest\n" + TRAINS + "\n" + fixture + "@pytest.mark.slow\ndef test_in_body():\n"
                                  "    trains()\n\n@pytest.mark.slow\ndef test_in_fixture(run):\n    pass\n")
    run = pytester.runpytest("-p", "no:cacheprovider")
    assert run.ret == 0, run.stdout.str()
    assert "ran the training loop" not in run.stdout.str()
    # a module fixture that trains is set up by the first test asking for it: an unmarked test after it trained too
    shared = "@pytest.fixture(scope='module')\ndef run():\n    trains()\n\n"
    pytester.makepyfile(test_fast="import pytest\n" + TRAINS + "\n" + shared + "@pytest.mark.slow\ndef test_first(run):\n"
                                  "    pass\n\ndef test_after(run):\n    pass\n")
    pytester.makepyfile(test_other="import pytest\n\n@pytest.fixture\ndef run():\n    pass\n\n"  # same name, no run
                                   "def test_mine(run):\n    pass\n")
    run = pytester.runpytest("-p", "no:cacheprovider")
    assert run.ret == 1, run.stdout.str()
    run.stdout.fnmatch_lines(["*1 fast test(s) ran the training loop (mark them slow)*", "*test_fast.py::test_after*"])
    assert "test_mine" not in run.stdout.str().split("ran the training loop")[1]

def test_units_start_costliest_first_each_units_tests_in_their_order(monkeypatch, tmp_path):
    """heaviest_units_first: work units (a file, or a test of a file marked spread) ordered by their measured
    cost (a unit the costs do not name, by its tests' tiers), a unit's own tests kept in order."""
    import json

    from support import budget

    class Item:
        def __init__(self, nodeid, mark=None):
            self.nodeid, self.mark = nodeid, mark

        def get_closest_marker(self, name):
            return name if name == self.mark else None

    for name in "abc":
        (tmp_path / f"{name}.py").write_text("import pytest\n\npytestmark = pytest.mark.slow\n")
    (tmp_path / "s.py").write_text("import pytest\n\npytestmark = [pytest.mark.slow, pytest.mark.spread]\n")
    costs = tmp_path / "unit_costs.json"
    costs.write_text(json.dumps({"a.py": 1.0, "b.py": 50.0, "s.py::t[2]": 60.0, "s.py::t[1]": 0.5}))
    monkeypatch.setattr(budget, "UNIT_COSTS", costs)
    items = [Item("a.py::t1"), Item("a.py::t2"), Item("c.py::t1", "slurm"), Item("b.py::t1"), Item("b.py::t2"),
             Item("s.py::t[1]"), Item("s.py::t[2]")]
    budget.heaviest_units_first(items, tmp_path)
    assert [i.nodeid for i in items] == ["s.py::t[2]", "b.py::t1", "b.py::t2", "c.py::t1", "a.py::t1", "a.py::t2",
                                         "s.py::t[1]"]


def test_spread_is_read_from_the_files_own_mark_and_the_suites_files_say_it_so():
    """The scheduler reads `spread` from a file's source (it never imports test files): every file whose tests
    carry the mark declares it in its module-level pytestmark, where the source reading finds it."""
    from support.budget import spread_file

    import re

    declared = re.compile(r"^pytestmark = .*pytest\.mark\.spread", re.M)
    files = [p for p in sorted(TESTS.rglob("test_*.py")) if p != Path(__file__).resolve()]  # here: in a string
    assert [p for p in files if spread_file(p)] == [p for p in files if declared.search(p.read_text())] != []
    assert not spread_file(Path(__file__).resolve())


SPREAD_SUITE = {
    # the two tests of a spread file run at once, on two workers: each waits until both have started (marked slow,
    # they are the costliest units and start first: xdist hands a worker a second unit at once while its first
    # holds two tests or fewer, so cheaper units first could queue both behind one worker's)
    "test_spread": """
import os, time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spread, pytest.mark.slow]


def _both_started(name):
    here = Path(os.environ["SPREAD_DIR"])
    (here / f"started-{name}").write_text(os.environ["PYTEST_XDIST_WORKER"])
    deadline = time.monotonic() + 120  # a bound on a failure, not a guess: the other test starts at once or never
    while not (here / "started-a").exists() or not (here / "started-b").exists():
        assert time.monotonic() < deadline, "the other test of the spread file never started beside this one"
        time.sleep(0.05)


@pytest.mark.parametrize("name", ["a", "b"])
def test_waits_for_the_other(name):
    _both_started(name)
""",
    # a file not marked spread is one unit: its tests run on one worker (a module fixture is built once)
    "test_whole": """
import os
from pathlib import Path

import pytest


@pytest.mark.parametrize("n", range(4))
def test_says_its_worker(n):
    (Path(os.environ["SPREAD_DIR"]) / f"whole-{n}").write_text(os.environ["PYTEST_XDIST_WORKER"])
""",
}
SCHEDULED = """
import pytest
from support.budget import heaviest_units_first


def pytest_collection_modifyitems(config, items):
    heaviest_units_first(items, config.rootpath)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from support.scheduling import make_scheduler

    return make_scheduler(config, log)
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_spread_file_runs_its_tests_on_several_workers_and_a_whole_file_on_one(pytester, monkeypatch, tmp_path):
    """`make test`'s scheduling (support.scheduling.make_scheduler, as conftest.py calls it), on two workers: the two tests of a spread file wait for each
    other (they pass only side by side), a plain file's tests all run on one worker."""
    import shutil

    shutil.copytree(TESTS / "support", pytester.path / "support")
    pytester.makeconftest(SCHEDULED)
    pytester.makeini("[pytest]\nmarkers =\n    spread: spread\n    slow: slow\n")
    pytester.makepyfile(**SPREAD_SUITE)
    monkeypatch.setenv("SPREAD_DIR", str(tmp_path))
    run = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "-q")
    assert run.ret == 0, run.stdout.str()[-3000:]
    run.stdout.fnmatch_lines(["*6 passed*"])
    assert {(tmp_path / f"started-{n}").read_text() for n in "ab"} == {"gw0", "gw1"}
    assert len({(tmp_path / f"whole-{n}").read_text() for n in range(4)}) == 1  # split, they would start on both
