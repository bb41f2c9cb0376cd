"""Run a command beside N CPU-bound processes, as a laptop busy with other work would: `make test-busy` runs the
whole suite so (issue: the suite must pass on a loaded machine, its tests waiting on conditions, not on time).

    python tests/support/cpu_hogs.py 4 -- python -m pytest -q -n auto --dist loadfile

Each hog spins in pure Python (one core's worth of load, no memory to speak of) until the command ends; the
command's exit status is this script's. The hogs run at the command's priority: they compete, not yield.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys


def spin() -> None:
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: cpu_hogs.py N -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(int(argv[0]))]
    for hog in hogs:
        hog.start()
    try:
        return subprocess.call(argv[2:])
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.join()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
