"""Homogeneous dense-reuse diagnostic of seed 004 App. K.9 (Table 39) on a `SharedMLPLM`.

For the shared up- and down-projection W (used at L depths), on one batch and the model's
training loss (mean cross-entropy):
  - per-use gradients G_l (eq. 25) from `model.split_uses()` (equal-valued differentiable
    copies), and the split error ||sum_l G_l - G_shared||_F / ||G_shared||_F against the
    gradient of the genuinely shared forward pass (plus both losses and the largest logit gap);
  - pairwise depth-gradient cosines C_lk = <G_l, G_k> / (||G_l||_F ||G_k||_F) over l < k:
    mean, min and the fraction of negative pairs;
  - norm CV: population SD / mean of ||G_l||_F (the L uses are the whole population);
  - cancellation kappa = ||sum_l G_l||_F / sum_l ||G_l||_F (eq. 30);
  - direction cosine between D(G) and V_raw = sum_l D(G_l), G = sum_l G_l;
  - objective retention R_obj = <G, V~> / <G, D(G)>, V~ = (||D(G)||_op / ||V_raw||_op) V_raw
    (eq. 28-29), operator norms = largest singular value in float64.
D is Muon's direction: polar="ns" (default; the paper: "approximated by the same Newton–Schulz
map used by Muon") is `newton_schulz(G) * shape_factor(G)`, exactly the matrix update AF-Muon
applies (bf16 iteration); polar="svd" is the exact polar factor U V^T (float64 SVD) times the
same shape factor, for which R_obj <= 1 holds (eq. 29; with "ns", an inexact LMO, R_obj can exceed
1 slightly). All statistics are computed in float64; G is sum_l G_l (eq. 25), which the split
error ties to the shared-forward gradient.
The paper's values (Table 39: one seed, final audit after 5.0M tokens) are in PAPER_TABLE39.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from muonlab.errors import UsageError
from muonlab.optim.af_muon import shape_factor
from muonlab.optim.polar import newton_schulz
from muonlab.families.tied.model import lm_loss
from muonlab.families.tied.reuse.model import SHARED, SharedMLPLM
from muonlab.diagnostics import Command, RUN_OPTIONS

POLARS = ("ns", "svd")
METRICS = ("mean_pair_cos", "min_pair_cos", "negative_pairs", "norm_cv", "kappa", "direction_cos",
           "objective_retained", "split_error")
PAPER_TABLE39 = {
    "up": dict(mean_pair_cos=0.3396, min_pair_cos=0.0507, negative_pairs=0.0, norm_cv=0.3247, kappa=0.6803,
               direction_cos=0.6785, objective_retained=0.7408, split_error=5.22e-8),
    "down": dict(mean_pair_cos=0.5014, min_pair_cos=0.2251, negative_pairs=0.0, norm_cv=0.2800, kappa=0.7697,
                 direction_cos=0.7764, objective_retained=0.8385, split_error=5.11e-8),
}


def muon_direction(G: torch.Tensor, polar: str = "ns", ns_steps: int = 5) -> torch.Tensor:
    """D(G) in float64: Muon's Newton–Schulz update ("ns") or the exact polar factor ("svd"),
    both times Muon's shape factor sqrt(max(1, rows/cols))."""
    if polar == "ns":
        return newton_schulz(G.float(), ns_steps).double() * shape_factor(G)
    if polar == "svd":
        U, _, Vh = torch.linalg.svd(G.double(), full_matrices=False)
        return (U @ Vh) * shape_factor(G)
    raise ValueError(f"polar must be one of {POLARS}, got {polar!r}")


def _inner(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a * b).sum())


def reuse_statistics(grads: Sequence[torch.Tensor], polar: str = "ns", ns_steps: int = 5) -> dict:
    """Table 39's gradient statistics from the per-use gradients G_1..G_L of one matrix."""
    Gs = [g.double() for g in grads]
    if not Gs:
        raise ValueError("need at least one per-use gradient")
    G = torch.stack(Gs).sum(dim=0)  # eq. 25: the shared parameter's gradient
    norms = [float(g.norm()) for g in Gs]
    pairs = [_inner(Gs[i], Gs[j]) / (norms[i] * norms[j]) for i in range(len(Gs)) for j in range(i + 1, len(Gs))]
    mean_norm = sum(norms) / len(norms)
    population_sd = math.sqrt(sum((n - mean_norm) ** 2 for n in norms) / len(norms))
    D_G = muon_direction(G, polar, ns_steps)
    V_raw = torch.stack([muon_direction(g, polar, ns_steps) for g in Gs]).sum(dim=0)
    op = lambda M: float(torch.linalg.matrix_norm(M, ord=2))  # noqa: E731  largest singular value
    V_tilde = (op(D_G) / op(V_raw)) * V_raw  # eq. 28: same spectral radius as D(G)
    return {
        "depths": len(Gs),
        "grad_norms": norms,
        "mean_pair_cos": sum(pairs) / len(pairs) if pairs else math.nan,
        "min_pair_cos": min(pairs) if pairs else math.nan,
        "negative_pairs": sum(c < 0 for c in pairs) / len(pairs) if pairs else math.nan,
        "norm_cv": population_sd / mean_norm,
        "kappa": float(G.norm()) / sum(norms),  # eq. 30
        "direction_cos": _inner(D_G, V_raw) / (float(D_G.norm()) * float(V_raw.norm())),
        "objective_retained": _inner(G, V_tilde) / _inner(G, D_G),  # eq. 29
    }


