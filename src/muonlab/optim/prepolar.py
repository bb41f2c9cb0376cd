"""Pre-polar conditioners of the Muon step and their per-group options (seed 000 §3.3, seed 002).

Every conditioner acts per matrix of a stacked shape group G [N, m, n] (statistics over the
last two dims only), on the fp32 Nesterov tensor right before Polar Express, and is selected
per muon param group by the group key `prepolar` (None: off, the upstream step, bitwise):

- "hbieq": Homotopy bilateral equilibration, seed 000 §3.3 (credited there to [20]):
      for k in 1..passes:  G <- G / ((1-a_t) r_bar + a_t r + eps),  then the same for columns,
      r_i = sqrt(mean_j G_ij^2 + eps), r_bar = mean_i r_i  (c, c_bar likewise over rows),
      a_t = min(t / tau, 1)^2, eps = 1e-10, statistics recomputed after each half-step.
  Options: `prepolar_tau` (80: seed 000; 25: seed 002 §1.4a, whose "exponent" form is only the
  spec's guess: seed 000's explicit equation is used for both papers; tau = 0 means a_t = 1,
  the undamped BiEq of exp56/50/57), `prepolar_passes` (2), `prepolar_sides` ("both"; "row"
  with passes=1 is the 1-pass one-sided row-RMS control exp51), `prepolar_eps` (1e-10).
  Step index (unstated for BiEq, spec-000-003 §5.6): t counts the group's completed steps,
  t = 0 at the first update (`prepolar_t0`, default 0, is added), so a_0 = 0 and the first
  update equals the baseline's up to rounding: the Step-0 stability that seed 000 Table 4B
  credits the homotopy with. Stateless (0 bytes).
- "zeta": Zeta's coordinate whitening, seed 000 §3.3: V_t = b2 V_{t-1} + (1-b2) g_t^2 on the raw
  gradient (before the in-place Nesterov step), then G <- G / (sqrt(V_t / (1 - b2^t)) + eps),
  t = 1 at the first update (paper: "Step 0 (t=1)"), b2 = `zeta_beta2` (0.99), eps =
  `zeta_eps` (1e-8). State: `zeta_buffer` [N, m, n] fp32, 4 bytes per matrix element.
  Not reproduced (as in the paper): Zeta's scalar step-size rule and LR warmup.
- "turbo_aol": Turbo-Muon's AOL Gram L1 scaling replaces the Frobenius normalisation inside
  Polar Express (see polar.py for its formula and the unstated choices). 5-step PE is kept,
  as in the paper's common-backbone adaptation. `aol_reuse_gram` (True): the first
  iteration reuses the AOL Gram matrix, as Turbo-Muon does. Stateless.
- "muon2f": Muon^2-F, seed 000 §3.3: second_momentum_buffer.lerp_(mean(G^2, red_dim), 1-beta2)
  then G <- G * buf^(-1/2) before Polar Express "instead of after". Chosen (unstated, spec §5.8):
  the NorMuon buffer is reused (0 extra bytes), the post-polar NorMuon step is removed,
  rsqrt of clamp_min(1e-10) as NorMuon, and no bias correction (1 - beta2^t is one scalar per
  matrix, which Polar Express's Frobenius normalisation removes exactly).

Scope (`prepolar_scope`): "all" (default), "square_only" (rows == cols: the 32 attention
matrices at depth 8, exp47), "rect_only" (its complement), or any other string: a regular
expression searched (re.search) in each matrix's name, read from the group's `param_names`
(torch's own key, aligned with `params`; torch then wants names on every group). A name
filter may pick a strict subset of a stack for "hbieq" and "zeta" (the rest of the stack takes
the upstream path; zeta keeps its buffer for the whole stack, so the layout stays [N, ...]);
"turbo_aol" and "muon2f" change the step's structure and accept only whole-group selections.
A group the scope leaves out runs the upstream step and gets no extra state.

Precision (not conditioners, same group): `polar_dtype` "bf16" (upstream) or "fp32" (seed 002
"NS5 in FP32"); `post_polar_dtype` None (default: whatever Polar Express returns, i.e. the
polar dtype), "bf16" or "fp32" (`g = X.float()`: NorMuon, lr, wd, mask and update in fp32,
which also drops the bf16 rounding of beta2 0.95 -> 0.94921875 and lr; spec-000-003 §0).
"""

from __future__ import annotations

import re

import torch

PREPOLARS = ("hbieq", "zeta", "turbo_aol", "muon2f")
SCOPES = ("all", "square_only", "rect_only")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

