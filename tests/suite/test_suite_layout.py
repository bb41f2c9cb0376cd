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


def test_files_start_costliest_first_each_files_tests_in_their_order(monkeypatch, tmp_path):
    """heaviest_files_first: files ordered by their measured cost (a file the costs do not name, by its tests'
    tiers), a file's own tests kept in order."""
    import json

    from support import budget

    class Item:
        def __init__(self, nodeid, mark=None):
            self.nodeid, self.mark = nodeid, mark

        def get_closest_marker(self, name):
            return name if name == self.mark else None

    costs = tmp_path / "file_costs.json"
    costs.write_text(json.dumps({"a.py": 1.0, "b.py": 50.0}))
    monkeypatch.setattr(budget, "FILE_COSTS", costs)
    items = [Item("a.py::t1"), Item("a.py::t2"), Item("c.py::t1", "slurm"), Item("b.py::t1"), Item("b.py::t2")]
    budget.heaviest_files_first(items)
    assert [i.nodeid for i in items] == ["b.py::t1", "b.py::t2", "c.py::t1", "a.py::t1", "a.py::t2"]
