"""Checkpoint audits of seed paper 002 (§4.2.1–4.2.2, §4.5; Tables 4, 5a, 8b).

- §4.2.1 stable rank srank(W) = ||W||_F^2 / ||W||_2^2 in [1, min(M, N)], computed in float64 from
  the stored (possibly bf16) weights, with sigma_1^2 the top eigenvalue of the smaller Gram matrix.
- §4.2.1 mean-row common-mode energy share M ||w_bar||^2 / ||W||_F^2, w_bar = the mean of the M rows
  (rows = vocabulary / hash rows; nn.Linear weights are [out, in], so lm_head's rows are tokens).
- §4.2.2 the profile of exp(q_tau) in R^{L x H x D_h/2} (Table 5a).
- §4.5 the terminal residual scalars (Table 8b).

Choices (the paper leaves these open):
- A zero matrix has no stable rank or energy share: both are nan, and family means skip nan
  entries (`n_zero` counts them), so a fresh init (zero c_proj, zero OE tables) still audits.
- Table 4 writes srank as "10.50 / 384": each family reports `srank`, its bound `srank_bound`
  = min(M, N) (= d for wte / lm_head, d/4 = the table width for OE tables, as in the paper's
  shapes; a family mean over the audited matrices) and `srank_frac` = mean of srank / bound.
- OE tables (unstated in seed 002 §4.2.1): every row counts (literal formula); `mean_row_energy_nonzero`
  repeats the share over the rows with any nonzero entry (~ the ever-visited rows).
- Attention family = c_q, c_k, c_v, c_proj of every layer (square when n_kv_head == n_head, as in
  the paper: 4 L matrices); MLP = c_fc, mlp.c_proj (2 L). ve_gate matrices are not audited.
- q_tau: the multiplier the forward uses (`qk_multiplier`, freeze mask included), one
  value per plane c. Kinds pair_tied_exp (seed 002) and pair_tied_stopexp (same forward value
  exp(tau)) are profiled; any other kind, or none, gives None. SD is the population SD over all
  L*H*P entries. Bands for P = D_h/2 planes: high [0, P/4), mid [P/4, 3P/4), low [3P/4, P)
  (floor), i.e. [0,15], [16,47], [48,63] at P = 64; scaling by P keeps each band's RoPE
  wavelengths (inv_freq[c] = 10000^(-c/P)). Middle layers = 2..L-2 (L2-L4 at d6, L2-L6 at d8).
- Terminal scalars: full vectors plus resid_lambdas[0:2] as Table 8b prints; wte_lambdas /
  out_lambdas only when the model has them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from muonlab.diagnostics.runs import load_run, require_family
from muonlab.model import find_variant
from muonlab.model.variants.qk_scale import qk_multiplier

QTAU_KINDS = ("pair_tied_exp", "pair_tied_stopexp")


def stable_rank(w: torch.Tensor) -> float:
    """||W||_F^2 / ||W||_2^2 in float64 (nan for a zero matrix)."""
    x = w.detach().double().reshape(w.shape[0], -1)
    gram = x.T @ x if x.shape[0] >= x.shape[1] else x @ x.T
    top = float(torch.linalg.eigvalsh(gram)[-1])
    fro2 = float(x.square().sum())
    return fro2 / top if fro2 > 0 and top > 0 else math.nan


def mean_row_energy_share(w: torch.Tensor) -> float:
    """M ||mean row||_2^2 / ||W||_F^2 (seed 002 §4.2.1) in float64; in [0, 1], nan for a zero matrix."""
    x = w.detach().double().reshape(w.shape[0], -1)
    fro2 = float(x.square().sum())
    return x.shape[0] * float(x.mean(dim=0).square().sum()) / fro2 if fro2 > 0 else math.nan


def _family(weights: list[torch.Tensor], energy: bool = False, nonzero: bool = False) -> dict[str, Any]:
    """Means over a family of matrices (nan entries skipped), plus the per-matrix values."""
    sr = [stable_rank(w) for w in weights]
    ok = [i for i, v in enumerate(sr) if not math.isnan(v)]
    bounds = [min(w.shape[0], w[0].numel()) for w in weights]
    mean = (lambda xs: sum(xs) / len(xs) if xs else math.nan)
    out: dict[str, Any] = {"n": len(weights), "n_zero": len(weights) - len(ok), "srank_each": sr,
                           "srank": mean([sr[i] for i in ok]), "srank_bound": mean([bounds[i] for i in ok])}
    out["srank_frac"] = mean([sr[i] / bounds[i] for i in ok])
    if energy:
        out["mean_row_energy"] = mean([mean_row_energy_share(weights[i]) for i in ok])
    if nonzero:
        rows = [weights[i].detach()[weights[i].detach().ne(0).any(dim=1)] for i in ok]
        out["mean_row_energy_nonzero"] = mean([mean_row_energy_share(r) for r in rows])
        out["nonzero_rows"] = [int(r.shape[0]) for r in rows]
    return out


def qtau_bands(planes: int) -> dict[str, range]:
    """Table 5a's RoPE bands for `planes` = D_h/2 planes, scaled from [0,15] / [16,47] / [48,63] at 64."""
    a, b = planes * 16 // 64, planes * 48 // 64
    return {"high": range(0, a), "mid": range(a, b), "low": range(b, planes)}


