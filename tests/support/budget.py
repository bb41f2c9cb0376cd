"""The suite's time budget, held by the suite itself.

Each test's call is measured in CPU seconds (this process's user + system time, plus its waited-for
children's and the sweep runs its warm server forked): on a machine busy with other work a test's wall time grows with the load, its CPU time
hardly does, so the check holds on a loaded laptop and still catches a test that got expensive. A test's
tier is derived (support.tiers: what it uses, and what it did when the suite last measured it); a test over its
tier's budget (TIER_BUDGET_CPU_S: fast, multiprocess and slurm) fails the session, so no tier but slow can grow
costlier tests unnoticed. Each run measures what each test does again: how many times it entered the training loop
(muonlab.train.loop.train_loop, in its body or in a fixture it uses, whichever test set the fixture up:
`main(["train", ...])`, `run_training`, a diagnostic that takes steps) and how many processes it started; a test
the record calls fast that did either fails the session, named, with the command that records its tier
(`make test-fast`, the tier a developer runs on every change, trains nothing and starts no process).
MUONLAB_TEST_TIERS=write (`make test-tiers`) rewrites the record from the run instead.
The terminal summary lists the slowest tests by wall time with their CPU time.

MUONLAB_TEST_BUDGET_SCALE multiplies the budget (a slower machine class than the 2-core machines it was
set on); MUONLAB_TEST_BUDGET=off reports without failing; MUONLAB_TEST_TIMES=FILE writes every test's
phases (setup, call, teardown: wall s; call: CPU s) as tab-separated lines, to see where a suite's time goes.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import resource
import time
from pathlib import Path

import pytest

from support import tiers as tiers_module
from support.tiers import TIERS, Measured, measured_tier

FAST_BUDGET_CPU_S = 2.0  # the fast tier's limit per test: `make test-fast` runs that tier in about a minute on 2 cores
# Every tier but slow (whose tests are the suite's long end-to-end checks) and gpu (not run on these machines) has
# a limit per test, about twice the costliest such test on the 2-core machines: none can creep up unnoticed.
TIER_BUDGET_CPU_S = {"fast": FAST_BUDGET_CPU_S, "multiprocess": 60.0, "slurm": 40.0}
SHOWN = 10


def tier(item) -> str:
    return next((name for name in TIERS if item.get_closest_marker(name)), "fast")


def _counting(original, counter, counts=lambda *args, **kwargs: True):
    """`original`, wrapped to add one to `counter.count` on each call that `counts` accepts."""

    @functools.wraps(original)
    def counted(*args, **kwargs):
        if counts(*args, **kwargs):
            counter.count += 1
        return original(*args, **kwargs)

    counted._counted = True
    return counted


class TrainingLoops:
    """How many times this process entered the product's training loop (muonlab.train.loop.train_loop, which every
    run and every diagnostic that trains goes through): the function is replaced by a counting one in its module and
    in every module already holding it (`from muonlab.train.loop import train_loop`, a test module's too); later
    importers get the counting one."""

    count = 0

    @classmethod
    def install(cls) -> None:
        import sys

        from muonlab.train import loop

        if getattr(loop.train_loop, "_counted", False):
            return
        original = loop.train_loop
        counted = _counting(original, cls)
        for module in list(sys.modules.values()):  # muonlab's and the test modules' (their names' dicts alone)
            if getattr(module, "__dict__", {}).get("train_loop") is original:
                module.train_loop = counted


# Programs the product and torch run for a fact or a compile (provenance's git, platform's uname, inductor's C++
# compiler): a moment each, and not a process of the test's own; every other start counts
HELPER_PROGRAMS = frozenset({"git", "uname", "ldconfig", "cc", "c++", "gcc", "g++", "clang", "clang++", "nvidia-smi"})


class ProcessStarts:
    """How many processes this process started: every way the product and the tests start one ends in one of these
    (subprocess.Popen: torchrun, a command line in a new interpreter, SLURM's commands; multiprocessing's
    Process.start: gloo ranks, a sweep's runs forked from the warm server), a helper program aside."""

    count = 0

    @classmethod
    def install(cls) -> None:
        import multiprocessing.process
        import subprocess

        if getattr(subprocess.Popen._execute_child, "_counted", False):
            return
        subprocess.Popen._execute_child = _counting(subprocess.Popen._execute_child, cls, _not_a_helper)
        multiprocessing.process.BaseProcess.start = _counting(multiprocessing.process.BaseProcess.start, cls)


def _not_a_helper(_popen, args, executable, *_rest, **_kwargs) -> bool:
    """Popen._execute_child's arguments name a program other than a helper."""
    first = executable or (args.split()[0] if isinstance(args, (str, bytes)) else args[0])
    return os.path.basename(os.fsdecode(first)) not in HELPER_PROGRAMS


def _cpu_seconds() -> float:
    own = time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + children.ru_utime + children.ru_stime + _warm_runs_cpu_seconds()


def _warm_runs_cpu_seconds() -> float:
    """The CPU time of the sweep runs forked from this process's warm server (muonlab.lab.warm_start): they
    are the server's children, not ours, so RUSAGE_CHILDREN misses them; the server's waited-for children's
    time is fields 16 and 17 of /proc/<pid>/stat (Linux; 0 elsewhere or while no server runs)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return 0.0
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime (fields 16, 17)


# Each work unit's measured wall time in a whole-suite run on 2 cores (as pytest-split's .test_durations): the
# order units start in, never a limit. MUONLAB_TEST_COSTS=write rewrites it from the run it ends.
UNIT_COSTS = tiers_module.RECORD.with_name("unit_costs.json")  # beside the tier record, in tests/suite/
# A unit the costs do not name yet: what a test of each tier costs, roughly (s).
TIER_COST_S = {"slurm": 30.0, "slow": 8.0, "multiprocess": 10.0, "gpu": 0.0, "fast": 0.05}


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


@functools.cache
def spread_file(path: Path) -> bool:
    """The test file's module-level `pytestmark` names the `spread` mark (read from its source: the pytest-xdist
    controller, which schedules, never imports the test files)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return False
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
               and any(isinstance(a, ast.Attribute) and a.attr == "spread" for a in ast.walk(node.value))
               for node in tree.body)


