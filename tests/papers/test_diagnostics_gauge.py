"""FP64 residual-scale gauge audit (seed 003 "Residual-scale identity and its limits") on the production residual
addition: it passes on a toy and on the cpu-tiny GPT, each identity fails when one of its terms is
broken on purpose, and breaking the production rule (muonlab.model.variants.residual_rules) fails it."""

import pytest
import torch

from muonlab.papers.seed003.diagnostics import gauge as G
from muonlab.errors import UsageError
from muonlab.model.variants import residual_rules as RR

# torch's forward-mode AD loads its jvp decompositions through torch.jit.script, which warns
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
TOL = 1e-12
DEPTH = 3
BR = "branch_tangent"


@pytest.fixture(scope="module")
def result():
    return G.run_gauge_audit()


@pytest.fixture(scope="module")
def toy():
    return G.make_toy(11, DEPTH)


@pytest.fixture(scope="module")
def case():
    return G.build_gpt_case()


def _failed(r):
    return {w["name"] for w in r["rows"] if not w["passed"]}


def _wrong_norm_defect(u, g_n, eps):
    # the tempting eps / RMS^2 weight instead of eps / (RMS^2 + eps)
    kappa = eps / u.pow(2).mean(-1, keepdim=True)
    return float((kappa * G.rms_norm(u, eps) * g_n).sum().detach())


def test_default_audit_passes_on_production_code(result):
    # toy: 3 rows per (layer, eps) over depths 1..3 and eps in {0, 1e-6, 1e-3}, 3 per depth, 2 add rows,
    # 8 counterexample rows; GPT (cpu-tiny, 2 layers): 3 per layer, invariance, 2 covariances, 2 production rows
    assert result["counts"] == {"toy": 3 * 6 * 3 + 3 * 3 + 2 + 8, "gpt": 3 * 2 + 5}
    assert result["checks"] == 84 != G.PAPER["checks"]  # the paper's 89 are not enumerated
    assert result["passed"] == result["checks"], sorted(_failed(result))
    assert result["max_identity_error"] < 1e-14
    assert result["max_covariance_error"] < 1e-13
    assert result["max_invariance_error"] < 1e-14
    assert {r["kind"] for r in result["rows"]} == {"identity", "invariance", "covariance", "counterexample", "wiring"}
    g = result["gpt"]
    assert (g["preset"], g["arm"], g["seed"], g["depth"], g["width"]) == ("cpu-tiny", "p003_branch_tangent", 46, 2, 64)
    assert g["eps"] == torch.finfo(torch.float64).eps
    # the branch rule's defect is genuinely nonzero on the GPT, the ordinary one vanishes
    assert all(abs(g["defects"][f"{BR} l{i}"]) > 1e-3 for i in (1, 2))
    assert all(abs(g["defects"][f"ordinary l{i}"]) < 1e-14 for i in (1, 2))


def test_check_count_follows_the_configuration():
    r = G.run_gauge_audit(seed=3, depths=(2,), eps_values=(1e-4,), preset=None)
    assert r["checks"] == 3 * 2 * 2 + 3 + 2 + 8 and r["passed"] == r["checks"] and r["counts"]["gpt"] == 0


def test_ordinary_production_rule_fails_the_branch_rows(monkeypatch, case):
    # the production projection made the identity: branch_tangent becomes ordinary backprop
    monkeypatch.setattr(RR, "_project", lambda y, g: g)
    r = G.run_gauge_audit(depths=(1,), eps_values=(1e-3,), case=case)
    expected = {f"d1 l1 eps={e} {BR} D_l = C - E (+C_head)" for e in ("0", "0.001")}
    expected |= {f"gpt l{i} eps=2.2e-16 {BR} D_l = C - E (+C_head)" for i in (1, 2)}
    # and the surrogate, now the true gradient, has no gauge work left
    assert _failed(r) == expected | {"branch add VJP == (g_y, P_y g_y)", "toy3 branch surrogate has nonzero work"}


def test_perturbed_production_backward_fails_toy_and_gpt(monkeypatch, case):
    # the branch cotangent off by a relative 1e-9: the branch identities fail on the toy and the GPT,
    # the ordinary rows (which never call the projection) do not
    project = RR._project
    monkeypatch.setattr(RR, "_project", lambda y, g: project(y, g) * (1 + 1e-9))
    r = G.run_gauge_audit(depths=(1,), eps_values=(), case=case)
    failed = _failed(r)
    assert "branch add VJP == (g_y, P_y g_y)" in failed
    assert f"d1 l1 eps=0 {BR} D_l = C - E (+C_head)" in failed
    assert {f"gpt l{i} eps=2.2e-16 {BR} D_l = C - E (+C_head)" for i in (1, 2)} <= failed
    assert not any("ordinary" in n for n in failed)