def qtau_profile(model) -> dict[str, Any] | None:
    """Table 5a on the effective exp(q_tau) [L, H, P]; None when the model has no q_tau."""
    qk = find_variant(model, "qk_scale")
    kind = "none" if qk is None else qk.cfg.kind
    raw = getattr(model, "qk_scales", None)
    if raw is None or kind not in QTAU_KINDS:
        return None
    raw = raw.detach().double()
    mask = getattr(model, "qk_mask", None)
    planes = raw.shape[-1]
    s = torch.stack([qk_multiplier(raw[i], kind, None if mask is None else mask[i].double())[..., :planes]
                     for i in range(raw.shape[0])])
    L = s.shape[0]
    per_layer = [float(s[i].mean()) for i in range(L)]
    middle = list(range(2, L - 1))
    out: dict[str, Any] = {"kind": kind, "shape": list(s.shape), "mean": float(s.mean()),
                           "sd": float(s.std(unbiased=False)), "per_layer": per_layer,
                           "layer0": per_layer[0], "final": per_layer[-1], "middle_layers": middle,
                           "middle": float(s[middle].mean()) if middle else None,
                           "middle_per_layer": [per_layer[i] for i in middle]}
    bands = qtau_bands(planes)
    out["bands"] = {k: [r.start, r.stop - 1] for k, r in bands.items()}
    for name, r in bands.items():
        out[name] = float(s[..., r.start:r.stop].mean()) if len(r) else None
    return out


def excess_change(mu_oe: float, mu_dense: float) -> float:
    """Seed 002 Table 5a's "excess" change ((mu_12 - 1) - (mu_02 - 1)) / (mu_02 - 1)."""
    return ((mu_oe - 1) - (mu_dense - 1)) / (mu_dense - 1)


def terminal_scalars(model) -> dict[str, list[float]]:
    """Table 8b: x0/resid lambdas (and wte/out lambdas when present) as read now from the model."""
    out = {"x0_lambdas": model.x0_lambdas.detach().double().tolist(),
           "resid_lambdas": model.resid_lambdas.detach().double().tolist()}
    out["resid_lambdas[0:2]"] = out["resid_lambdas"][:2]
    for name in ("wte_lambdas", "out_lambdas"):
        p = getattr(model, name, None)
        if p is not None:
            out[name] = p.detach().double().reshape(-1).tolist()
    return out


