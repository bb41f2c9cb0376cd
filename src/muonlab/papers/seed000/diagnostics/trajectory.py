"""Early-step trajectory of a run (seed 000 Table 4B, §4.4).

Training records, at the steps of `trajectory_steps` (default 0, 10, 20, 40, 80), the raw
last-micro-batch train loss and the full `x0_lambdas` / `resid_lambdas` vectors after that
step's update into the run's metrics.jsonl (muonlab.train.loop.trajectory_record). This reads
them back for any run, whatever its arm. The paper's columns: loss at 10/40/80,
x0_lambdas[1] at 10/40/80 and x0_lambdas[7] at 80 (0-based layers).
"""

from __future__ import annotations

import json
from pathlib import Path

from muonlab.diagnostics import Command
from muonlab.papers.seed000 import printed
from muonlab.diagnostics.run_selection import (SELECTION_OPTIONS, Selection, format_one_or_selection,
                                               one_run_or_selection)
from muonlab.errors import UsageError


def read_trajectory(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UsageError(f"{run_dir} is not a run directory (no metrics.jsonl)")
    rows = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of an interrupted run
        if "x0_lambdas" in rec:
            rows.append({k: rec[k] for k in ("step", "loss", "smooth_loss", "x0_lambdas", "resid_lambdas")})
    if not rows:
        raise UsageError(f"{path} holds no trajectory records (trajectory_steps was empty or the run stopped early)")
    return {"run_dir": str(run_dir), "steps": [r["step"] for r in rows], "rows": rows}


def format_table(res: dict) -> str:
    lines = [f"trajectory of {res['run_dir']} (loss: raw last micro-batch; lambdas after the step's update)"]
    for r in res["rows"]:
        x0 = " ".join(f"{v:+.3f}" for v in r["x0_lambdas"])
        resid = " ".join(f"{v:.3f}" for v in r["resid_lambdas"])
        lines.append(f"step {r['step']:>5}  loss {r['loss']:.4f}  x0_lambdas [{x0}]  resid_lambdas [{resid}]")
    return "\n".join(lines)


def _at(rows: list[dict], step: int) -> dict | None:
    return next((r for r in rows if r["step"] == step), None)


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def trajectory_runs(selection: Selection) -> dict:
    """Table 4B's columns per protocol and arm: means over the arm's seeds, and the printed seed-137 row."""
    steps = printed.TRAJECTORY_STEPS
    protocols = []
    for protocol, runs in selection.groups().items():
        arms = []
        for arm in dict.fromkeys(r.arm for r in runs):
            mine = [r for r in runs if r.arm == arm]
            trajectories = [read_trajectory(r.run_dir)["rows"] for r in mine]

            def column(read, step):
                return _mean([read(row) if (row := _at(rows, step)) is not None else None for rows in trajectories])

            x0 = lambda i: lambda row: row["x0_lambdas"][i] if len(row["x0_lambdas"]) > i else None  # noqa: E731
            paper = printed.SEED000_TABLE4B.get(arm)
            arms.append({"arm": arm, "seeds": sorted(r.seed for r in mine),
                         "loss": [column(lambda row: row["loss"], s) for s in steps],
                         "x0_1": [column(x0(1), s) for s in steps], "x0_7_80": column(x0(7), steps[-1]),
                         "paper": None if paper is None else {"seed": printed.TABLE4B_SEED, "loss": list(paper[0]),
                                                              "x0_1": list(paper[1]), "x0_7_80": paper[2]}})
        protocols.append({"protocol": protocol, "depth": runs[0].depth, "arms": arms})
    return {"steps": list(steps), "protocols": protocols, "left_out": selection.left_out}


def _f(v, fmt):
    return "-" if v is None else format(v, fmt)


def format_runs(res: dict) -> str:
    steps = "/".join(map(str, res["steps"]))
    lines = []
    for p in res["protocols"]:
        lines.append(f"protocol {p['protocol']} (depth {p['depth']}): seed 000 Table 4B, means over seeds")
        lines.append(f"  {'arm':<28}{'seeds':<14}{'loss @' + steps:>28}{'x0_lambdas[1] @' + steps:>28}"
                     f"{'x0[7] @' + str(res['steps'][-1]):>10}")
        for a in p["arms"]:
            rows = [(a["arm"], ",".join(map(str, a["seeds"])), a)]
            if a["paper"]:
                rows.append(("  paper", f"seed {a['paper']['seed']}", a["paper"]))
            for name, seeds, v in rows:
                loss = " / ".join(_f(x, ".4f") for x in v["loss"])
                x1 = " / ".join(_f(x, "+.3f") for x in v["x0_1"])
                lines.append(f"  {name:<28}{seeds:<14}{loss:>28}{x1:>28}{_f(v['x0_7_80'], '+.3f'):>10}")
    for why in res["left_out"]:
        lines.append(f"left out: {why}")
    return "\n".join(lines)


COMMAND = Command(
    'trajectory', "a run's loss and residual scalars at its trajectory steps; over several runs, seed 000 "
                  "Table 4B (means over seeds) beside the printed values",
    options=SELECTION_OPTIONS,
    run=one_run_or_selection(read_trajectory, trajectory_runs),
    format=format_one_or_selection(format_table, format_runs))
