"""The suite's own rules: tests are laid out like src/ (tests/<area>/ for muonlab.<area>), no test module
imports another (shared helpers live in tests/support, fixtures in conftest.py)."""

import ast
import json
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


BUDGETED = """
from pathlib import Path

import pytest
from support.budget import TierBudget


def pytest_configure(config):  # this suite's own record (the suite running it imported support first)
    config.pluginmanager.register(TierBudget(Path(__file__).parent / "suite" / "tiers.json"), "muonlab-tier-budget")


@pytest.fixture
def cuda():
    pytest.skip("needs a CUDA device")


@pytest.fixture(scope="module")
def slurm_cluster():
    return "a cluster"
"""
MARKERS = "[pytest]\nmarkers =\n" + "".join(f"    {t}: {t}\n" for t in ("slow", "multiprocess", "gpu", "slurm"))
BURN = ("import time\n\ndef burn(seconds):\n    end = time.process_time() + seconds\n"
        "    while time.process_time() < end:\n        pass\n")
TRAINS = ("from muonlab.train.loop import train_loop\n\n"  # held by the test module before the plug-in counts it
          "def trains():\n    try:\n        train_loop(None, None, None, None, None, 0)\n"
          "    except Exception:\n        pass  # entered the loop: what the rule counts\n")
STARTS = "import subprocess, sys\n\ndef starts():\n    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"


def _suite(pytester, monkeypatch, **files):
    """A small suite under the plug-in, with its own record (suite/tiers.json)."""
    (pytester.path / "suite").mkdir()
    pytester.makeconftest(BUDGETED)
    pytester.makeini(MARKERS)
    monkeypatch.delenv("MUONLAB_TEST_TIERS", raising=False)
    monkeypatch.delenv("MUONLAB_TEST_BUDGET", raising=False)
    pytester.makepyfile(**files)
    return pytester.path / "suite" / "tiers.json"


def _run(pytester, *args, record=False, monkeypatch):
    with monkeypatch.context() as m:
        if record:
            m.setenv("MUONLAB_TEST_TIERS", "write")
        return pytester.runpytest("-p", "no:cacheprovider", *args)


