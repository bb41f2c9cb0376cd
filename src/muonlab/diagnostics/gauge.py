"""FP64 residual-scale gauge identity audit (seed 003, "residual-scale gauge"; spec-000-003 §2 item 7).

Seed 003 idealises a block as m_l = r_l h_{l-1} + b_l x0, a_l = m_l + A_l(N(m_l)),
h_l = a_l + F_l(N(a_l)), N(u) = u / sqrt(ms(u) + eps), loss = CE(lm_head(N(h_L))). Scaling W^A_l,
W^F_l (the branch output matrices) by c_l > 0 (c_0 = 1), r'_l = c_l r_l / c_{l-1}, b'_l = c_l b_l
leaves the eps = 0 loss unchanged, so D_l = r_l dL/dr_l + b_l dL/db_l + <W^A_l, dL/dW^A_l>
+ <W^F_l, dL/dW^F_l> - r_{l+1} dL/dr_{l+1} = 0 (last term dropped at l = L). The paper reports
"89 checks pass, max identity error 8.88e-16" and a covector covariance error of 3.68e-16 but
enumerates neither the checks nor its toy, so our count (73 on the defaults) differs.

Checks (rows), per depth L in `depths`, for eps in {0} + `eps_values` and every layer l:
  [identity] ordinary autograd: D_l = C^A_l + C^F_l + 1[l=L] C_head (at eps = 0: D_l = 0);
  [identity] the same D_l equals the forward-mode jvp of the loss along the gauge generator K_l;
  [identity] branch-tangent VJP: D_l = C^A_l + C^F_l - E^A_l - E^F_l + 1[l=L] C_head;
then per depth, at eps = 0 and random c_l in [1/e, e]: [invariance] |L(T_c theta) - L| / L <= 1e-14;
[covariance] dL/dtheta at T_c theta = T_c^{-T} dL/dtheta (dL/dW / c_l for W^A_l, W^F_l,
dL/dr_l c_{l-1}/c_l, dL/db_l / c_l, rest unchanged), max abs diff / max |entry| <= 1e-13, for the
ordinary and the branch covector. Once: [identity] the branch add's forward is bitwise u + f and
its VJP is (g_y, P_y g_y). Count = 3 sum(L) (1 + len(eps_values)) + 3 len(depths) + 2 + 8.
[counterexample] (8, depth-3 toy, eps = 0, probe theta - eta v, eta = `probe_step`, K = K_1,
alpha = ||g|| / ||K||): g.K = 0; work(g + aK) = a||K||^2; <g, g + aK> = ||g||^2; -g has zero work
on every layer; the branch surrogate has nonzero work; g + aK and the surrogate descend; -g ascends.
D_l errors are absolute (its terms are O(0.1)), toy identities relative; property rows store the violation.

Derivation (finite eps): push the ideal gauge tangent v(node) = node through the linearised graph.
It is exact except at each norm, where d/ds N(e^s u) = eps/(ms(u)+eps) N(u), not 0 (against the
cotangent g_n of N's output: C), and, under the branch rule (the adjoint of dy = du + P_y df), at
each addition, where dy = y - y<y,f>/||y||^2 (giving -E). So the spec's formula and signs hold with
the cotangents of the backward actually run (E = 0 for autograd); jvp confirms it independently.

Choices (unstated in seed 003): batch 2 x 6 tokens, width 8, 2-head causal softmax attention
(c_q, c_k, c_v, c_proj = W^A; no rotary / QK-norm: both sit inside the invariant branch), MLP
relu(x W_fc)^2 W^F, hidden 16, vocab 11, mean CE; x0 a fixed RMS-normalised random input (a frozen
embedding); r ~ 1 + 0.3 N, b ~ 0.5 + 0.3 N. Covariance is checked at eps = 0 (the only invariant
forward). Toy losses are reported, not compared with the paper's (its toy and step are unstated).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

Params = dict[str, Tensor]
DT = torch.float64
HEADS = 2
FLOOR = 1e-20  # seed 003's max(||y||^2, 1e-20) denominator floor
PAPER = {"checks": 89, "max_identity_error": 8.88e-16, "max_covariance_error": 3.68e-16}  # seed 003, not ours


def rms_norm(u: Tensor, eps: float) -> Tensor:
    return u / torch.sqrt(u.pow(2).mean(-1, keepdim=True) + eps)


class BranchTangentAdd(torch.autograd.Function):
    """y = u + f forward; backward (g_y, P_y g_y) with P_y = I - y y^T / ||y||^2 per token."""

    @staticmethod
    def forward(ctx, u: Tensor, f: Tensor) -> Tensor:
        y = u + f
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor]:
        (y,) = ctx.saved_tensors
        coef = (y * g).sum(-1, keepdim=True) / (y * y).sum(-1, keepdim=True).clamp_min(FLOOR)
        return g, g - coef * y


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
    """Loss of the idealised model; `rec` (if given) keeps the tensors the defect terms need."""
    add = BranchTangentAdd.apply if rule == "branch" else torch.add

    def keep(name: str, t: Tensor) -> Tensor:
        if rec is not None:  # retain so the audit can read this node's cotangent after backward
            t.retain_grad()
            rec[name] = t
        return t

    h, depth = x0, p["r"].numel()
    for i in range(depth):
        m = p["r"][i] * h + p["b"][i] * x0
        fa = _attention(keep(f"nA.{i}", rms_norm(m, eps)), p, i)
        a = keep(f"a.{i}", add(m, fa))
        ff = F.relu(keep(f"nF.{i}", rms_norm(a, eps)) @ p[f"wfc.{i}"]).square() @ p[f"wf.{i}"]
        h = keep(f"h.{i}", add(a, ff))
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


def gauge_defect(grads: Params, p: Params, layer: int, drop_next: bool = False) -> float:
    """D_l (0-based `layer`) contracted from a covector; drop_next omits -r_{l+1} dL/dr_{l+1}."""
    r, b, i = p["r"], p["b"], layer
    d = r[i] * grads["r"][i] + b[i] * grads["b"][i]
    d = d + (p[f"wa.{i}"] * grads[f"wa.{i}"]).sum() + (p[f"wf.{i}"] * grads[f"wf.{i}"]).sum()
    if i + 1 < r.numel() and not drop_next:
        d = d - r[i + 1] * grads["r"][i + 1]
    return float(d)


def norm_defect(u: Tensor, g_n: Tensor, eps: float) -> float:
    """C = sum_t eps / (RMS(u_t)^2 + eps) <N(u_t), g_{n_t}>: the norm's response to u -> e^s u."""
    kappa = eps / (u.pow(2).mean(-1, keepdim=True) + eps)
    return float((kappa * rms_norm(u, eps) * g_n).sum().detach())