# every option a muon group may carry, with its default (read with .get: absent == default)
PREPOLAR_DEFAULTS = dict(
    prepolar=None, prepolar_scope="all", prepolar_tau=80.0, prepolar_passes=2, prepolar_sides="both",
    prepolar_eps=1e-10, prepolar_t0=0, zeta_beta2=0.99, zeta_eps=1e-8, aol_reuse_gram=True,
    polar_dtype="bf16", post_polar_dtype=None,
)
# optimizer-state keys of a muon group holding one slice per matrix (sharded with the matrices)
STACKED_STATE_KEYS = ("momentum_buffer", "second_momentum_buffer", "zeta_buffer")
STEP_KEY = "prepolar_step"  # completed updates of the group (only present with a conditioner on)


# ---------------------------------------------------------------- the math

def homotopy_alpha(t: float, tau: float) -> float:
    """a_t = min(t / tau, 1)^2 (seed 000 §3.3); tau = 0 means undamped (a = 1)."""
    return 1.0 if tau <= 0 else min(t / tau, 1.0) ** 2


def hbieq(G: torch.Tensor, alpha, passes: int = 2, sides: str = "both", eps: float = 1e-10) -> torch.Tensor:
    """Homotopy bilateral RMS equilibration of each matrix of G [..., m, n], in place on G.

    `alpha` is a float or a 0-D tensor. Rows (dim -1 reduced) first, then columns, per pass.

    Same equation as dividing G half-step by half-step, computed with fewer passes over the
    matrix (the step is memory-bound): the half-steps only ever multiply G by a row scale R
    and a column scale C, so with S = G^2 (one squared copy) the row mean of (R G C)^2 is
    R^2 (S @ C^2) / n and the column mean R^2^T S C^2 / m: matrix-vector products on S. R and
    C are applied once at the end. Agrees with the sequential divisions to fp32 rounding
    (~1e-6 relative), about 2x faster on CPU.
    """
    m, n = G.shape[-2:]
    S = G.square()
    R = G.new_ones(G.shape[:-1] + (1,))      # [..., m, 1]
    C = G.new_ones(G.shape[:-2] + (1, n))    # [..., 1, n]
    for _ in range(passes):
        r = (S @ C.square().mT).div_(n).mul_(R.square()).add_(eps).sqrt_()
        R = R / _homotopy_denominator(r, r.mean(dim=-2, keepdim=True), alpha, eps)
        if sides == "both":
            c = (R.square().mT @ S).div_(m).mul_(C.square()).add_(eps).sqrt_()
            C = C / _homotopy_denominator(c, c.mean(dim=-1, keepdim=True), alpha, eps)
    return G.mul_(R).mul_(C) if sides == "both" else G.mul_(R)


def _homotopy_denominator(stat: torch.Tensor, stat_mean: torch.Tensor, alpha, eps: float) -> torch.Tensor:
    """(1 - a) mean + a stat + eps (seed 000 §3.3)."""
    return (stat * alpha).add_(stat_mean * (1 - alpha)).add_(eps)


def zeta_update(V: torch.Tensor, raw_grads: torch.Tensor, beta2: float) -> None:
    """V <- beta2 V + (1 - beta2) g^2 on the raw gradients (fp32 V)."""
    V.lerp_(raw_grads.float().square(), 1 - beta2)


def zeta_whiten(G: torch.Tensor, V: torch.Tensor, bias_t, eps: float = 1e-8) -> torch.Tensor:
    """G / (sqrt(V / (1 - beta2^t)) + eps); `bias_t` = 1 - beta2^t (float or 0-D tensor)."""
    return G.div_((V / bias_t).sqrt_().add_(eps))


def muon2f_precondition(G: torch.Tensor, v_buffer: torch.Tensor, beta2, red_dim: int) -> torch.Tensor:
    """Factored one-sided second moment before Polar Express (Muon^2-F adaptation), in place."""
    v_buffer.lerp_(G.square().mean(dim=red_dim, keepdim=True).to(v_buffer.dtype), 1 - beta2)
    return G.mul_(v_buffer.clamp_min(1e-10).rsqrt().to(G.dtype))


# ---------------------------------------------------------------- options

