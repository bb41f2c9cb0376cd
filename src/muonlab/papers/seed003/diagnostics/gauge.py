"""FP64 residual-scale gauge identity audit (seed 003, "residual-scale gauge"; "Residual-scale identity and its limits"),
run on the production residual addition (muonlab.model.variants.residual_rules.residual_add, the
function and autograd rule the GPT's blocks call) on a toy and on a small real GPT.

Seed 003 idealises a block as m_l = r_l h_{l-1} + b_l x0, a_l = m_l + A_l(N(m_l)),
h_l = a_l + F_l(N(a_l)), N(u) = u / sqrt(ms(u) + eps), loss = CE(head(N(h_L))); this is the GPT's
block exactly (r = resid_lambdas, b = x0_lambdas, W^A / W^F = attn / mlp c_proj). Scaling W^A_l,
W^F_l by c_l > 0 (c_0 = 1), r'_l = c_l r_l / c_{l-1}, b'_l = c_l b_l leaves the eps = 0 loss
unchanged, so D_l = r_l dL/dr_l + b_l dL/db_l + <W^A_l, dL/dW^A_l> + <W^F_l, dL/dW^F_l>
- r_{l+1} dL/dr_{l+1} = 0 (last term dropped at l = L); for finite eps and the branch-only VJP
D_l = C^A_l + C^F_l - E^A_l - E^F_l + 1[l=L] C_head.

What the paper checks (seed 003, gauge section) and the rows that check it here:
  "D_l = 0" in the ideal limit            -> ordinary "D_l = C (+C_head)" rows at eps = 0
  "exact finite-epsilon defect" of the    -> "D_l = C (+C_head)" (ordinary) and "D_l = C - E (+C_head)"
    branch-only VJP, D_l = C - E + C_head      (branch_tangent) rows at every eps, every layer
  (D_l is the derivative along the gauge) -> "D_l = jvp along K_l" rows (forward mode, independent route)
  forward "exactly unchanged", VJP        -> "branch add forward == u + f (bitwise)", "VJP == (g_y, P_y g_y)";
    g_f = P_y g_y, skip credit kept            GPT: "loss bitwise equal" and "ran the production Function"
  (loss invariant under the gauge)        -> "loss invariant under gauge" per model
  "branch surrogate remains scale-        -> "covector scale-covariant" rows, ordinary and branch_tangent
    covariant" (max error 3.68e-16)
  two counterexamples, 3-layer toy        -> the 8 "toy3" rows (g.K = 0; work(g + aK) = a|K|^2;
                                             <g, g + aK> = |g|^2; -g zero work; surrogate nonzero work;
                                             g + aK and the surrogate descend, -g ascends)
The paper reports "89 checks pass, max identity error 8.88e-16" and covariance error 3.68e-16 but
enumerates neither the 89 checks nor its toy sizes, eps grid or probe step (unstated in seed 003 "Residual-scale identity and its limits"),
so the list above is its every named claim and our count is our own:
  toy: 3 sum(depths) (1 + len(eps_values)) + 3 len(depths) + 2 + 8   (73 at depths 1..3, eps 1e-6, 1e-3)
  GPT: 3 L + 5                                                         (11 on cpu-tiny, L = 2)
  = 84 by default, against the paper's 89; `format_gauge_table` says so. Choosing a grid to reach 89
  would fit the count, not reproduce the list.

Toy rows (per depth in `depths`, eps in {0} + `eps_values`, layer l): ordinary D_l = C (+C_head);
ordinary D_l = jvp of L along the gauge generator K_l; branch_tangent D_l = C - E (+C_head); per depth
at eps = 0 with c_l in [1/e, e]: |L(T_c theta) - L| / L <= 1e-14, and for both rules
dL/dtheta(T_c theta) = T_c^{-T} dL/dtheta (dL/dW / c_l for W^A_l, W^F_l, dL/dr_l c_{l-1}/c_l,
dL/db_l / c_l, the rest unchanged), max abs diff / max |entry| <= 1e-13. Once, in float64 on a
3 x 5 input: the production branch add is bitwise u + f forward with VJP (g_y, P_y g_y).
Counterexample rows (depth-3 toy, eps = 0, probe theta - eta v, eta = `probe_step`, K = K_1,
alpha = ||g|| / ||K||): identities relative with tol `tol`, properties store the violation (tol 0).
Toy D_l errors are absolute (its terms are O(0.1)).

GPT rows (a preset's autoresearch GPT built as a run builds it, in float64 on CPU, one branch_tangent
arm): the same three identities per layer, invariance and both covariances at the production norm's
eps (F.rms_norm's default, finfo(float64).eps = 2.2e-16: the GPT's forward is not patched, so eps
= 0 and the toy's eps grid are out of reach; the C terms use this eps); the loss of the branch model
bitwise equal to the ordinary one; and every one of the 2L additions of the branch backward ran the
production _BranchTangentAdd. GPT D_l errors are relative to the sum of |terms| of D_l (its terms
are sums over thousands of entries). The ordinary rows run under residual_rules.use_rule(model,
"ordinary"), the branch rows with the model as the arm built it. Node cotangents are read through
forward pre-hooks on attn / mlp (N(m_l), N(a_l)) and a recording wrapper around the model's own
residual_add hook (y = a_l, h_l); the head's C_head = sum_t <h_t, g_{h_t}>, equal to the paper's
sum_t kappa_t <N(h_t), g_{n_t}> because h_L feeds only the head norm (<u, J_N^T g_n> = kappa <N(u), g_n>),
so the production fused head is kept. The jvp rows need forward-mode AD, which neither the fused
head nor CPU flash SDPA has: they run the production unfused head (head_loss.reference_softcapped_
cross_entropy through the model's `loss` point) under the math SDPA kernel.
The FP64 rows through the branch rule hold to 1e-12 only if the production projection keeps float64
(the paper's "reductions accumulated in FP32" read as at least FP32); where it works in fp32 the VJP,
branch-identity and branch-covariance rows fail near 1e-7 and the table names the reduction dtype.

Derivation (finite eps): push the ideal gauge tangent v(node) = node through the linearised graph.
It is exact except at each norm, where d/ds N(e^s u) = eps/(ms(u)+eps) N(u), not 0 (against the
cotangent g_n of N's output: C), and, under the branch rule (the adjoint of dy = du + P_y df), at
each addition, where dy = y - y<y,f>/||y||^2 (giving -E). So seed 003's formula and signs hold with
the cotangents of the backward actually run (E = 0 for autograd); jvp confirms it independently.

Choices (unstated in seed 003): toy batch 2 x 6 tokens, width 8, 2-head causal softmax attention
(c_q, c_k, c_v, c_proj = W^A; no rotary / QK-norm: both sit inside the invariant branch), MLP
relu(x W_fc)^2 W^F, hidden 16, vocab 11, mean CE; x0 a fixed RMS-normalised random input (a frozen
embedding); r ~ 1 + 0.3 N, b ~ 0.5 + 0.3 N. GPT: torch.manual_seed(seed) then the family's
build_model (a run's init), cast to float64; since init zeroes both c_proj (every branch term would
vanish) and lm_head is N(0, 0.001^2), c_proj is redrawn U(+-sqrt(3 / fan_in)), lm_head N(0, 1/d), r and b
as in the toy; 2 x 16 random tokens (the audit is about the graph, not the data). Toy losses are
reported, not compared with the paper's (its toy and step are unstated).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from muonlab.settings import seed_value
from muonlab.errors import UsageError
from muonlab.model.variants import residual_rules as RR
from muonlab.diagnostics import Command

Params = dict[str, Tensor]
DT = torch.float64
HEADS = 2
FLOOR = 1e-20  # seed 003's max(||y||^2, 1e-20) denominator floor
RULES = ("ordinary", "branch_tangent")  # production rule names (residual_rules.RESIDUAL_RULES)
PAPER = {"checks": 89, "max_identity_error": 8.88e-16, "max_covariance_error": 3.68e-16}  # seed 003, not ours
DEFAULT_PRESET, DEFAULT_ARM = "cpu-tiny", "p003_branch_tangent"


@dataclass(frozen=True)
class GaugeLayout:
    """Where the gauge acts in a parameter dict: r, b vectors and each layer's (W^A, W^F) keys."""
    r: str
    b: str
    branch: tuple[tuple[str, str], ...]

    @property
    def depth(self) -> int:
        return len(self.branch)