def branch_work(f: Tensor, y: Tensor, g_y: Tensor) -> float:
    """E = sum_t <f_t, y_t><y_t, g_{y_t}> / ||y_t||^2: the radial credit the branch rule drops."""
    return float(((f * y).sum(-1) * (y * g_y).sum(-1) / (y * y).sum(-1).clamp_min(FLOOR)).sum().detach())


def predicted_defect(rec: dict, layer: int, eps: float, rule: str, head: bool = True) -> float:
    """C^A_l + C^F_l - E^A_l - E^F_l + 1[l=L] C_head (E only under the branch rule)."""
    i, last = layer, sum(k.startswith("h.") for k in rec) - 1
    d = norm_defect(rec[f"m.{i}"], rec[f"nA.{i}"].grad, eps) + norm_defect(rec[f"a.{i}"], rec[f"nF.{i}"].grad, eps)
    if head and i == last:
        d += norm_defect(rec[f"h.{i}"], rec["nH"].grad, eps)
    if rule == "branch":
        d -= branch_work(rec[f"fA.{i}"], rec[f"a.{i}"], rec[f"a.{i}"].grad)
        d -= branch_work(rec[f"fF.{i}"], rec[f"h.{i}"], rec[f"h.{i}"].grad)
    return d


def gauge_tangent(p: Params, layer: int) -> Params:
    """Generator K_l = d/ds of the gauge map at c_l = e^s (other c = 1), as a parameter tangent."""
    t, i = {k: torch.zeros_like(v) for k, v in p.items()}, layer
    t[f"wa.{i}"], t[f"wf.{i}"] = p[f"wa.{i}"].clone(), p[f"wf.{i}"].clone()
    t["r"][i], t["b"][i] = p["r"][i], p["b"][i]
    if i + 1 < p["r"].numel():
        t["r"][i + 1] = -p["r"][i + 1]
    return t


def gauge_jvp(p: Params, x0: Tensor, targets: Tensor, eps: float, layer: int) -> float:
    """Exact directional derivative of the (ordinary) loss along K_l, by forward mode."""
    _, d = torch.func.jvp(lambda q: forward(q, x0, targets, eps), (p,), (gauge_tangent(p, layer),))
    return float(d)


def gauge_transform(p: Params, c: Tensor) -> Params:
    """T_c: W^A_l, W^F_l *= c_l, r_l *= c_l / c_{l-1}, b_l *= c_l (c_0 = 1); other entries kept."""
    q = {k: v.clone() for k, v in p.items()}
    q["r"], q["b"] = p["r"] * c / torch.cat([c.new_ones(1), c[:-1]]), p["b"] * c
    for i in range(c.numel()):
        q[f"wa.{i}"], q[f"wf.{i}"] = p[f"wa.{i}"] * c[i], p[f"wf.{i}"] * c[i]
    return q


def transform_covector(g: Params, c: Tensor) -> Params:
    """Covector predicted at T_c(theta): T_c is diagonal, so its inverse transpose is T_{1/c}."""
    return gauge_transform(g, 1 / c)


def covariance_error(g_new: Params, g_expected: Params) -> float:
    scale = max(float(v.abs().max()) for v in g_expected.values())
    return max(float((g_new[k] - g_expected[k]).abs().max()) for k in g_new) / scale


def _vec(d: Params) -> Tensor:
    return torch.cat([d[k].flatten() for k in sorted(d)])