def validate_group(group: dict) -> None:
    """Raise ValueError naming the first bad prepolar/precision option of a muon group."""
    opt = {k: group.get(k, v) for k, v in PREPOLAR_DEFAULTS.items()}
    if opt["prepolar"] is not None and opt["prepolar"] not in PREPOLARS:
        raise ValueError(f"prepolar must be None or one of {PREPOLARS}, got {opt['prepolar']!r}")
    if opt["polar_dtype"] not in DTYPES:
        raise ValueError(f"polar_dtype must be one of {tuple(DTYPES)}, got {opt['polar_dtype']!r}")
    if opt["post_polar_dtype"] is not None and opt["post_polar_dtype"] not in DTYPES:
        raise ValueError(f"post_polar_dtype must be None or one of {tuple(DTYPES)}, got {opt['post_polar_dtype']!r}")
    if opt["prepolar_sides"] not in ("both", "row"):
        raise ValueError(f"prepolar_sides must be 'both' or 'row', got {opt['prepolar_sides']!r}")
    if opt["prepolar_passes"] < 1 or opt["prepolar_tau"] < 0:
        raise ValueError("prepolar_passes must be >= 1 and prepolar_tau >= 0")
    if not 0 <= opt["zeta_beta2"] < 1:
        raise ValueError(f"zeta_beta2 must be in [0, 1), got {opt['zeta_beta2']}")
    scope = opt["prepolar_scope"]
    if opt["prepolar"] is None or scope in SCOPES:
        return
    names = group.get("param_names")
    if names is None or len(names) != len(group["params"]):
        raise ValueError(f"prepolar_scope {scope!r} is a name filter: the group needs `param_names`")
    picked = selected_indices(group, 0, len(names))
    if opt["prepolar"] in ("turbo_aol", "muon2f") and 0 < len(picked) < len(names):
        raise ValueError(f"prepolar={opt['prepolar']!r} acts on whole groups; scope {scope!r} "
                         f"selects {len(picked)} of {len(names)} matrices")
    re.compile(scope)


def selected_indices(group: dict, start: int, stop: int) -> list[int]:
    """Indices (relative to `start`) of the matrices [start, stop) of the group in scope."""
    scope = group.get("prepolar_scope", "all")
    rows, cols = group["params"][0].shape
    if scope == "all" or (scope == "square_only" and rows == cols) or (scope == "rect_only" and rows != cols):
        return list(range(stop - start))
    if scope in SCOPES:
        return []
    names = group["param_names"]
    return [i - start for i in range(start, stop) if re.search(scope, names[i])]


def step_options(group: dict, state: dict, start: int, stop: int, device) -> dict:
    """Keyword arguments for `muon_step` on the group's matrices [start, stop), {} when off.

    Creates the conditioner's state lazily (`zeta_buffer` [stop-start, m, n] fp32; the step
    counter) and advances the counter: call once per update, on every rank. An empty dict
    means the upstream step, called exactly as upstream calls it.
    """
    opt = {k: group.get(k, v) for k, v in PREPOLAR_DEFAULTS.items()}
    kwargs: dict = {}
    if opt["polar_dtype"] != "bf16":
        kwargs["polar_dtype"] = DTYPES[opt["polar_dtype"]]
    if opt["post_polar_dtype"] is not None:
        kwargs["post_polar_dtype"] = DTYPES[opt["post_polar_dtype"]]
    name = opt["prepolar"]
    if name is None:
        return kwargs
    n_group = len(group["params"])
    whole = selected_indices(group, 0, n_group)
    if not whole:  # the scope leaves this group out: upstream step, no state
        return kwargs
    t = state.get(STEP_KEY, 0)
    state[STEP_KEY] = t + 1
    local = selected_indices(group, start, stop)
    kwargs["prepolar"] = name
    if len(whole) < n_group:  # a strict subset of the stack (hbieq/zeta only, checked at init)
        kwargs["select"] = torch.tensor(local, dtype=torch.long, device=device)
    if name == "hbieq":
        kwargs["alpha_t"] = torch.tensor(homotopy_alpha(t + opt["prepolar_t0"], opt["prepolar_tau"]),
                                         dtype=torch.float32)
        kwargs.update(passes=int(opt["prepolar_passes"]), sides=opt["prepolar_sides"], eps=float(opt["prepolar_eps"]))
    elif name == "zeta":
        rows, cols = group["params"][0].shape
        if "zeta_buffer" not in state:
            state["zeta_buffer"] = torch.zeros(stop - start, rows, cols, dtype=torch.float32, device=device)
        kwargs["zeta_buffer"] = state["zeta_buffer"]
        beta2 = float(opt["zeta_beta2"])
        kwargs["bias_t"] = torch.tensor(1 - beta2 ** (t + 1), dtype=torch.float32)
        kwargs.update(beta2=beta2, eps=float(opt["zeta_eps"]))
    elif name == "turbo_aol" and not opt["aol_reuse_gram"]:
        kwargs["aol_reuse_gram"] = False
    return kwargs
