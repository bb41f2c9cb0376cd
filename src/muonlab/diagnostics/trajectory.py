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

from muonlab.errors import UsageError
from muonlab.diagnostics import Command, RUN_OPTIONS


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


COMMAND = Command(
    'trajectory', "a run's loss and residual scalars at its trajectory steps",
    options=RUN_OPTIONS,
    run=lambda a: read_trajectory(a.run),
    format=format_table)
