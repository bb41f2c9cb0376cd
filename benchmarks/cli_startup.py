"""Time the command line's start: `muonlab --help`, `--version` (no torch, no families) and `train --help`
(the config flags of a preset), each a fresh interpreter, median of N runs, side by side with a bare
`python -c pass` so the ratio says what muonlab adds on this machine.

    python benchmarks/cli_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "muonlab --version": [sys.executable, "-m", "muonlab", "--version"],
    "muonlab --help": [sys.executable, "-m", "muonlab", "--help"],
    "muonlab train --help": [sys.executable, "-m", "muonlab", "train", "--help"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    times = {name: [] for name in COMMANDS}
    for _ in range(args.runs):  # interleaved, so a noisy moment hits every command alike
        for name, argv in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["python -c pass"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<22} median {median:6.3f} s  ({median / base:5.1f} x python -c pass)")


if __name__ == "__main__":
    main()