def toy_layout(depth: int) -> GaugeLayout:
    return GaugeLayout("r", "b", tuple((f"wa.{i}", f"wf.{i}") for i in range(depth)))


def gpt_layout(depth: int) -> GaugeLayout:
    return GaugeLayout("resid_lambdas", "x0_lambdas", tuple(
        (f"transformer.h.{i}.attn.c_proj.weight", f"transformer.h.{i}.mlp.c_proj.weight") for i in range(depth)))


def _layout(p: Params, layout: GaugeLayout | None) -> GaugeLayout:
    return toy_layout(p["r"].numel()) if layout is None else layout


def rms_norm(u: Tensor, eps: float) -> Tensor:
    return u / torch.sqrt(u.pow(2).mean(-1, keepdim=True) + eps)


def make_toy(seed: int, depth: int, batch: int = 2, seq: int = 6, dim: int = 8,
             hidden: int = 16, vocab: int = 11) -> tuple[Params, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=DT) * scale

    p = {"r": 1 + 0.3 * rnd(depth), "b": 0.5 + 0.3 * rnd(depth), "head": rnd(dim, vocab, scale=dim**-0.5)}
    for i in range(depth):
        p.update({f"{k}.{i}": rnd(dim, dim, scale=dim**-0.5) for k in ("wq", "wk", "wv", "wa")})
        p[f"wfc.{i}"] = rnd(dim, hidden, scale=dim**-0.5)
        p[f"wf.{i}"] = rnd(hidden, dim, scale=hidden**-0.5)
    return p, rms_norm(rnd(batch, seq, dim), 0.0), torch.randint(vocab, (batch, seq), generator=gen)  # x0, targets