def work_unit(nodeid: str, root: Path) -> str:
    """What a pytest-xdist worker is handed whole (support.scheduling): the test's file, so a module fixture is
    built once, unless the file is marked `spread` (its tests share nothing costly): then the test alone, so one
    file's long tests (each CPU preset's training) run on every worker instead of one."""
    return nodeid if spread_file(root / _file(nodeid)) else _file(nodeid)


def heaviest_units_first(items: list, root: Path) -> None:
    """Reorder the collected tests, in place, so that the work units that cost most come first, each unit's own
    order kept: pytest-xdist hands units to workers in collection order, and a long unit handed out last is a
    tail with one core idle (xdist's own reorder, by test count, put the heaviest files, one slow test each, at
    the end). support.scheduling turns xdist's reorder off."""
    measured = json.loads(UNIT_COSTS.read_text()) if UNIT_COSTS.is_file() else {}
    unit = {item.nodeid: work_unit(item.nodeid, root) for item in items}
    estimate: dict[str, float] = {}
    for item in items:
        estimate[unit[item.nodeid]] = estimate.get(unit[item.nodeid], 0.0) + TIER_COST_S[tier(item)]
    cost = {u: measured.get(u, guess) for u, guess in estimate.items()}
    rank = {u: i for i, u in enumerate(sorted(cost, key=lambda u: -cost[u]))}
    items.sort(key=lambda item: rank[unit[item.nodeid]])  # stable: a unit's tests keep their order


def budget_s(tier_name: str = "fast") -> float:
    return TIER_BUDGET_CPU_S[tier_name] * float(os.environ.get("MUONLAB_TEST_BUDGET_SCALE", "1"))