def split_error(per_use: Sequence[torch.Tensor], shared: torch.Tensor) -> float:
    """||sum_l G_l - G_shared||_F / ||G_shared||_F, in float64."""
    total = torch.stack([g.double() for g in per_use]).sum(dim=0)
    return float((total - shared.double()).norm() / shared.double().norm())


def per_use_gradients(model: SharedMLPLM, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The shared forward's gradients and the split forward's per-use gradients of up/down,
    both from the mean cross-entropy on (x, y), with both losses and the largest logit gap."""
    params = [getattr(model, name).weight for name in SHARED]
    with torch.enable_grad():
        logits = model(x)
        loss = lm_loss(logits, y, "mean")  # what model(x, y) returns: the training loss
        shared = dict(zip(SHARED, torch.autograd.grad(loss, params)))
        logits, loss = logits.detach(), loss.detach()
        with model.split_uses() as copies:
            split_logits = model(x)
            split_loss = lm_loss(split_logits, y, "mean")
            flat = torch.autograd.grad(split_loss, [c for name in SHARED for c in copies[name]])
    L = model.config.n_layer
    per_use = {name: list(flat[i * L:(i + 1) * L]) for i, name in enumerate(SHARED)}
    return {"loss_shared": float(loss), "loss_split": float(split_loss.detach()),
            "logits_max_abs_diff": float((split_logits.detach() - logits).abs().max()),
            "shared": shared, "per_use": per_use}


def reuse_diagnostics(model: SharedMLPLM, x: torch.Tensor, y: torch.Tensor, polar: str = "ns",
                      ns_steps: int = 5) -> dict:
    """Table 39 for the up and the down matrix of `model` on the batch (x, y)."""
    if polar not in POLARS:
        raise ValueError(f"polar must be one of {POLARS}, got {polar!r}")
    grads = per_use_gradients(model, x, y)
    tensors = [g for name in SHARED for g in (grads["shared"][name], *grads["per_use"][name])]
    out = {key: grads[key] for key in ("loss_shared", "loss_split", "logits_max_abs_diff")}
    out.update(polar=polar, ns_steps=ns_steps, tokens=int((y != -1).sum()),
               finite=all(bool(torch.isfinite(t).all()) for t in tensors))
    for name in SHARED:
        stats = reuse_statistics(grads["per_use"][name], polar, ns_steps)
        out[name] = {**stats, "split_error": split_error(grads["per_use"][name], grads["shared"][name])}
    return out


def run(run_dir: str | Path, polar: str = "ns") -> dict:
    """The diagnostic of a finished shared-MLP run on the batch it had prefetched next, with the
    Newton–Schulz step count of the run's Muon group."""
    from muonlab.diagnostics import runs

    loaded = runs.load_run(run_dir)
    if not isinstance(loaded.model, SharedMLPLM):
        raise UsageError(f"{run_dir}: the K.9 reuse diagnostic needs a SharedMLPLM run, "
                         f"this run's model is {type(loaded.model).__name__}")
    matrix = [g for g in loaded.optimizer.param_groups if g.get("role") == "matrix"]
    ns_steps = int(matrix[0].get("ns_steps", 5)) if matrix else 5
    x, y = loaded.pending_batch()
    result = reuse_diagnostics(loaded.model, x, y, polar=polar, ns_steps=ns_steps)
    return {"run_dir": str(run_dir), "arm": loaded.cfg.arm, "step": loaded.step, **result,
            "paper_table39": PAPER_TABLE39}


def format_table(res: dict) -> str:
    where = f" of {res['run_dir']} (arm {res['arm']}, step {res['step']})" if "run_dir" in res else ""
    polar = "Newton-Schulz" if res["polar"] == "ns" else "exact polar (SVD)"
    lines = [f"K.9 homogeneous dense-reuse diagnostic{where}",
             f"{res['up']['depths']} depths, {res['tokens']} tokens, D = {polar}; loss shared "
             f"{res['loss_shared']:.6f} / split {res['loss_split']:.6f}, max |logit gap| "
             f"{res['logits_max_abs_diff']:.3g}, all gradients finite: {res['finite']}",
             "measured on this batch; paper = seed 004 Table 39 (one seed, final audit after 5.0M tokens)",
             f"{'metric':<20} {'up':>10} {'paper':>10} {'down':>10} {'paper':>10}"]
    for key in METRICS:
        fmt = (lambda v: f"{v:>10.3g}") if key == "split_error" else (lambda v: f"{v:>10.4f}")
        lines.append(f"{key:<20} " + " ".join(fmt(res[n][key]) + " " + fmt(PAPER_TABLE39[n][key]) for n in SHARED))
    return "\n".join(lines)


COMMAND = Command(
    'reuse', "seed 004 K.9 / Table 39: per-depth gradients of a shared-MLP run's reused matrices (cosines, "
    "cancellation, Muon once vs per use)",
    options=(*RUN_OPTIONS, ("--polar", dict(default="ns", choices=("ns", "svd"),
        help="Muon's direction: its Newton-Schulz map (default) or the exact polar factor"))),
    run=lambda a: run(a.run, polar=a.polar),
    format=format_table)
