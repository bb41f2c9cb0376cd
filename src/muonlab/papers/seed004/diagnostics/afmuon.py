"""AF-Muon tied-table diagnostics from a tied momentum buffer (seed 004 App. K.7, Table 37).

From the tied table's heavy-ball buffer B [V, d] after a run, with the AF direction
A = L_c(B) (the exact clipped-row LMO at the run's cap c) and the row-RMS direction
R_i = b_i sqrt(d) / ||b_i|| (rows with B_i != 0):
  - coord-capped fraction: nonzero entries of B whose |A_ij| >= c - 1e-5;
  - rows-clipped fraction: active rows (B_i != 0) with at least one capped entry;
  - tail energy: the share of sum R^2 in entries with |R_ij| > c (what the cap removes);
  - cos(AF, Sign): global cosine between A and sign(B);
  - objective ratio: <B, A> / <B, sign B> (>= 1 by optimality for c >= 1, Prop. 1).
The paper's values at (c, s) = (3, 0.5) on NanoGPT: 0.0028, 0.8949, 0.0303, 0.799, 1.253. Where the run's
model is a table's (`muonlab.papers.seed004.printed`), that table's row is printed beside: Table 22 on the
tied ImageGPT (by optimizer), Table 37 on NanoGPT (by the run's c and s).
Source of B: a run directory (the newest checkpoint's optimizer state) or a raw tensor.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from muonlab.optim.lmo import clipped_row_lmo
from muonlab.diagnostics import Command, RUN_OPTIONS

PAPER_C3_S05 = {"coord_capped": 0.0028, "rows_clipped": 0.8949, "tail_energy": 0.0303, "cos_sign": 0.799,
                "objective_ratio": 1.253}


def tied_diagnostics(B: torch.Tensor, cap: float) -> dict:
    B = B.float()
    A = clipped_row_lmo(B, cap).double()
    Bd = B.double()
    nonzero = Bd != 0
    active = nonzero.any(dim=1)
    capped = (A.abs() >= cap - 1e-5) & nonzero if math.isfinite(cap) else torch.zeros_like(nonzero)
    norms = Bd.norm(dim=1, keepdim=True)
    R = torch.where(norms > 0, Bd * math.sqrt(B.size(1)) / norms.clamp_min(1e-300), torch.zeros_like(Bd))
    R2 = R.square()
    sign = torch.sign(Bd)
    sign_obj = (Bd * sign).sum()
    return {
        "cap": cap, "rows": B.size(0), "width": B.size(1), "active_rows": int(active.sum()),
        "coord_capped": float(capped.sum() / nonzero.sum().clamp_min(1)),
        "rows_clipped": float((capped.any(dim=1) & active).sum() / active.sum().clamp_min(1)),
        "tail_energy": float(R2[R.abs() > cap].sum() / R2.sum().clamp_min(1e-300)),
        "cos_sign": float((A * sign).sum() / (A.norm() * sign.norm()).clamp_min(1e-300)),
        "objective_ratio": float((Bd * A).sum() / sign_obj) if sign_obj > 0 else math.nan,
    }


def run(run_dir: str | Path) -> dict:
    """The diagnostics of a tied run's newest checkpoint (its momentum buffer and cap)."""
    from muonlab.papers.seed004.printed import for_afmuon
    from muonlab.diagnostics.runs import load_run, require_family
    from muonlab.families.tied.afmuon import TABLE1_FAMILIES
    from muonlab.errors import UsageError

    require_family(run_dir, TABLE1_FAMILIES, "afmuon", "an AF-Muon optimizer's tied-table state")
    loaded = load_run(run_dir)
    groups = [g for g in loaded.optimizer.param_groups if g.get("role") == "tied"]
    if not groups:
        raise UsageError(f"{run_dir}: no AF-Muon tied group (optimizer {loaded.cfg.optim.kind!r})")
    table = groups[0]["params"][0]
    state = loaded.optimizer.state.get(table, {})
    if "momentum_buffer" not in state:
        raise UsageError(f"{run_dir}: the tied table has no momentum buffer yet")
    result = tied_diagnostics(state["momentum_buffer"], groups[0]["cap"])
    model_preset = getattr(loaded.cfg.model, "preset", None)
    printed = for_afmuon(model_preset, loaded.cfg.optim.kind, groups[0]["cap"], groups[0]["scale"])
    return {"run_dir": str(run_dir), "arm": loaded.cfg.arm, "step": loaded.step, "scale": groups[0]["scale"],
            "model_preset": model_preset, **result, "paper_c3_s05": PAPER_C3_S05,
            "paper_model": None if printed is None else {"source": printed[0], "values": printed[1]}}


def format_table(res: dict) -> str:
    model = res.get("paper_model")
    lines = [f"AF-Muon tied momentum diagnostics{' of ' + res['run_dir'] if 'run_dir' in res else ''} "
             f"(c = {res['cap']}, {res['active_rows']}/{res['rows']} active rows of width {res['width']})",
             f"{'metric':<18} {'value':>10} {'paper (3, 0.5)':>15}" + (f" {'paper (this model)':>20}" if model else "")]
    for key in ("coord_capped", "rows_clipped", "tail_energy", "cos_sign", "objective_ratio"):
        line = f"{key:<18} {res[key]:>10.4f} {PAPER_C3_S05[key]:>15.4f}"
        if model and key in model["values"]:
            mean, sd = model["values"][key]
            line += f" {f'{mean:.4f} ± {sd:.4f}':>20}"
        elif model:  # the paper prints "–": no such statistic for the optimizer
            line += f" {'–':>20}"
        lines.append(line)
    if model:
        lines.append(f"paper (this model): {model['source']}")
    return "\n".join(lines)


COMMAND = Command(
    'afmuon', "AF-Muon LMO statistics of a tied run (capped coordinates, clipped rows, cosine with Sign)",
    options=RUN_OPTIONS,
    run=lambda a: run(a.run),
    format=format_table)