def test_a_test_over_its_tier_s_budget_fails_the_session_until_the_record_gives_it_its_tier(pytester, monkeypatch):
    """The budget counts CPU seconds: a test recorded fast (or not recorded) burning more than the fast tier's
    budget fails the run, named, with the command that records it; sleeping (a loaded machine's wall time) costs
    nothing; the recording run measures it slow, passes, and from then on the test is slow: it passes, and
    `-m "not slow"` leaves it out. A test recorded multiprocess answers to that tier's budget."""
    from support.budget import FAST_BUDGET_CPU_S, TIER_BUDGET_CPU_S

    monkeypatch.setenv("MUONLAB_TEST_BUDGET_SCALE", str(0.2 / FAST_BUDGET_CPU_S))  # a budget of 0.2 CPU s
    record = _suite(pytester, monkeypatch, test_fast=BURN + "\ndef test_burns():\n    burn(0.6)\n\n"
                                                              "def test_sleeps():\n    time.sleep(0.6)\n")
    run = _run(pytester, monkeypatch=monkeypatch)
    assert run.ret == 1, run.stdout.str()
    run.stdout.fnmatch_lines(["*1 fast test(s) over the fast tier's budget of 0.2 CPU s (record their tiers with "
                              "`make test-tiers`*", "*test_fast.py::test_burns*"])
    assert "test_fast.py::test_sleeps" not in run.stdout.str().split("over the fast tier")[1]
    run = _run(pytester, record=True, monkeypatch=monkeypatch)
    assert run.ret == 0, run.stdout.str()
    assert json.loads(record.read_text()) == {"multiprocess": [], "slow": ["test_fast.py::test_burns"]}
    run = _run(pytester, monkeypatch=monkeypatch)
    assert run.ret == 0, run.stdout.str()
    run.stdout.fnmatch_lines(["*slowest 10 tests*", "*slow*test_fast.py::test_burns*"])
    _run(pytester, "-m", "not slow", monkeypatch=monkeypatch).assert_outcomes(passed=1, deselected=1)
    # a recording run that leaves a test out (-k, or a skip on this machine) keeps the test's entry while it exists
    assert _run(pytester, "-k", "sleeps", record=True, monkeypatch=monkeypatch).ret == 0
    assert json.loads(record.read_text()) == {"multiprocess": [], "slow": ["test_fast.py::test_burns"]}
    pytester.makepyfile(test_fast=BURN + "\ndef test_renamed():\n    burn(0.6)\n\ndef test_sleeps():\n    pass\n")
    assert _run(pytester, "-k", "sleeps", record=True, monkeypatch=monkeypatch).ret == 0
    assert json.loads(record.read_text()) == {"multiprocess": [], "slow": []}
    # a module fixture's setup counts for every test that uses it, whichever test set it up
    pytester.makepyfile(test_fast="import pytest\n" + BURN + "\n@pytest.fixture(scope='module')\ndef costly():\n"
                                  "    burn(0.6)\n\ndef test_first(costly):\n    pass\n\n"
                                  "def test_second(costly):\n    pass\n")
    run = _run(pytester, monkeypatch=monkeypatch)
    assert run.ret == 1, run.stdout.str()
    run.stdout.fnmatch_lines(["*2 fast test(s) trained, started a process or set up costly fixtures*",
                              "*test_fast.py::test_first (its fixtures took 0.6 CPU s)*",
                              "*test_fast.py::test_second (its fixtures took 0.6 CPU s)*"])
    assert _run(pytester, record=True, monkeypatch=monkeypatch).ret == 0
    assert json.loads(record.read_text())["slow"] == ["test_fast.py::test_first", "test_fast.py::test_second"]
    # the multi-process tier has its own budget (scaled to 0.2 CPU s here): a test over it fails the run too
    monkeypatch.setenv("MUONLAB_TEST_BUDGET_SCALE", str(0.2 / TIER_BUDGET_CPU_S["multiprocess"]))
    pytester.makepyfile(test_fast=BURN + "\ndef test_burns():\n    burn(0.6)\n")
    record.write_text(json.dumps({"multiprocess": ["test_fast.py::test_burns"]}))
    run = _run(pytester, monkeypatch=monkeypatch)
    assert run.ret == 1, run.stdout.str()
    run.stdout.fnmatch_lines(["*1 multiprocess test(s) over the multiprocess tier's budget of 0.2 CPU s*"])