def test_plain_addition_in_place_of_the_production_rule_is_caught(monkeypatch, case):
    # residual_add replaced by u + f for every rule: the GPT no longer reaches the custom Function
    monkeypatch.setattr(RR, "residual_add", lambda u, f, rule="ordinary": u + f)
    r = G.run_gauge_audit(depths=(1,), eps_values=(), case=case)
    failed = _failed(r)
    assert "gpt all 4 additions ran the production branch_tangent Function" in failed
    assert {f"gpt l{i} eps=2.2e-16 {BR} D_l = C - E (+C_head)" for i in (1, 2)} <= failed
    assert "branch add VJP == (g_y, P_y g_y)" in failed


def test_gpt_audit_reads_the_models_own_hook(case):
    # the branch backward runs through the hook the arm wired (a ResidualRule), not a copy
    hook = case.model.points.residual_add
    assert isinstance(hook.__self__, RR.ResidualRule) and hook.__self__.cfg.rule == BR
    _, _, rec = G.gpt_backward(case, BR)
    assert len(rec["calls"]) == 4 and all(isinstance(fn, RR._BranchTangentAdd._backward_cls) for fn in rec["calls"])
    _, _, rec = G.gpt_backward(case, "ordinary")  # use_rule(model, "ordinary"): plain autograd adds
    assert not any(isinstance(fn, RR._BranchTangentAdd._backward_cls) for fn in rec["calls"])
    assert case.model.points.residual_add == hook  # restored after recording


def test_gpt_gauge_invariance_only_for_the_right_map(case):
    p, lay = case.params, case.layout
    c = torch.tensor([2.0, 0.5], dtype=G.DT)
    l0 = G.gpt_loss(case)
    assert abs(G.gpt_loss(case, G.gauge_transform(p, c, lay)) - l0) / l0 < 1e-14
    wrong = dict(G.gauge_transform(p, c, lay), resid_lambdas=p["resid_lambdas"] * c)  # forgets the 1 / c_{l-1}
    assert abs(G.gpt_loss(case, wrong) - l0) > 1e-6


def test_gpt_refuses_models_the_gauge_does_not_cover():
    with pytest.raises(UsageError, match="branch_tangent"):
        G.build_gpt_case(arm="p003_ordinary")
    with pytest.raises(UsageError, match="branch_tangent"):
        G.build_gpt_case(arm="p003_state_gate")
    with pytest.raises(UsageError, match="autoresearch"):
        G.build_gpt_case(preset="tied-cpu")


def test_ideal_identity_needs_the_next_resid_lambda_term(toy):
    p, x0, tg = toy
    _, g, _ = G.backward(p, x0, tg, 0.0)
    assert all(abs(G.gauge_defect(g, p, i)) < TOL for i in range(DEPTH))
    # dropping -r_{l+1} dL/dr_{l+1} breaks every layer but the last (where it is absent anyway)
    assert all(abs(G.gauge_defect(g, p, i, drop_next=True)) > 1e-4 for i in range(DEPTH - 1))
    assert G.gauge_defect(g, p, DEPTH - 1, drop_next=True) == G.gauge_defect(g, p, DEPTH - 1)


def test_finite_eps_identity_needs_the_exact_C_terms(toy):
    p, x0, tg = toy
    eps = 1e-3
    _, g, rec = G.backward(p, x0, tg, eps)
    for i in range(DEPTH):
        d = G.gauge_defect(g, p, i)
        assert abs(d) > 1e-7  # finite eps genuinely breaks the symmetry ...
        assert abs(d - G.predicted_defect(rec, i, eps, "ordinary")) < TOL  # ... by exactly C
        wrong = _wrong_norm_defect(rec[f"m.{i}"], rec[f"nA.{i}"].grad, eps)
        wrong += _wrong_norm_defect(rec[f"a.{i}"], rec[f"nF.{i}"].grad, eps)
        if i == DEPTH - 1:
            wrong += _wrong_norm_defect(rec[f"h.{i}"], rec["nH"].grad, eps)
        assert abs(d - wrong) > 1e-9
    # the head term belongs to the last layer only
    last = DEPTH - 1
    assert abs(G.gauge_defect(g, p, last) - G.predicted_defect(rec, last, eps, "ordinary", head=False)) > 1e-7


def test_radial_head_term_equals_the_papers_C_head(toy):
    # the GPT's C_head is sum_t <h_t, g_{h_t}>; on the toy, where N(h_L) is recorded, it equals the paper's form
    p, x0, tg = toy
    eps = 1e-3
    _, _, rec = G.backward(p, x0, tg, eps)
    h = rec[f"h.{DEPTH - 1}"]
    paper = G.norm_defect(h, rec["nH"].grad, eps)
    assert abs(paper) > 1e-7 and abs(G.radial_defect(h, h.grad) - paper) < 1e-15
    a = rec["a.0"]  # a_1 feeds the skip as well as its norm: its total cotangent is not the norm's alone
    assert abs(G.radial_defect(a, a.grad) - G.norm_defect(a, rec["nF.0"].grad, eps)) > 1e-4


