"""Write requirements/lock.txt and requirements/torch.txt from the environment this runs in (`make lock`).

Run it in the venv the suite passed in. torch and the packages only torch requires go to torch.txt,
so that a GPU machine with its own torch can install the rest of the tested set from lock.txt alone.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).parent
TORCH_ONLY = {"torch", "jinja2", "markupsafe", "networkx", "sympy", "mpmath"}
NOT_LOCKED = {"muonlab", "pip", "setuptools", "wheel"}
LOCK_HEADER = """\
# The exact set the suite passed with (Python 3.11, Linux x86_64), less torch: pip constraints.
# `make demo` / `make test` install from it with requirements/torch.txt; a GPU machine that keeps its
# own torch installs from it alone (README, Install). Remade by `make lock` in a venv that passed.
"""
TORCH_HEADER = """\
# The torch the suite passed with (the CPU build on the test machines; pip takes the CUDA build
# of the same version where no CPU wheel is at hand), and what only it requires. A GPU machine
# keeps its own torch: leave this file out there.
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> None:
    pins = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if canonical(name) not in NOT_LOCKED:
            pins[name] = dist.version.split("+")[0]  # 2.13.0+cpu: the local build label is the machine's
    lines = sorted((f"{n}=={v}" for n, v in pins.items()), key=str.lower)
    is_torch = [canonical(line.split("==")[0]).replace("-", "") in TORCH_ONLY for line in lines]
    (HERE / "lock.txt").write_text(LOCK_HEADER + "".join(f"{l}\n" for l, t in zip(lines, is_torch) if not t))
    (HERE / "torch.txt").write_text(TORCH_HEADER + "".join(f"{l}\n" for l, t in zip(lines, is_torch) if t))
    print(f"{sum(not t for t in is_torch)} pins in lock.txt, {sum(is_torch)} in torch.txt")


if __name__ == "__main__":
    main()