def test_a_test_that_trains_or_starts_a_process_outside_its_tier_fails_the_session(pytester, monkeypatch):
    """What a test does decides its tier: a test the record calls fast that runs the training loop (in its body or
    a fixture, through a name imported before the suite started counting) or starts a process fails the session,
    named; the recording run makes the first slow and the second multiprocess, and the session passes."""
    from muonlab.train import loop

    def uncounted(*args, **kwargs):  # as a new process has it: this process's own session counts the real one already
        raise TypeError("not a run")

    monkeypatch.setattr(loop, "train_loop", uncounted)
    fixture = "@pytest.fixture\ndef run():\n    trains()\n\n"
    record = _suite(pytester, monkeypatch, test_fast="import pytest\n" + TRAINS + STARTS + "\n" + fixture
                    + "def test_in_body():\n    trains()\n\ndef test_in_fixture(run):\n    pass\n\n"
                    + "def test_starts():\n    starts()\n\ndef test_pure():\n    pass\n")
    run = _run(pytester, monkeypatch=monkeypatch)
    assert run.ret == 1, run.stdout.str()
    run.stdout.fnmatch_lines(["*3 fast test(s) trained, started a process or set up costly fixtures (record their "
                              "tiers with `make test-tiers`)*",
                              "*test_fast.py::test_in_body (trained 1)*", "*test_fast.py::test_in_fixture (trained 1)*",
                              "*test_fast.py::test_starts (started processes 1)*"])
    assert "test_pure" not in run.stdout.str().split("set up costly fixtures")[1]
    assert _run(pytester, record=True, monkeypatch=monkeypatch).ret == 0
    assert json.loads(record.read_text()) == {"multiprocess": ["test_fast.py::test_starts"],
                                              "slow": ["test_fast.py::test_in_body", "test_fast.py::test_in_fixture"]}
    run = _run(pytester, monkeypatch=monkeypatch)
    assert run.ret == 0, run.stdout.str()
    assert "set up costly fixtures" not in run.stdout.str()
    _run(pytester, "-m", "not slow and not multiprocess", monkeypatch=monkeypatch).assert_outcomes(passed=1,
                                                                                                deselected=3)
    # a module fixture that trains is set up by the first test asking for it: a test after it trained too
    shared = "@pytest.fixture(scope='module')\ndef run():\n    trains()\n\n"
    pytester.makepyfile(test_fast="import pytest\n" + TRAINS + "\n" + shared + "def test_in_fixture(run):\n"
                                  "    pass\n\ndef test_after(run):\n    pass\n")
    pytester.makepyfile(test_other="import pytest\n\n@pytest.fixture\ndef run():\n    pass\n\n"  # same name, no run
                                   "def test_mine(run):\n    pass\n")
    run = _run(pytester, monkeypatch=monkeypatch)
    assert run.ret == 1, run.stdout.str()
    run.stdout.fnmatch_lines(["*1 fast test(s) trained, started a process or set up costly fixtures*",
                              "*test_fast.py::test_after (trained 1)*"])
    assert "test_mine" not in run.stdout.str().split("set up costly fixtures")[1]


def test_a_tier_is_derived_from_what_a_test_uses_and_never_written_by_hand(pytester, monkeypatch):
    """A test that asks for the `cuda` fixture (itself or through another fixture) is gpu, one that asks for
    `slurm_cluster` is slurm, neither measured nor recorded; a test that carries a tier mark written by hand fails,
    named, whichever tiers are selected."""
    record = _suite(pytester, monkeypatch, test_uses="import pytest\n\n@pytest.fixture\ndef on_gpu(cuda):\n"
                    "    return cuda\n\ndef test_gpu(on_gpu):\n    pass\n\n"
                    "def test_cluster(slurm_cluster):\n    pass\n\ndef test_plain():\n    pass\n")
    _run(pytester, "-m", "gpu", monkeypatch=monkeypatch).assert_outcomes(skipped=1, deselected=2)
    _run(pytester, "-m", "slurm", monkeypatch=monkeypatch).assert_outcomes(passed=1, deselected=2)
    assert _run(pytester, record=True, monkeypatch=monkeypatch).ret == 0
    assert record.read_text().count("test_uses.py") == 0  # their tiers are static: never recorded
    for marked in ("@pytest.mark.slow\ndef test_x():\n    pass\n",
                   "pytestmark = pytest.mark.multiprocess\n\ndef test_x():\n    pass\n",
                   "@pytest.mark.parametrize('n', [pytest.param(1, marks=pytest.mark.gpu)])\ndef test_x(n):\n    pass\n"):
        pytester.makepyfile(test_uses="import pytest\n\n" + marked)
        for selected in ("", "not slow and not multiprocess and not gpu"):  # no selection leaves it out
            run = _run(pytester, "-m", selected, monkeypatch=monkeypatch)
            assert run.ret == pytest.ExitCode.TESTS_FAILED, run.stdout.str()
            run.stdout.fnmatch_lines(["*test_uses.py::test_x* is marked * by hand: a tier is derived*remove the mark"])


def test_only_the_session_asked_to_writes_the_record(monkeypatch):
    """MUONLAB_TEST_TIERS and MUONLAB_TEST_COSTS are read once, by the session's plug-in, and taken out of the
    environment: a session a test starts (a pytest in a new interpreter) cannot write the suite's files."""
    import os

    from support.budget import TierBudget

    monkeypatch.setenv("MUONLAB_TEST_TIERS", "write")
    monkeypatch.setenv("MUONLAB_TEST_COSTS", "write")
    plugin = TierBudget()
    assert plugin.writing_record and plugin.writing_costs
    assert "MUONLAB_TEST_TIERS" not in os.environ and "MUONLAB_TEST_COSTS" not in os.environ
    assert not TierBudget().writing_record