def _fixture_defs(item) -> list:
    """The fixture definitions a test uses (the one that applies to each name it asks for, overrides resolved)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return [defs[name][-1] for name in getattr(item, "fixturenames", ()) if defs.get(name)]


def _budgets() -> dict[str, float]:
    return {name: budget_s(name) for name in TIER_BUDGET_CPU_S}


class TierBudget:
    """The pytest plug-in (registered by conftest.py): works in xdist workers and in the controller."""

    def __init__(self, record: Path | None = None) -> None:
        self.record_path = record or tiers_module.RECORD
        # read once and taken out of the environment, so that a session a test starts (a pytest in a new interpreter,
        # the float64 check's mutation runs) writes neither file: only the session that was asked to does
        self.writing_record = os.environ.pop("MUONLAB_TEST_TIERS", None) == "write"
        self.writing_costs = os.environ.pop("MUONLAB_TEST_COSTS", None) == "write"
        self.seen: list[tuple[str, str, float, float]] = []  # (nodeid, tier, wall s, cpu s)
        self.phases: list[tuple[str, str, float, float | None]] = []  # (nodeid, phase, wall s, cpu s or None)
        self.measured: dict[str, Measured] = {}  # every test that ran, but a gpu or slurm one (their tier is static)
        self.unrecorded: list[tuple[str, str]] = []  # (nodeid, what it did): fast tests that did a slower tier's work
        self._before_setup = (0, 0)
        # what each fixture's setup did: a module fixture is set up by the first test that asks for it, so a later
        # test using it did as much, whichever test ran first
        self._fixture_costs: dict = {}  # FixtureDef (two may share a name) -> (training loops, processes, CPU s)
        self._set_up_here: set = set()  # the FixtureDefs set up since this test's setup began (counted as its own)

    @staticmethod
    def _counts() -> tuple[int, int]:
        return TrainingLoops.count, ProcessStarts.count

    @pytest.hookimpl(tryfirst=True)  # before -m selects by the tiers and conftest.py orders by them
    def pytest_collection_modifyitems(self, session, config, items) -> None:
        tiers_module.assign(items, tiers_module.read_record(self.record_path))

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        before, start = self._counts(), _cpu_seconds()
        self._set_up_here.add(fixturedef)
        try:
            return (yield)
        finally:
            loops, processes = (after - b for after, b in zip(self._counts(), before))
            self._fixture_costs[fixturedef] = (loops, processes, _cpu_seconds() - start)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        TrainingLoops.install()
        ProcessStarts.install()
        self._before_setup = self._counts()
        self._set_up_here = set()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        start = _cpu_seconds()
        try:
            return (yield)
        finally:
            cpu_s = _cpu_seconds() - start
            loops, processes = (after - b for after, b in zip(self._counts(), self._before_setup))
            fixtures_cpu_s = 0.0
            for fixturedef in set(_fixture_defs(item)):
                fixture_loops, fixture_processes, fixture_cpu_s = self._fixture_costs.get(fixturedef, (0, 0, 0.0))
                fixtures_cpu_s += fixture_cpu_s
                if fixturedef not in self._set_up_here:  # set up by an earlier test: what it did counts here too
                    loops, processes = loops + fixture_loops, processes + fixture_processes
            item.user_properties += [("cpu_s", cpu_s), ("tier", tier(item)), ("training_loops", loops),
                                     ("processes", processes), ("fixtures_cpu_s", fixtures_cpu_s)]

    def pytest_runtest_logreport(self, report) -> None:
        props = dict(report.user_properties)
        self.phases.append((report.nodeid, report.when, report.duration,
                            props.get("cpu_s") if report.when == "call" else None))
        if report.when != "call" or "cpu_s" not in props:
            return
        self.seen.append((report.nodeid, props["tier"], report.duration, props["cpu_s"]))
        if props["tier"] in ("gpu", "slurm"):
            return
        m = self.measured[report.nodeid] = Measured(props["cpu_s"] + props["fixtures_cpu_s"], props["training_loops"],
                                                    props["processes"])
        did = [f"{what} {count}" for what, count in (("trained", m.training_loops), ("started processes", m.processes))
               if count]
        if props["fixtures_cpu_s"] > budget_s("fast") and props["cpu_s"] <= budget_s("fast"):
            did.append(f"its fixtures took {props['fixtures_cpu_s']:.1f} CPU s")
        if props["tier"] == "fast" and did:
            self.unrecorded.append((report.nodeid, ", ".join(did)))

    def over_budget(self) -> list[tuple[str, str, float, float]]:
        if self.writing_record:  # the run that records the tiers fails none by the record it replaces
            return []
        return [row for row in self.seen if row[1] in TIER_BUDGET_CPU_S and row[3] > budget_s(row[1])]

    def failed_tiers(self) -> list[tuple[str, str]]:
        return [] if self.writing_record else self.unrecorded

    def write_record(self, root: Path) -> None:
        """The record, rewritten: each test that ran, its measured tier; a test that did not run here keeps its
        entry (a skipped test, or one left out by -k) while it exists."""
        recorded = {n: t for n, t in tiers_module.read_record(self.record_path).items()
                    if n not in self.measured and tiers_module.still_there(n, root)}
        recorded |= {n: measured_tier(m, _budgets()) for n, m in self.measured.items()}
        tiers_module.write_record({n: t for n, t in recorded.items() if t != "fast"}, self.record_path)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seen or hasattr(terminalreporter.config, "workerinput"):
            return
        if os.environ.get("MUONLAB_TEST_TIMES"):
            with open(os.environ["MUONLAB_TEST_TIMES"], "w") as f:
                f.writelines(f"{nodeid}\t{phase}\t{wall:.3f}\t{'' if cpu is None else f'{cpu:.3f}'}\n"
                             for nodeid, phase, wall, cpu in self.phases)
        if self.writing_costs:
            costs: dict[str, float] = {}
            for nodeid, _phase, wall, _cpu in self.phases:
                unit = work_unit(nodeid, terminalreporter.config.rootpath)
                costs[unit] = costs.get(unit, 0.0) + wall
            UNIT_COSTS.write_text(json.dumps({k: round(v, 1) for k, v in sorted(costs.items())}, indent=0) + "\n")
        write = terminalreporter.write_line
        if self.writing_record:
            self.write_record(terminalreporter.config.rootpath)
            write(f"the tiers of {len(self.measured)} tests measured, recorded in {self.record_path}")
        write(f"slowest {SHOWN} tests (wall s, CPU s, tier):")
        for nodeid, name, wall, cpu in sorted(self.seen, key=lambda r: -r[2])[:SHOWN]:
            write(f"  {wall:7.1f} {cpu:7.1f}  {name:<12} {nodeid}")
        over = self.over_budget()
        for name in TIER_BUDGET_CPU_S:
            rows = [row for row in over if row[1] == name]
            if rows:
                write(f"{len(rows)} {name} test(s) over the {name} tier's budget of {budget_s(name):.1f} CPU s "
                      f"(record their tiers with `{tiers_module.RECORD_COMMAND}`, or make them cheaper):")
                for nodeid, _, wall, cpu in sorted(rows, key=lambda r: -r[3]):
                    write(f"  {cpu:7.1f} CPU s  {nodeid}")
        if self.failed_tiers():
            write(f"{len(self.failed_tiers())} fast test(s) trained, started a process or set up costly fixtures "
                  f"(record their tiers with `{tiers_module.RECORD_COMMAND}`):")
            for nodeid, did in sorted(self.failed_tiers()):
                write(f"  {nodeid} ({did})")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if hasattr(session.config, "workerinput") or os.environ.get("MUONLAB_TEST_BUDGET") == "off":
            return
        if (self.over_budget() or self.failed_tiers()) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
