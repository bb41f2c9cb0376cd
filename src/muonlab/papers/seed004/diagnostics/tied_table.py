"""A tied run's table diagnostics at its newest checkpoint (seed 004 Table 3, K.8 / Table 38, Table 19).

- Table 3: the tied table's RMS and largest entry, the hidden matrices' RMS (`muonlab.families.tied.afmuon`).
- K.8: the table's gradient split into its lookup (sparse input) and softmax (dense output) sources over
  the run's next optimizer step (every micro-batch of it, as the run would have taken them): the fraction
  of vocabulary rows each source reaches ("input rows" 0.601, "output rows" 1.000 in the paper) and the
  cosine between the two (0.003), `muonlab.optim.af_muon.GradientSources`.
- Table 19: for an MoE, the router statistics of the same forward passes (`muonlab.families.tied.moe.RouterCounts`).
- Table 13's gradient norm: the norm of the step's mean gradient over every parameter, before any clip (what
  the run logs per step), printed beside the paper's on a Llama-3.2-1B run (`muonlab.papers.seed004.printed`).
Printed beside the paper's NanoGPT / NanoGPT-MoE values (mean over seeds 43-45 of the run's optimizer):
a CPU preset's model and data differ from the paper's, so they compare in kind, not in value.
"""

from __future__ import annotations

from pathlib import Path

import torch
from muonlab.settings import integer_at_least
from muonlab.diagnostics import Command, RUN_OPTIONS, DEVICE_OPTIONS

# seed 004 Table 3 (NanoGPT, per seed 43 / 44 / 45) and Table 19 (NanoGPT-MoE, mean over seeds)
PAPER_TABLE3 = {
    "hybrid": {"tied_rms": (0.0427, 0.0429, 0.0431), "tied_max": (0.2500, 0.2543, 0.2568),
               "matrix_rms": (0.0463, 0.0465, 0.0464)},
    "sign": {"tied_rms": (0.5528, 0.6238, 0.5548), "tied_max": (7.8773, 7.8289, 7.8897),
             "matrix_rms": (0.0473, 0.0466, 0.0471)},
    "afmuon": {"tied_rms": (0.3821, 0.3895, 0.3849), "tied_max": (5.8463, 9.2696, 9.4472),
               "matrix_rms": (0.0469, 0.0469, 0.0468)},
}
PAPER_TABLE19 = {
    "hybrid": {"router_entropy": 0.9996, "router_max_frac": 0.2600, "router_cv": 0.0290, "router_unused_experts": 0.0},
    "sign": {"router_entropy": 0.9978, "router_max_frac": 0.2687, "router_cv": 0.0604, "router_unused_experts": 0.0},
    "afmuon": {"router_entropy": 0.9994, "router_max_frac": 0.2626, "router_cv": 0.0396, "router_unused_experts": 0.0},
}
PAPER_K8 = {"lookup_rows": 0.601, "softmax_rows": 1.000, "cosine": 0.003}  # Table 38, both sources
KEYS = ("tied_rms", "tied_max", "matrix_rms", "grad_norm", "lookup_rows", "softmax_rows", "cosine",
        "router_entropy", "router_max_frac", "router_cv", "router_unused_experts")


def paper_values(kind: str, model_preset: str | None = None) -> dict[str, float]:
    """The paper's numbers for the run's optimizer (Table 3 as the mean of its three seeds), and Table 13's
    gradient norm where the run's model is the table's (Llama-3.2-1B)."""
    from muonlab.papers.seed004.printed import for_tied

    table3 = {k: sum(v) / len(v) for k, v in PAPER_TABLE3.get(kind, {}).items()}
    printed = for_tied(model_preset, kind)
    return {**table3, **PAPER_K8, **PAPER_TABLE19.get(kind, {}), **(printed[1] if printed else {})}


def measure(model: torch.nn.Module, batches, autocast) -> dict:
    """Table 3 of `model`'s weights; K.8, Table 19 and the mean gradient's norm over `batches` (gradients left
    in .grad, summed over the micro-batches)."""
    from muonlab.errors import UsageError
    from muonlab.optim.af_muon import GradientSources
    from muonlab.families.tied.moe import RouterCounts
    from muonlab.families.tied.afmuon import table_stats

    weights = table_stats(model)
    if not weights:
        raise UsageError("the run's model has no tied table (an untied control): no tied-table diagnostics")
    model.zero_grad(set_to_none=True)
    with GradientSources(model) as sources, RouterCounts(model) as router:
        for x, y in batches:
            with autocast():
                loss = model(x, y)
            loss.backward()
        split = sources.sources()
    # the step's mean gradient (the run divides each micro-batch's loss by their number), as the run logs it
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.get_total_norm(grads)) / len(batches)
    return {**weights, "grad_norm": grad_norm, "lookup_rows": split["lookup_rows"],
            "softmax_rows": split["softmax_rows"], "cosine": split["cosine"], **router.stats(),
            "micro_batches": len(batches), "tokens": sum(y.numel() for _, y in batches)}


def run(run_dir: str | Path, micro_batches: int | None = None, device: str = "cpu", precision: str = "fp32") -> dict:
    """The diagnostics of a tied run's newest checkpoint over its next optimizer step's batch."""
    from muonlab.diagnostics.runs import capture_batches, load_run, require_family
    from muonlab.papers.seed004.printed import for_tied
    from muonlab.families.tied.afmuon import TABLE1_FAMILIES

    require_family(run_dir, TABLE1_FAMILIES, "tied", "a tied token table")  # before any data
    loaded = load_run(run_dir, device=device, precision=precision)
    result = measure(loaded.model, capture_batches(loaded, micro_batches), loaded.runtime.autocast)
    kind = getattr(loaded.cfg.optim, "kind", None)
    model_preset = getattr(loaded.cfg.model, "preset", None)
    printed = for_tied(model_preset, kind)
    return {"run_dir": str(run_dir), "arm": loaded.cfg.arm, "step": loaded.step, "optimizer": kind,
            "model_preset": model_preset, "device": device, "precision": precision, **result,
            "paper": paper_values(kind, model_preset), "paper_model_source": printed[0] if printed else None}


def format_table(res: dict) -> str:
    lines = [f"Tied-table diagnostics of {res['run_dir']} (step {res['step']}, optimizer {res['optimizer']}; "
             f"gradients over {res['micro_batches']} micro-batches, {res['tokens']:,} tokens, {res['device']} "
             f"{res['precision']})",
             f"{'metric':<24} {'measured':>10} {'paper':>10}"]
    for key in KEYS:
        if key in res:
            paper = res["paper"].get(key)
            lines.append(f"{key:<24} {res[key]:>10.4f} {'' if paper is None else f'{paper:>10.4f}'}")
    lines.append("paper: NanoGPT (Table 3, mean of seeds 43-45), K.8 (Table 38), NanoGPT-MoE (Table 19); a CPU "
                 "preset's model and data differ, so these compare in kind, not in value")
    if res.get("paper_model_source"):
        lines.append(f"paper grad_norm: {res['paper_model_source']}")
    return "\n".join(lines)


COMMAND = Command(
    'tied', "a tied run's table RMS / max and matrix RMS (seed 004 Table 3), lookup vs softmax gradient rows and "
    "cosine (K.8), MoE router statistics (Table 19)",
    options=(*RUN_OPTIONS, ("--micro-batches", dict(type=integer_at_least(1), default=None,
        help="micro-batches to measure (default: one optimizer step's worth)")),
        *DEVICE_OPTIONS),
    run=lambda a: run(a.run, micro_batches=a.micro_batches, device=a.device,
        precision=a.precision),
    format=format_table)
