"""How `make test` hands the suite to its pytest-xdist workers (`--dist loadfile`, through conftest.py's
pytest_xdist_make_scheduler): a work unit at a time, in the collection's order (the costliest first,
support.budget.heaviest_units_first), a unit being a file (its module fixtures built once, on one worker) or, in a
file marked `spread`, one test (one file's long tests run on every worker instead of queueing on one).

xdist's own `--dist loadgroup` cannot do this under pytest 9.2: it renames the collected items' node ids, which
pytest 9.2 no longer reads from where xdist 3.8 writes them.
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

from support.budget import work_unit


def make_scheduler(config, log) -> LoadFileScheduling | None:
    """conftest.py's pytest_xdist_make_scheduler: under `--dist loadfile` (make test), WorkUnitScheduling with
    xdist's reorder (by test count) off, so units start in the collection's order; None (xdist's own) otherwise."""
    if config.getvalue("dist") != "loadfile":
        return None
    config.option.loadscopereorder = False
    return WorkUnitScheduling(config, log)


class WorkUnitScheduling(LoadFileScheduling):
    """xdist's file scheduling (a unit to a worker, the next unit to the first worker that runs low), its units
    support.budget.work_unit's."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid, self.config.rootpath)