def test_the_suite_s_record_names_collected_tests_and_the_files_write_no_tier_by_hand():
    """tests/suite/tiers.json, the record `make test-tiers` wrote, holds only the two measured tiers and tests that
    exist, and no test file of the suite writes a tier mark (its tests would fail: the check above)."""
    import re

    from support.tiers import RECORD, still_there

    recorded = json.loads(RECORD.read_text())
    assert set(recorded) == {"multiprocess", "slow"} and all(recorded.values())
    gone = [nodeid for nodeids in recorded.values() for nodeid in nodeids if not still_there(nodeid, TESTS.parent)]
    assert gone == [], f"recorded tests that no longer exist (make test-tiers drops them): {gone}"
    by_hand = re.compile(r"^\s*(@pytest\.mark\.(slow|multiprocess|gpu|slurm)\b|pytestmark = .*pytest\.mark\."
                         r"(slow|multiprocess|gpu|slurm)\b)", re.M)
    files = [p for p in sorted(TESTS.rglob("test_*.py")) if p != Path(__file__).resolve()]  # here: in strings
    assert [p.name for p in files if by_hand.search(p.read_text())] == []


def test_units_start_costliest_first_each_units_tests_in_their_order(monkeypatch, tmp_path):
    """heaviest_units_first: work units (a file, or a test of a file marked spread) ordered by their measured
    cost (a unit the costs do not name, by its tests' tiers), a unit's own tests kept in order."""
    from support import budget

    class Item:
        def __init__(self, nodeid, mark=None):
            self.nodeid, self.mark = nodeid, mark

        def get_closest_marker(self, name):
            return name if name == self.mark else None

    for name in "abc":
        (tmp_path / f"{name}.py").write_text("import pytest\n")
    (tmp_path / "s.py").write_text("import pytest\n\npytestmark = pytest.mark.spread\n")
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
    # the two tests of a spread file run at once, on two workers: each waits until both have started (their costs,
    # in SPREAD_COSTS, make them the costliest units: they start first; xdist hands a worker a second unit at once
    # while its first holds two tests or fewer, so cheaper units first could queue both behind one worker's)
    "test_spread": """
import os, time
from pathlib import Path

import pytest

pytestmark = pytest.mark.spread


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
SPREAD_COSTS = {f"test_spread.py::test_waits_for_the_other[{name}]": 60.0 for name in "ab"}
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


def test_a_spread_file_runs_its_tests_on_several_workers_and_a_whole_file_on_one(pytester, monkeypatch, tmp_path):
    """`make test`'s scheduling (support.scheduling.make_scheduler, as conftest.py calls it), on two workers: the two tests of a spread file wait for each
    other (they pass only side by side), a plain file's tests all run on one worker."""
    import shutil

    shutil.copytree(TESTS / "support", pytester.path / "support")
    pytester.makeconftest(SCHEDULED)
    pytester.makeini("[pytest]\nmarkers =\n    spread: spread\n")
    (pytester.path / "suite").mkdir()
    (pytester.path / "suite" / "unit_costs.json").write_text(json.dumps(SPREAD_COSTS))  # support.budget.UNIT_COSTS
    pytester.makepyfile(**SPREAD_SUITE)
    monkeypatch.setenv("SPREAD_DIR", str(tmp_path))
    run = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "-q")
    assert run.ret == 0, run.stdout.str()[-3000:]
    run.stdout.fnmatch_lines(["*6 passed*"])
    assert {(tmp_path / f"started-{n}").read_text() for n in "ab"} == {"gw0", "gw1"}
    assert len({(tmp_path / f"whole-{n}").read_text() for n in range(4)}) == 1  # split, they would start on both
