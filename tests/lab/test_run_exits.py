"""A local sweep wakes when one of its runs ends (muonlab.lab.run_exits), not at its next poll: a watched run's end
makes the wait return True at once, a wait with every watched run still going runs out its timeout and says False."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from muonlab.lab.run_exits import RunExits

NO_WAKE = 0.05  # the timeout of a wait that must not be woken: no run ends during it
NEVER = 60.0  # the timeout of a wait that must be woken (a process ends within ms of being told): reaching it fails


def _blocked_on_stdin():
    """A process that runs until its stdin closes."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def _end(proc):
    proc.stdin.close()
    proc.wait()


def test_a_subprocess_that_ends_wakes_the_wait_and_one_that_runs_does_not():
    if not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd here: the wait is the poll's timeout (tested below)")
    running, ending = _blocked_on_stdin(), _blocked_on_stdin()
    exits = RunExits()
    try:
        exits.watch(running)
        exits.watch(ending)
        assert exits.wait(NO_WAKE) is False
        _end(ending)
        assert exits.wait(NEVER) is True
        exits.forget(ending)
        assert exits.wait(NO_WAKE) is False  # the one left still runs
    finally:
        exits.close()
        _end(running)


def _until_told(conn):
    conn.recv()


def test_a_forked_run_is_watched_through_its_sentinel():
    """As the warm server's runs (lab/warm_start.WarmRun keeps its process's sentinel)."""
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    proc = multiprocessing.get_context("fork").Process(target=_until_told, args=(theirs,))
    proc.start()
    exits = RunExits()
    try:
        exits.watch(proc)
        assert exits.wait(NO_WAKE) is False
        ours.send("end")
        assert exits.wait(NEVER) is True
        proc.join()
        assert proc.exitcode == 0
    finally:
        exits.close()
        if proc.is_alive():
            proc.kill()


def test_without_pidfds_a_subprocess_is_polled(monkeypatch):
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    proc = _blocked_on_stdin()
    exits = RunExits()
    try:
        exits.watch(proc)
        _end(proc)
        assert exits.wait(NO_WAKE) is False  # nothing to wake it: the timeout, as the poll it replaces
    finally:
        exits.close()


def test_forgetting_and_closing_release_the_pidfds_they_opened():
    if not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd here")
    opened = set(os.listdir("/proc/self/fd"))
    procs = [_blocked_on_stdin(), _blocked_on_stdin()]
    exits = RunExits()
    for proc in procs:
        exits.watch(proc)
    grown = set(os.listdir("/proc/self/fd")) - opened
    exits.forget(procs[0])
    exits.close()
    for proc in procs:
        _end(proc)
    left = set(os.listdir("/proc/self/fd")) - opened
    assert len(grown) >= 2 and not left & grown  # the two pidfds (and the pipes) were open, and are closed