def audit_model(model) -> dict[str, Any]:
    """Table 4 families, the Table 5a q_tau profile and the Table 8b scalars of one model."""
    d = model.config.n_embd
    blocks = list(model.transformer.h)
    fams: dict[str, Any] = {
        "wte": _family([model.transformer.wte.weight], energy=True),
        "lm_head": _family([model.lm_head.weight], energy=True),
        "value_embeds": _family([e.weight for e in model.value_embeds.values()], energy=True),
        "attention": _family([getattr(b.attn, n).weight for b in blocks for n in ("c_q", "c_k", "c_v", "c_proj")]),
        "mlp": _family([w for b in blocks for w in (b.mlp.c_fc.weight, b.mlp.c_proj.weight)]),
    }
    oe = getattr(model, "oe", None)
    if oe is not None:
        fams["oe_tables"] = _family([t.weight for t in oe.tables], energy=True, nonzero=True)
    return {"d": d, "n_layer": len(blocks), "families": fams, "qtau": qtau_profile(model),
            "scalars": terminal_scalars(model)}


def run_audit(run_dir: str | Path) -> dict[str, Any]:
    """Audit the run's final weights (the paper audits step 953, the end of training), or for a run
    that did not finish its newest checkpoint; fp32 on CPU."""
    from muonlab.train import load as final  # noqa: PLC0415

    cfg = require_family(run_dir, ("autoresearch",), "audit", "the autoresearch GPT's tables")
    run_dir = Path(run_dir)
    if (run_dir / "model.safetensors").is_file():
        weights = run_dir / "model.safetensors"
        model, step = final.load_run(run_dir), cfg.train.num_steps
    else:
        loaded = load_run(run_dir)
        model, step, weights = loaded.model, loaded.step, loaded.checkpoint_path
    return {"run_dir": str(run_dir), "arm": getattr(cfg, "arm", None), "seed": getattr(cfg, "seed", None),
            "run_name": getattr(cfg, "run_name", None), "step": step,
            "checkpoint": str(weights), **audit_model(model)}


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def format_audit_table(result: dict[str, Any]) -> str:
    """Plain-text Table 4 / 5a / 8b rows of one audit."""
    head = f"seed-002 audit of {result.get('run_dir', 'model')}"
    if "arm" in result:
        head += f" ({result['arm']}, seed {result.get('seed')}, step {result.get('step')})"
    lines = [head, f"{'family':<13}{'n (zero)':>9}{'srank':>9}{'/ bound':>9}{'frac':>8}{'mean-row %':>12}"]
    for name, f in result["families"].items():
        energy = f.get("mean_row_energy")
        count = f"{f['n']} ({f['n_zero']})"
        lines.append(f"{name:<13}{count:>9}{_num(f['srank'], '.2f'):>9}{_num(f['srank_bound'], '.0f'):>9}"
                     f"{_num(f['srank_frac'], '.4f'):>8}{_num(None if energy is None else 100 * energy, '.2f'):>12}")
        if "mean_row_energy_nonzero" in f:
            lines.append(f"{'':<13}mean-row % over nonzero rows "
                         f"{_num(100 * f['mean_row_energy_nonzero'], '.2f')} (rows {f['nonzero_rows']})")
    q = result.get("qtau")
    if q is None:
        lines.append("exp(q_tau): none")
    else:
        b = q["bands"]
        lines.append(f"exp(q_tau) {q['kind']} {q['shape']}: mean {q['mean']:.4f} +- {q['sd']:.4f}; "
                     + "; ".join(f"{k} c in {b[k]} {_num(q[k], '.4f')}" for k in ("high", "mid", "low")))
        mids = ", ".join(f"{v:.3f}" for v in q["middle_per_layer"])
        lines.append(f"  layer 0 {q['layer0']:.4f}; middle L{q['middle_layers']} {_num(q['middle'], '.4f')} "
                     f"[{mids}]; final {q['final']:.4f}")
    for name, vals in result["scalars"].items():
        lines.append(f"{name:<19}[" + ", ".join(f"{v:+.3f}" for v in vals) + "]")
    return "\n".join(lines)
