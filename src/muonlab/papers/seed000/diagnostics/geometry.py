"""Checkpoint geometry of attention and scalars (seed 000 Figure 2, §4.4 item 1).

Per layer, for W_Q and W_K (c_q, c_k weights, [out, in]): the effective spectral rank
exp(H(p)), p = sigma / sum(sigma) (Roy & Vetterli), and the row-norm dispersion, the
coefficient of variation std/mean of the rows' L2 norms (both definitions unstated in the
paper: our reading). Also the final scalar vectors (x0_lambdas, resid_lambdas) and,
when the run has them, per-layer summaries of its variant parameters (pre-sublayer gains,
QK scales as their forward multiplier, LeRoPE log-frequencies, radius-gate a and b).
"""

from __future__ import annotations

from pathlib import Path

import torch

from muonlab.diagnostics.runs import load_run, require_family
from muonlab.model import find_variant
from muonlab.model.variants.presub_gains import gain_value
from muonlab.model.variants.qk_scale import qk_multiplier
from muonlab.diagnostics import Command, RUN_OPTIONS


def effective_rank(w: torch.Tensor) -> float:
    s = torch.linalg.svdvals(w.double())
    p = s / s.sum().clamp_min(1e-300)
    entropy = -(p * p.clamp_min(1e-300).log()).sum()
    return float(entropy.exp())


def row_norm_cv(w: torch.Tensor) -> float:
    norms = w.double().norm(dim=1)
    return float(norms.std(unbiased=False) / norms.mean().clamp_min(1e-300))


def model_geometry(model) -> dict:
    layers = []
    for i, block in enumerate(model.transformer.h):
        wq, wk = block.attn.c_q.weight.detach(), block.attn.c_k.weight.detach()
        layers.append({"layer": i, "wq_effective_rank": effective_rank(wq), "wk_effective_rank": effective_rank(wk),
                       "wq_row_norm_cv": row_norm_cv(wq), "wk_row_norm_cv": row_norm_cv(wk)})
    out = {"layers": layers, "x0_lambdas": model.x0_lambdas.detach().float().tolist(),
           "resid_lambdas": model.resid_lambdas.detach().float().tolist()}
    variants = {n: getattr(model, n) for n in ("presub_gains", "qk_scales", "rope_tau", "radius_gates")
                if hasattr(model, n)}
    if "presub_gains" in variants:
        g = gain_value(variants["presub_gains"].detach().float(), find_variant(model, "presub_gains").cfg.param)
        out["presub_gains"] = [{"attn_mean": float(g[i, 0].mean()), "attn_std": float(g[i, 0].std()),
                                "mlp_mean": float(g[i, 1].mean()), "mlp_std": float(g[i, 1].std())}
                               for i in range(g.size(0))]
    if "qk_scales" in variants:
        raw = variants["qk_scales"].detach().float()
        mask = getattr(model, "qk_mask", None)
        kind = find_variant(model, "qk_scale").cfg.kind
        mult = [qk_multiplier(raw[i], kind, None if mask is None else mask[i])
                for i in range(raw.size(0))]
        out["qk_multiplier"] = [{"mean": float(m.mean()), "min": float(m.min()), "max": float(m.max())} for m in mult]
    if "rope_tau" in variants:
        tau = variants["rope_tau"].detach().float()
        out["rope_frequency_multiplier"] = {"mean": float(tau.exp().mean()), "min": float(tau.exp().min()),
                                            "max": float(tau.exp().max())}
    if "radius_gates" in variants:
        out["radius_gates"] = variants["radius_gates"].detach().float().tolist()
    return out


def run(run_dir: str | Path) -> dict:
    require_family(run_dir, ("autoresearch",), "geometry", "the autoresearch GPT's attention weights")
    loaded = load_run(run_dir)
    return {"run_dir": str(run_dir), "step": loaded.step, "arm": loaded.cfg.arm, **model_geometry(loaded.model)}


def format_table(res: dict) -> str:
    lines = [f"geometry of {res['run_dir']} ({res['arm']}, step {res['step']}): effective rank exp(H(sigma/sum)), "
             "row-norm CV", f"{'layer':>5} {'W_Q rank':>9} {'W_K rank':>9} {'W_Q CV':>8} {'W_K CV':>8}"]
    for r in res["layers"]:
        lines.append(f"{r['layer']:>5} {r['wq_effective_rank']:>9.2f} {r['wk_effective_rank']:>9.2f} "
                     f"{r['wq_row_norm_cv']:>8.4f} {r['wk_row_norm_cv']:>8.4f}")
    lines.append("x0_lambdas    " + " ".join(f"{v:+.3f}" for v in res["x0_lambdas"]))
    lines.append("resid_lambdas " + " ".join(f"{v:.3f}" for v in res["resid_lambdas"]))
    for key in ("presub_gains", "qk_multiplier"):
        for i, r in enumerate(res.get(key, [])):
            lines.append(f"{key}[{i}] " + " ".join(f"{k} {v:.4f}" for k, v in r.items()))
    if "rope_frequency_multiplier" in res:
        lines.append("LeRoPE exp(tau) " + " ".join(f"{k} {v:.4f}" for k, v in res["rope_frequency_multiplier"].items()))
    if "radius_gates" in res:
        lines.append(f"radius gates (a, b) per layer x (attn, mlp): {res['radius_gates']}")
    return "\n".join(lines)


COMMAND = Command(
    'geometry', "W_Q/W_K effective rank and row-norm dispersion, variant scalars, of a run's checkpoint",
    options=RUN_OPTIONS,
    run=lambda a: run(a.run),
    format=format_table)