def test_gauge_defect_is_the_derivative_along_the_gauge(toy):
    # direct checks of D_l: forward-mode jvp (exact) and a central difference of L along c_l = e^s
    p, x0, tg = toy
    eps, h = 1e-3, 1e-5
    _, g, _ = G.backward(p, x0, tg, eps)
    for i in range(DEPTH):
        d = G.gauge_defect(g, p, i)
        assert abs(d - G.gauge_jvp(p, x0, tg, eps, i)) < TOL
        c = torch.ones(DEPTH, dtype=G.DT)
        lp, lm = (float(G.forward(G.gauge_transform(p, c.index_fill(0, torch.tensor([i]), s)), x0, tg, eps))
                  for s in (torch.e**h, torch.e**-h))
        assert abs((lp - lm) / (2 * h) - d) < 1e-9


def test_branch_rule_identity_needs_E_with_minus_sign(toy):
    p, x0, tg = toy
    for eps in (0.0, 1e-3):
        _, gb, recb = G.backward(p, x0, tg, eps, BR)
        _, go, reco = G.backward(p, x0, tg, eps, "ordinary")
        for i in range(DEPTH):
            db, do = G.gauge_defect(gb, p, i), G.gauge_defect(go, p, i)
            assert abs(db - G.predicted_defect(recb, i, eps, BR)) < TOL
            e = (G.branch_work(recb[f"fA.{i}"], recb[f"a.{i}"], recb[f"a.{i}"].grad)
                 + G.branch_work(recb[f"fF.{i}"], recb[f"h.{i}"], recb[f"h.{i}"].grad))
            assert abs(e) > 1e-5  # nonzero gauge work of the surrogate
            assert abs(db - G.predicted_defect(recb, i, eps, "ordinary")) > 1e-6  # E omitted
            assert abs(db - (G.predicted_defect(recb, i, eps, "ordinary") + e)) > 1e-6  # E with the wrong sign
            # an ordinary backward where the branch rule is assumed: E from its cotangents does not fit
            assert abs(do - G.predicted_defect(reco, i, eps, BR)) > 1e-6


def test_audit_flags_a_wrong_C_term(monkeypatch):
    monkeypatch.setattr(G, "norm_defect", _wrong_norm_defect)
    r = G.run_gauge_audit(depths=(2,), eps_values=(1e-3,), preset=None)
    failed = _failed(r)
    assert failed and all("eps=0.001" in n and "D_l = C" in n for n in failed)


def test_gauge_invariance_only_for_the_right_map(toy):
    p, x0, tg = toy
    c = torch.tensor([2.0, 0.5, 3.0], dtype=G.DT)
    q = G.gauge_transform(p, c)
    l0, l1 = float(G.forward(p, x0, tg, 0.0)), float(G.forward(q, x0, tg, 0.0))
    assert abs(l1 - l0) / l0 < 1e-14
    assert abs(float(G.forward(q, x0, tg, 1e-2)) - float(G.forward(p, x0, tg, 1e-2))) > 1e-8  # eps breaks it
    wrong = dict(q, r=p["r"] * c)  # forgets the 1 / c_{l-1}
    assert abs(float(G.forward(wrong, x0, tg, 0.0)) - l0) > 1e-6


@pytest.mark.parametrize("rule", ["ordinary", BR])
def test_covectors_are_scale_covariant(toy, rule):
    p, x0, tg = toy
    c = torch.tensor([2.0, 0.5, 3.0], dtype=G.DT)
    g0 = G.backward(p, x0, tg, 0.0, rule)[1]
    g1 = G.backward(G.gauge_transform(p, c), x0, tg, 0.0, rule)[1]
    assert G.covariance_error(g1, G.transform_covector(g0, c)) < 1e-13
    assert G.covariance_error(g1, G.gauge_transform(g0, c)) > 1e-2  # transforming like the parameters is wrong
    assert G.covariance_error(g1, g0) > 1e-2


def test_counterexamples(result):
    t = result["toy"]
    assert t["loss_g_plus_aK"] < t["loss"] < t["loss_minus_g"]  # g + aK descends, -g ascends
    assert t["loss_surrogate"] < t["loss"]  # the surrogate descends despite nonzero work
    assert t["work_g_plus_aK"][0] > 1e-3 and max(abs(w) for w in t["work_minus_g"]) < TOL
    assert max(abs(w) for w in t["work_surrogate"]) > 1e-4
    assert 0.9 < t["surrogate_cosine"] < 1.0 and 0.0 < t["surrogate_rel_change"] < 0.5


def test_format_table(result):
    s = G.format_gauge_table(result)
    assert "84/84 checks pass (73 toy, 11 GPT)" in s and "paper: 89 checks" in s and "arm p003_branch_tangent" in s
    assert len(s.splitlines()) == 4 + result["checks"] + 1
    assert "NO" not in s.split() and "note:" not in s


def test_format_names_a_low_precision_production_reduction(monkeypatch, result):
    # a production projection that works in fp32 on float64 input is named as the cause
    monkeypatch.setattr(RR, "_project", lambda y, g: g.float())
    r = G.run_gauge_audit(depths=(), eps_values=(), preset=None)
    assert r["reduction_dtype"] == "torch.float32" and "branch add VJP == (g_y, P_y g_y)" in _failed(r)
    assert "reduces float64 cotangents in torch.float32" in G.format_gauge_table(r)