def _attention(n: Tensor, p: Params, i: int) -> Tensor:
    bsz, t, d = n.shape
    q, k, v = ((n @ p[f"{w}.{i}"]).view(bsz, t, HEADS, d // HEADS).transpose(1, 2) for w in ("wq", "wk", "wv"))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d // HEADS)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(bsz, t, d) @ p[f"wa.{i}"]


def forward(p: Params, x0: Tensor, targets: Tensor, eps: float, rule: str = "ordinary",
            rec: dict | None = None) -> Tensor:
    """Loss of the toy; its residual additions are the production `residual_add(u, f, rule)`.
    `rec` (if given) keeps the tensors the defect terms need."""

    def keep(name: str, t: Tensor) -> Tensor:
        if rec is not None:  # retain so the audit can read this node's cotangent after backward
            t.retain_grad()
            rec[name] = t
        return t

    h, depth = x0, p["r"].numel()
    for i in range(depth):
        m = p["r"][i] * h + p["b"][i] * x0
        fa = _attention(keep(f"nA.{i}", rms_norm(m, eps)), p, i)
        a = keep(f"a.{i}", RR.residual_add(m, fa, rule))
        ff = F.relu(keep(f"nF.{i}", rms_norm(a, eps)) @ p[f"wfc.{i}"]).square() @ p[f"wf.{i}"]
        h = keep(f"h.{i}", RR.residual_add(a, ff, rule))
        if rec is not None:
            rec.update({f"m.{i}": m, f"fA.{i}": fa, f"fF.{i}": ff})
    logits = keep("nH", rms_norm(h, eps)) @ p["head"]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def backward(p: Params, x0: Tensor, targets: Tensor, eps: float,
             rule: str = "ordinary") -> tuple[float, Params, dict]:
    """(loss, parameter covector under `rule`, recorded nodes with their cotangents)."""
    q = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    rec: dict = {}
    loss = forward(q, x0, targets, eps, rule, rec)
    loss.backward()
    return float(loss.detach()), {k: v.grad for k, v in q.items()}, rec


def defect_terms(grads: Params, p: Params, layer: int, layout: GaugeLayout | None = None,
                 drop_next: bool = False) -> list[float]:
    """The terms of D_l (0-based `layer`) from a covector; drop_next omits -r_{l+1} dL/dr_{l+1}."""
    lay, i = _layout(p, layout), layer
    r, b, (wa, wf) = p[lay.r], p[lay.b], lay.branch[i]
    terms = [r[i] * grads[lay.r][i], b[i] * grads[lay.b][i], (p[wa] * grads[wa]).sum(), (p[wf] * grads[wf]).sum()]
    if i + 1 < lay.depth and not drop_next:
        terms.append(-r[i + 1] * grads[lay.r][i + 1])
    return [float(t) for t in terms]


def gauge_defect(grads: Params, p: Params, layer: int, layout: GaugeLayout | None = None,
                 drop_next: bool = False) -> float:
    """D_l = r_l dL/dr_l + b_l dL/db_l + <W^A_l, dL/dW^A_l> + <W^F_l, dL/dW^F_l> - r_{l+1} dL/dr_{l+1}."""
    return math.fsum(defect_terms(grads, p, layer, layout, drop_next))


def norm_defect(u: Tensor, g_n: Tensor, eps: float) -> float:
    """C = sum_t eps / (RMS(u_t)^2 + eps) <N(u_t), g_{n_t}>: the norm's response to u -> e^s u."""
    kappa = eps / (u.pow(2).mean(-1, keepdim=True) + eps)
    return float((kappa * rms_norm(u, eps) * g_n).sum().detach())


def radial_defect(u: Tensor, g_u: Tensor) -> float:
    """sum_t <u_t, g_{u_t}>: equals C where u feeds only a norm (<u, J_N^T g_n> = kappa <N(u), g_n>)."""
    return float((u * g_u).sum().detach())


def branch_work(f: Tensor, y: Tensor, g_y: Tensor) -> float:
    """E = sum_t <f_t, y_t><y_t, g_{y_t}> / ||y_t||^2: the radial credit the branch rule drops."""
    return float(((f * y).sum(-1) * (y * g_y).sum(-1) / (y * y).sum(-1).clamp_min(FLOOR)).sum().detach())


def predicted_defect(rec: dict, layer: int, eps: float, rule: str, head: bool = True) -> float:
    """C^A_l + C^F_l - E^A_l - E^F_l + 1[l=L] C_head (E only under the branch rule). C_head is the
    paper's form where the head norm's output was recorded ("nH"), else the radial form on h_L."""
    i, last = layer, sum(k.startswith("h.") for k in rec) - 1
    d = norm_defect(rec[f"m.{i}"], rec[f"nA.{i}"].grad, eps) + norm_defect(rec[f"a.{i}"], rec[f"nF.{i}"].grad, eps)
    if head and i == last:
        h = rec[f"h.{i}"]
        d += norm_defect(h, rec["nH"].grad, eps) if "nH" in rec else radial_defect(h, h.grad)
    if rule != "ordinary":
        d -= branch_work(rec[f"fA.{i}"], rec[f"a.{i}"], rec[f"a.{i}"].grad)
        d -= branch_work(rec[f"fF.{i}"], rec[f"h.{i}"], rec[f"h.{i}"].grad)
    return d


def gauge_tangent(p: Params, layer: int, layout: GaugeLayout | None = None) -> Params:
    """Generator K_l = d/ds of the gauge map at c_l = e^s (other c = 1), as a parameter tangent."""
    lay, i = _layout(p, layout), layer
    t = {k: torch.zeros_like(v) for k, v in p.items()}
    for w in lay.branch[i]:
        t[w] = p[w].clone()
    t[lay.r][i], t[lay.b][i] = p[lay.r][i], p[lay.b][i]
    if i + 1 < lay.depth:
        t[lay.r][i + 1] = -p[lay.r][i + 1]
    return t


def gauge_jvp(p: Params, x0: Tensor, targets: Tensor, eps: float, layer: int) -> float:
    """Exact directional derivative of the (ordinary) toy loss along K_l, by forward mode."""
    _, d = torch.func.jvp(lambda q: forward(q, x0, targets, eps), (p,), (gauge_tangent(p, layer),))
    return float(d)


def gauge_transform(p: Params, c: Tensor, layout: GaugeLayout | None = None) -> Params:
    """T_c: W^A_l, W^F_l *= c_l, r_l *= c_l / c_{l-1}, b_l *= c_l (c_0 = 1); other entries kept."""
    lay = _layout(p, layout)
    q = {k: v.clone() for k, v in p.items()}
    q[lay.r], q[lay.b] = p[lay.r] * c / torch.cat([c.new_ones(1), c[:-1]]), p[lay.b] * c
    for i, ws in enumerate(lay.branch):
        for w in ws:
            q[w] = p[w] * c[i]
    return q


def transform_covector(g: Params, c: Tensor, layout: GaugeLayout | None = None) -> Params:
    """Covector predicted at T_c(theta): T_c is diagonal, so its inverse transpose is T_{1/c}."""
    return gauge_transform(g, 1 / c, _layout(g, layout))


def covariance_error(g_new: Params, g_expected: Params) -> float:
    scale = max(float(v.abs().max()) for v in g_expected.values())
    return max(float((g_new[k] - g_expected[k]).abs().max()) for k in g_new) / scale


def _vec(d: Params) -> Tensor:
    return torch.cat([d[k].flatten() for k in sorted(d)])


def _row(rows: list, name: str, kind: str, error: float, tol: float, value: float = math.nan,
         model: str = "toy") -> None:
    rows.append({"name": name, "kind": kind, "model": model, "error": float(error), "tol": tol,
                 "passed": bool(error <= tol), "value": float(value)})


def _counterexamples(seed: int, probe_step: float, tol: float, rows: list) -> dict:
    p, x0, tg = make_toy(seed, 3)
    loss0, g, _ = backward(p, x0, tg, 0.0)
    _, gs, _ = backward(p, x0, tg, 0.0, "branch_tangent")
    gv, sv, ks = _vec(g), _vec(gs), [_vec(gauge_tangent(p, i)) for i in range(3)]
    alpha = float(gv.norm() / ks[0].norm())
    plus = {k: g[k] + alpha * v for k, v in gauge_tangent(p, 0).items()}

    def probe(d: Params, sign: float) -> float:
        return float(forward({k: p[k] - sign * probe_step * d[k] for k in p}, x0, tg, 0.0))

    def works(v: Tensor) -> list[float]:
        return [float(k @ v) for k in ks]

    out = {"loss": loss0, "alpha": alpha, "probe_step": probe_step,
           "loss_g_plus_aK": probe(plus, 1.0), "loss_g": probe(g, 1.0), "loss_minus_g": probe(g, -1.0),
           "loss_surrogate": probe(gs, 1.0), "work_g_plus_aK": works(_vec(plus)),
           "work_minus_g": works(-gv), "work_surrogate": works(sv),
           "surrogate_cosine": float(gv @ sv / (gv.norm() * sv.norm())),
           "surrogate_rel_change": float((sv - gv).norm() / gv.norm())}
    kk, gg, cx = float(ks[0] @ ks[0]), float(gv @ gv), "counterexample"
    # identities (error relative, tol `tol`), then properties (error = violation, tol 0)
    _row(rows, "toy3 g.K_1 = 0 (true gradient: zero gauge work)", cx, abs(float(gv @ ks[0])) / math.sqrt(gg * kk), tol)
    _row(rows, "toy3 work(g+aK) = a||K||^2 != 0", cx, abs(out["work_g_plus_aK"][0] / (alpha * kk) - 1), tol)
    _row(rows, "toy3 <g, g+aK> = ||g||^2 (same first-order descent)", cx, abs(float(gv @ _vec(plus)) / gg - 1), tol)
    _row(rows, "toy3 -g has zero work on every layer", cx,
         max(abs(w) / math.sqrt(gg * float(k @ k)) for w, k in zip(out["work_minus_g"], ks)), tol)
    rel_work = max(abs(w) / float(sv.norm() * k.norm()) for w, k in zip(out["work_surrogate"], ks))
    _row(rows, "toy3 branch surrogate has nonzero work", cx, max(0.0, 1e-6 - rel_work), 0.0, rel_work)
    for name, lower, higher in (("g+aK probe descends", out["loss_g_plus_aK"], loss0),
                                ("-g probe ascends", loss0, out["loss_minus_g"]),
                                ("branch surrogate probe descends", out["loss_surrogate"], loss0)):
        _row(rows, f"toy3 {name}", cx, max(0.0, lower - higher), 0.0, higher - lower)
    return out


def _toy_rows(seed: int, depths, eps_values, tol: float, rows: list) -> None:
    for depth in depths:
        p, x0, tg = make_toy(1000 * seed + depth, depth)
        for eps in (0.0, *eps_values):
            for rule in RULES:
                _, g, rec = backward(p, x0, tg, eps, rule)
                for i in range(depth):
                    tag, d = f"d{depth} l{i + 1} eps={eps:g} {rule}", gauge_defect(g, p, i)
                    form = "D_l = C (+C_head)" if rule == "ordinary" else "D_l = C - E (+C_head)"
                    _row(rows, f"{tag} {form}", "identity", abs(d - predicted_defect(rec, i, eps, rule)), tol, d)
                    if rule == "ordinary":  # forward mode: an independent route to the same number
                        _row(rows, f"{tag} D_l = jvp along K_l", "identity", abs(d - gauge_jvp(p, x0, tg, eps, i)),
                             tol, d)
        gen = torch.Generator().manual_seed(seed + 7 * depth)
        c = torch.exp(torch.rand(depth, generator=gen, dtype=DT) * 2 - 1)  # c_l in [1/e, e]
        q = gauge_transform(p, c)
        l0, l1 = float(forward(p, x0, tg, 0.0)), float(forward(q, x0, tg, 0.0))
        _row(rows, f"d{depth} eps=0 loss invariant under gauge", "invariance", abs(l1 - l0) / abs(l0), 1e-14)
        for rule in RULES:
            g0, g1 = backward(p, x0, tg, 0.0, rule)[1], backward(q, x0, tg, 0.0, rule)[1]
            _row(rows, f"d{depth} eps=0 {rule} covector scale-covariant", "covariance",
                 covariance_error(g1, transform_covector(g0, c)), 1e-13)
    gen = torch.Generator().manual_seed(seed)
    u, f, gy = (torch.randn(3, 5, generator=gen, dtype=DT, requires_grad=i < 2) for i in range(3))
    y = RR.residual_add(u, f, "branch_tangent")
    _row(rows, "branch add forward == u + f (bitwise)", "identity", float(not torch.equal(y, u + f)), 0.0)
    y.backward(gy)
    y = y.detach()
    proj = torch.eye(5, dtype=DT) - y[:, :, None] * y[:, None, :] / (y * y).sum(-1)[:, None, None]  # dense P_y
    pg = (proj @ gy[:, :, None])[..., 0]
    vjp = max(float((u.grad - gy).abs().max()), float((f.grad - pg).abs().max()))
    _row(rows, "branch add VJP == (g_y, P_y g_y)", "identity", vjp, tol)


# ---- the small real GPT ----------------------------------------------------------------------

@dataclass
class GPTCase:
    """A preset's GPT in float64 with the arm's variants, its perturbed parameters and a batch."""
    model: Any  # muonlab.model.GPT
    params: Params
    idx: Tensor
    targets: Tensor
    layout: GaugeLayout
    preset: str
    arm: str
    seed: int
    eps: float  # the production norm's eps in float64


def build_gpt_case(preset: str = DEFAULT_PRESET, arm: str = DEFAULT_ARM, seed: int | None = None,
                   batch: int = 2, seq: int = 16) -> GPTCase:
    """The arm's GPT on `preset`, built as a run builds it (module docstring), in float64 on CPU."""
    from muonlab.arms import get_arm, resolve_config
    from muonlab.device import Runtime
    from muonlab.families.autoresearch import gpt_config
    from muonlab.train.build import build_model

    from muonlab.config import all_presets

    family = all_presets().get(preset, {}).get("family")
    if family is not None and family != "autoresearch":  # before the arm's settings meet another family
        raise UsageError(f"gauge: preset {preset!r} builds a {family} model; the audit needs the autoresearch GPT "
                         f"(--preset cpu-tiny, gpu-d8, ...)")
    cfg = resolve_config(arm, preset)
    variants = gpt_config(cfg, cfg.data.vocab_size).variants
    if [type(v).__name__ for v in variants] != ["ResidualRuleConfig"] or variants[0].rule != "branch_tangent":
        raise UsageError(f"gauge: arm {arm!r} must turn on the branch_tangent residual rule and no other model "
                         f"variant (it has {', '.join(map(repr, variants)) or 'none'}), e.g. --arm {DEFAULT_ARM}")
    if seed is None:  # the arm's paper seed (seed 003: 46), else the preset's
        seed = get_arm(arm).seeds[0] if get_arm(arm).seeds else cfg.seed
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # as a run seeds itself before build_model (train/run.py)
        model = build_model(cfg, cfg.data.vocab_size, Runtime(torch.device("cpu"), "fp32")).to(DT)
    d, n_layer, vocab = model.config.n_embd, model.config.n_layer, model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # init zeroes both c_proj: redraw them, and r, b, lm_head (module docstring)
        for block in model.transformer.h:
            for w in (block.attn.c_proj.weight, block.mlp.c_proj.weight):
                bound = math.sqrt(3 / w.shape[1])
                w.copy_((torch.rand(w.shape, generator=gen, dtype=DT) * 2 - 1) * bound)
        model.resid_lambdas.copy_(1 + 0.3 * torch.randn(n_layer, generator=gen, dtype=DT))
        model.x0_lambdas.copy_(0.5 + 0.3 * torch.randn(n_layer, generator=gen, dtype=DT))
        model.lm_head.weight.copy_(torch.randn(vocab, d, generator=gen, dtype=DT) * d**-0.5)
    seq = min(seq, model.config.sequence_len)
    idx, targets = (torch.randint(vocab, (batch, seq), generator=gen) for _ in range(2))
    params = {k: v.detach() for k, v in model.named_parameters()}
    return GPTCase(model, params, idx, targets, gpt_layout(n_layer), preset, arm, seed, torch.finfo(DT).eps)


@contextlib.contextmanager
def _recording(model):
    """Record each block's nodes: forward pre-hooks on attn / mlp (N(m_l), N(a_l)) and a wrapper
    around the model's own residual_add hook (None: the production ordinary rule)."""
    rec: dict = {"calls": []}
    points, previous = model.points, model.points.residual_add
    inner = previous if previous is not None else (lambda u, f: RR.residual_add(u, f, "ordinary"))

    def add(u: Tensor, f: Tensor) -> Tensor:
        y = inner(u, f)
        i, slot = divmod(len(rec["calls"]), 2)  # each block: attention's addition, then the MLP's
        rec["calls"].append(y.grad_fn)
        y.retain_grad()
        rec.update({f"m.{i}": u, f"fA.{i}": f, f"a.{i}": y} if slot == 0 else {f"fF.{i}": f, f"h.{i}": y})
        return y

    def node(name: str):
        def hook(module, args):
            args[0].retain_grad()
            rec[f"{name}.{module.layer_idx}"] = args[0]
        return hook

    handles = [m.register_forward_pre_hook(node(n)) for b in model.transformer.h for n, m in (("nA", b.attn),
                                                                                               ("nF", b.mlp))]
    points.residual_add = add
    try:
        yield rec
    finally:
        points.residual_add = previous
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _unfused_head(model):
    """The production unfused head (reference_softcapped_cross_entropy) at the model's `loss` point."""
    from muonlab.model.gpt import LOGIT_SOFTCAP
    from muonlab.model.head_loss import reference_softcapped_cross_entropy

    if model.points.loss is not None:
        raise UsageError("gauge: the arm replaces the GPT's loss; the jvp rows need the plain head")

    def loss(x: Tensor, targets: Tensor, reduction: str) -> Tensor:
        return reference_softcapped_cross_entropy(x.view(-1, x.size(-1)), model.lm_head.weight, targets.view(-1),
                                                  LOGIT_SOFTCAP, reduction)

    model.points.loss = loss
    try:
        yield
    finally:
        model.points.loss = None


def _rule(model, rule: str):
    """"ordinary": production use_rule; the branch rule: the model as the arm built it."""
    return RR.use_rule(model, "ordinary") if rule == "ordinary" else contextlib.nullcontext()


def gpt_backward(case: GPTCase, rule: str, params: Params | None = None) -> tuple[float, Params, dict]:
    """(loss, covector, recorded nodes) of the production GPT forward and backward under `rule`."""
    q = {k: v.clone().requires_grad_(True) for k, v in (case.params if params is None else params).items()}
    with _rule(case.model, rule), _recording(case.model) as rec:
        loss = torch.func.functional_call(case.model, q, (case.idx, case.targets))
    loss.backward()
    return float(loss.detach()), {k: v.grad for k, v in q.items()}, rec


def gpt_loss(case: GPTCase, params: Params | None = None) -> float:
    """The production GPT's loss (the arm's forward, bitwise that of every rule) at `params`."""
    with torch.no_grad():
        return float(torch.func.functional_call(case.model, case.params if params is None else params,
                                                (case.idx, case.targets)))


def gpt_jvp(case: GPTCase, layer: int) -> float:
    """d/ds L(theta + s K_l) of the ordinary GPT by forward mode (unfused head, math SDPA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tangent = gauge_tangent(case.params, layer, case.layout)
    with RR.use_rule(case.model, "ordinary"), sdpa_kernel([SDPBackend.MATH]), _unfused_head(case.model):
        _, d = torch.func.jvp(lambda q: torch.func.functional_call(case.model, q, (case.idx, case.targets)),
                              (case.params,), (tangent,))
    return float(d)


def _gpt_rows(case: GPTCase, tol: float, rows: list) -> dict:
    depth, eps, lay = case.layout.depth, case.eps, case.layout
    runs = {rule: gpt_backward(case, rule) for rule in RULES}
    info: dict = {"loss": runs["ordinary"][0], "defects": {}}
    for rule in RULES:
        _, g, rec = runs[rule]
        for i in range(depth):
            terms = defect_terms(g, case.params, i, lay)
            d, scale = math.fsum(terms), sum(map(abs, terms))  # errors relative to the terms' size
            info["defects"][f"{rule} l{i + 1}"] = d
            tag = f"gpt l{i + 1} eps={eps:.2g} {rule}"
            form = "D_l = C (+C_head)" if rule == "ordinary" else "D_l = C - E (+C_head)"
            _row(rows, f"{tag} {form}", "identity", abs(d - predicted_defect(rec, i, eps, rule)) / scale, tol, d,
                 "gpt")
            if rule == "ordinary":
                _row(rows, f"{tag} D_l = jvp along K_l", "identity", abs(d - gpt_jvp(case, i)) / scale, tol, d, "gpt")
    gen = torch.Generator().manual_seed(case.seed + 7)
    c = torch.exp(torch.rand(depth, generator=gen, dtype=DT) * 2 - 1)  # c_l in [1/e, e]
    moved = gauge_transform(case.params, c, lay)
    for rule in RULES:
        l1, g1, _ = gpt_backward(case, rule, moved)
        if rule == "ordinary":
            _row(rows, f"gpt eps={eps:.2g} loss invariant under gauge", "invariance",
                 abs(l1 - info["loss"]) / abs(info["loss"]), 1e-14, model="gpt")
        _row(rows, f"gpt eps={eps:.2g} {rule} covector scale-covariant", "covariance",
             covariance_error(g1, transform_covector(runs[rule][1], c, lay)), 1e-13, model="gpt")
    same = runs["ordinary"][0] == runs["branch_tangent"][0]
    _row(rows, "gpt branch_tangent loss == ordinary loss (bitwise)", "identity", float(not same), 0.0, model="gpt")
    calls = runs["branch_tangent"][2]["calls"]
    production = sum(isinstance(fn, RR._BranchTangentAdd._backward_cls) for fn in calls)
    _row(rows, f"gpt all {2 * depth} additions ran the production branch_tangent Function", "wiring",
         abs(len(calls) - 2 * depth) + len(calls) - production, 0.0, production, "gpt")
    return info


def run_gauge_audit(seed: int | None = None, depths=(1, 2, 3), eps_values=(1e-6, 1e-3), tol: float = 1e-12,
                    probe_step: float = 1e-3, preset: str | None = DEFAULT_PRESET, arm: str = DEFAULT_ARM,
                    case: GPTCase | None = None) -> dict:
    """Every check (module docstring): the toy rows, then, unless `preset` is None, the GPT rows
    of `arm` on `preset` (or of a prebuilt `case`). `seed` None: toy seed 0 and the arm's first
    seed for the GPT."""
    rows: list[dict] = []
    if case is None and preset is not None:
        case = build_gpt_case(preset, arm, seed)
    toy_seed = 0 if seed is None else seed
    _toy_rows(toy_seed, depths, eps_values, tol, rows)
    toy = _counterexamples(1000 * toy_seed + 3, probe_step, tol, rows)
    gpt = None
    if case is not None:
        cfg = case.model.config
        gpt = {"preset": case.preset, "arm": case.arm, "seed": case.seed, "depth": cfg.n_layer,
               "width": cfg.n_embd, "heads": cfg.n_head, "vocab": cfg.vocab_size,
               "tokens": list(case.idx.shape), "eps": case.eps, **_gpt_rows(case, tol, rows)}
    worst = {k: max((r["error"] for r in rows if r["kind"] == k), default=0.0)
             for k in ("identity", "covariance", "invariance")}
    counts = {m: sum(r["model"] == m for r in rows) for m in ("toy", "gpt")}
    y = torch.ones(1, 2, dtype=DT)
    reduction = str(RR._project(y, y).dtype)  # the production projection's working dtype on float64 input
    return {"checks": len(rows), "passed": sum(r["passed"] for r in rows), "counts": counts,
            "max_identity_error": worst["identity"], "max_covariance_error": worst["covariance"],
            "max_invariance_error": worst["invariance"], "rows": rows, "toy": toy, "gpt": gpt, "paper": PAPER,
            "reduction_dtype": reduction}


def format_gauge_table(result: dict) -> str:
    r, t, g, n = result, result["toy"], result["gpt"], result["counts"]
    lines = [f"gauge audit: {r['passed']}/{r['checks']} checks pass ({n['toy']} toy, {n['gpt']} GPT); max identity "
             f"error {r['max_identity_error']:.3g}, covariance {r['max_covariance_error']:.3g}, "
             f"invariance {r['max_invariance_error']:.3g}",
             f"paper: {PAPER['checks']} checks, max identity error {PAPER['max_identity_error']:.3g}, covariance "
             f"{PAPER['max_covariance_error']:.3g}; it enumerates neither its checks nor its toy, eps grid or probe "
             f"step, so the counts differ: here each claim it names, per layer, eps and rule ({n['toy']} on the toy), "
             f"and on the GPT at its production norm eps only ({n['gpt']})"]
    if r["reduction_dtype"] != str(DT):
        lines.append(f"note: the production branch rule reduces float64 cotangents in {r['reduction_dtype']} "
                     f"(residual_rules._project), so FP64 identities through it hold only to that precision")
    if g is not None:
        lines.append(f"GPT: preset {g['preset']}, arm {g['arm']}, seed {g['seed']}: {g['depth']} layers, width "
                     f"{g['width']}, {g['heads']} heads, vocab {g['vocab']}, tokens {g['tokens'][0]}x{g['tokens'][1]}, "
                     f"float64, norm eps {g['eps']:.3g} (production); loss {g['loss']:.10f}")
    lines.append(f"{'check':<64} {'value':>11} {'error':>9} {'tol':>7}  ok")
    lines += [f"{w['name']:<64} {w['value']:>11.4g} {w['error']:>9.3g} {w['tol']:>7.0e}  "
              f"{'yes' if w['passed'] else 'NO'}" for w in r["rows"]]
    lines.append(f"toy3 eps=0, step {t['probe_step']:g}: loss {t['loss']:.10f}; g+aK {t['loss_g_plus_aK']:.10f}; "
                 f"g {t['loss_g']:.10f}; -g {t['loss_minus_g']:.10f}; surrogate {t['loss_surrogate']:.10f} "
                 f"(cosine {t['surrogate_cosine']:.5f}, rel change {t['surrogate_rel_change']:.5f})")
    return "\n".join(lines)


COMMAND = Command(
    'gauge', "seed 003's FP64 residual-gauge identities on the production residual addition (a toy and a GPT)",
    options=(("--preset", dict(default="cpu-tiny", help="the autoresearch preset whose GPT is audited, in float64 "
        "on CPU (default cpu-tiny)")),
        ("--arm", dict(default="p003_branch_tangent", help="an arm turning on the branch_tangent residual "
        "rule and nothing else (default p003_branch_tangent)")),
        ("--seed", dict(type=seed_value, default=None, help="init and draws (default: the arm's first seed for the "
        "GPT, 0 for the toy)"))),
    run=lambda a: run_gauge_audit(seed=a.seed, preset=a.preset, arm=a.arm),
    format=format_gauge_table,
    failed=lambda result: result["passed"] != result["checks"])
