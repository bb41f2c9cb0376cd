"""Where and how a sweep's runs go: the flags `sweep` and `paper run` (a table run as a sweep) share."""

from __future__ import annotations

import json
from typing import Any

from muonlab.errors import UsageError
from muonlab.settings import integer_at_least

RUN_FLAGS = ("executor", "parallel", "gpus_per_run", "nodes", "detach", "retry_failed", "slurm")  # add_run_flags' dests


def add_run_flags(p, prefix: str = "") -> None:
    """Where and how a sweep's runs go (sweep, and paper run, which runs a table as a sweep)."""
    p.add_argument("--executor", default="local", choices=("local", "slurm"), help=f"{prefix}where the runs go")
    p.add_argument("--parallel", type=integer_at_least(1), default=None,
                   help=f"{prefix}runs at a time (local; default: one per GPU group of --gpus-per-run, else 1)")
    p.add_argument("--gpus-per-run", type=integer_at_least(1), default=1, metavar="N",
                   help=f"{prefix}processes (one GPU each) of each run: N > 1 makes it a torch.distributed run; "
                        "locally torchrun on N GPUs of its own (runs at a time = visible GPUs // N; on CPU: N gloo "
                        "processes), on SLURM N tasks and N GPUs per node (no GPU for a CPU run)")
    p.add_argument("--nodes", type=integer_at_least(1), default=1, metavar="M",
                   help=f"{prefix}nodes of each run (slurm): M x --gpus-per-run processes")
    p.add_argument("--detach", action="store_true",
                   help=f"{prefix}slurm: submit the array and return with its job id (follow it with sweep --status)")
    p.add_argument("--retry-failed", action="store_true", help=f"{prefix}run failed or diverged (arm, seed)s again")
    p.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                   help=f"{prefix}submitit parameter, e.g. slurm_partition=gpu, timeout_min=60, cluster=local")


def parse_slurm_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--slurm expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options