def _row(rows: list, name: str, kind: str, error: float, tol: float, value: float = math.nan) -> None:
    rows.append({"name": name, "kind": kind, "error": float(error), "tol": tol, "passed": bool(error <= tol),
                 "value": float(value)})


def _counterexamples(seed: int, probe_step: float, tol: float, rows: list) -> dict:
    p, x0, tg = make_toy(seed, 3)
    loss0, g, _ = backward(p, x0, tg, 0.0)
    _, gs, _ = backward(p, x0, tg, 0.0, "branch")
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


def run_gauge_audit(seed: int = 0, depths=(1, 2, 3), eps_values=(1e-6, 1e-3), tol: float = 1e-12,
                    probe_step: float = 1e-3) -> dict:
    """Run every check; see the module docstring for what each row means."""
    rows: list[dict] = []
    for depth in depths:
        p, x0, tg = make_toy(1000 * seed + depth, depth)
        for eps in (0.0, *eps_values):
            for rule in ("ordinary", "branch"):
                _, g, rec = backward(p, x0, tg, eps, rule)
                for i in range(depth):
                    tag, d = f"d{depth} l{i + 1} eps={eps:g} {rule}", gauge_defect(g, p, i)
                    form = "D_l = C - E (+C_head)" if rule == "branch" else "D_l = C (+C_head)"
                    err = abs(d - predicted_defect(rec, i, eps, rule))
                    _row(rows, f"{tag} {form}", "identity", err, tol, d)
                    if rule == "ordinary":  # forward mode: an independent route to the same number
                        err = abs(d - gauge_jvp(p, x0, tg, eps, i))
                        _row(rows, f"{tag} D_l = jvp along K_l", "identity", err, tol, d)
        gen = torch.Generator().manual_seed(seed + 7 * depth)
        c = torch.exp(torch.rand(depth, generator=gen, dtype=DT) * 2 - 1)  # c_l in [1/e, e]
        q = gauge_transform(p, c)
        l0, l1 = float(forward(p, x0, tg, 0.0)), float(forward(q, x0, tg, 0.0))
        _row(rows, f"d{depth} eps=0 loss invariant under gauge", "invariance", abs(l1 - l0) / abs(l0), 1e-14)
        for rule in ("ordinary", "branch"):
            g0, g1 = backward(p, x0, tg, 0.0, rule)[1], backward(q, x0, tg, 0.0, rule)[1]
            _row(rows, f"d{depth} eps=0 {rule} covector scale-covariant", "covariance",
                 covariance_error(g1, transform_covector(g0, c)), 1e-13)
    gen = torch.Generator().manual_seed(seed)
    u, f, gy = (torch.randn(3, 5, generator=gen, dtype=DT, requires_grad=i < 2) for i in range(3))
    y = BranchTangentAdd.apply(u, f)
    _row(rows, "branch add forward == u + f (bitwise)", "identity", float(not torch.equal(y, u + f)), 0.0)
    y.backward(gy)
    y = y.detach()
    proj = torch.eye(5, dtype=DT) - y[:, :, None] * y[:, None, :] / (y * y).sum(-1)[:, None, None]  # dense P_y
    pg = (proj @ gy[:, :, None])[..., 0]
    vjp = max(float((u.grad - gy).abs().max()), float((f.grad - pg).abs().max()))
    _row(rows, "branch add VJP == (g_y, P_y g_y)", "identity", vjp, tol)
    toy = _counterexamples(1000 * seed + 3, probe_step, tol, rows)

    worst = {k: max((r["error"] for r in rows if r["kind"] == k), default=0.0)
             for k in ("identity", "covariance", "invariance")}
    return {"checks": len(rows), "passed": sum(r["passed"] for r in rows), "max_identity_error": worst["identity"],
            "max_covariance_error": worst["covariance"], "max_invariance_error": worst["invariance"],
            "rows": rows, "toy": toy, "paper": PAPER}


def format_gauge_table(result: dict) -> str:
    r, t = result, result["toy"]
    lines = [f"gauge audit: {r['passed']}/{r['checks']} checks pass; max identity error "
             f"{r['max_identity_error']:.3g}, covariance {r['max_covariance_error']:.3g}, "
             f"invariance {r['max_invariance_error']:.3g} (paper: 89 checks, 8.88e-16, 3.68e-16; not enumerated)",
             f"{'check':<56} {'value':>11} {'error':>9} {'tol':>7}  ok"]
    lines += [f"{w['name']:<56} {w['value']:>11.4g} {w['error']:>9.3g} {w['tol']:>7.0e}  "
              f"{'yes' if w['passed'] else 'NO'}" for w in r["rows"]]
    lines.append(f"toy3 eps=0, step {t['probe_step']:g}: loss {t['loss']:.10f}; g+aK {t['loss_g_plus_aK']:.10f}; "
                 f"g {t['loss_g']:.10f}; -g {t['loss_minus_g']:.10f}; surrogate {t['loss_surrogate']:.10f} "
                 f"(cosine {t['surrogate_cosine']:.5f}, rel change {t['surrogate_rel_change']:.5f})")
    return "\n".join(lines)
