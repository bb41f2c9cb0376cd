"""Right-projected Neumann-Gram vocabulary whitening (muonlab.optim.addons.neumann_whitening), seed 002 §2.1 (Tier 1).

The fp32 implementation is checked against a plain float64 transcription of the paper's formula
(tables with zero rows and columns, and all-zero tables: no NaN), against the formula's
invariants (centred rows, the mean add-back, the Gram spectrum map lambda -> lambda (1 - a lambda)^2,
the exact inverse square root as terms grow), inside MuonAdamW (the gradient AdamW receives),
with the options off (upstream step, bitwise), through a state_dict round trip, and on 2 gloo
ranks (row-sharded and replicated tables) against one process.
"""

import copy
import io

import pytest
import torch

import muonlab.optim.muon_adamw as muon_module
from muonlab.optim import MuonAdamW
from muonlab.optim.distributed import DistMuonAdamW, adamw_is_sharded
from muonlab.optim.steps import adamw_step
from muonlab.optim.addons.neumann_whitening import WHITEN_DEFAULTS, binomial_coefficients, neumann_whiten

from support.ranks import assert_state_equal, averaged_replay, dyadic_steps, run_ranks


def neumann_ref(G, beta, mean_addback=False):
    """The paper's formula, transcribed in float64."""
    G = G.double()
    V = G.shape[0]
    g_bar = torch.ones(1, V, dtype=torch.float64) @ G / V
    U = G - torch.ones(V, 1, dtype=torch.float64) @ g_bar
    C = U.T @ U
    Uw = U - 0.5 * min(beta, 1.0) * U @ (C / (torch.linalg.matrix_norm(C) + 1e-30))
    return Uw + g_bar if mean_addback else Uw


def _table(shape, seed, zero_row=True, zero_col=True):
    g = torch.Generator().manual_seed(seed)
    # Zipf-like row scales and a common-mode row, as vocabulary-table gradients have
    G = torch.randn(shape, generator=g) * torch.rand(shape[0], 1, generator=g).pow(4) + torch.randn(shape[1], generator=g)
    if zero_row:
        G[1] = 0
    if zero_col:
        G[:, 2] = 0
    return G


def close(a, b, rtol=2e-5):
    """Agreement relative to the tensor's scale (fp32 matmuls against float64)."""
    err = (a.double() - b.double()).abs().max().item()
    return err <= rtol * b.double().abs().max().item() + 1e-30


SHAPES = [(64, 16), (40, 40), (7, 32)]


# ---------------------------------------------------------------- the math

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("addback", [False, True])
def test_matches_formula_in_float64(shape, beta, addback):
    G = _table(shape, seed=shape[0] + int(10 * beta))
    out = neumann_whiten(G, beta, mean_addback=addback)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert close(out, neumann_ref(G, beta, addback))
    assert (out[:, 2] == 0).all() if not addback else True  # a zero column stays zero (C's row/col is 0)


def test_zero_and_degenerate_tables_give_no_nan():
    for G in (torch.zeros(10, 8), torch.ones(10, 8) * 3.0, torch.zeros(1, 8), _table((10, 8), 3)):
        for addback in (False, True):
            out = neumann_whiten(G, 1.0, mean_addback=addback)
            assert torch.isfinite(out).all()
            assert close(out, neumann_ref(G, 1.0, addback)) or neumann_ref(G, 1.0, addback).abs().max() == 0
    # a constant table is pure common mode: whitened to exactly 0, restored by the add-back
    assert neumann_whiten(torch.ones(10, 8) * 3.0, 1.0).abs().max() == 0
    assert torch.equal(neumann_whiten(torch.ones(10, 8) * 3.0, 1.0, mean_addback=True), torch.ones(10, 8) * 3.0)


def test_beta_zero_is_centring_and_addback_restores_the_mean_row():
    G = _table((50, 12), 5)
    U = G - G.mean(0, keepdim=True)
    assert torch.equal(neumann_whiten(G, 0.0), U)
    for beta in (0.0, 0.4, 1.0):
        out = neumann_whiten(G, beta)
        assert out.double().mean(0).abs().max() < 1e-6 * G.abs().max()  # rows stay centred: 1^T U C = 0
        back = neumann_whiten(G, beta, mean_addback=True)
        assert torch.allclose(back.double().mean(0), G.double().mean(0), atol=1e-6)


def test_right_factor_spectrum():
    """Gram of U_w = F C F with F = I - beta/2 C_hat: eigenvalues lambda (1 - a lambda)^2, a = beta / (2 ||C||_F);
    the right factor's eigenvalues lie in [1 - beta/2, 1], so ||U_w|| in [(1 - beta/2) ||U||, ||U||] and
    the Gram's condition number does not grow."""
    G = _table((80, 16), 7, zero_col=False)
    U = (G - G.mean(0, keepdim=True)).double()
    C = U.T @ U
    lam = torch.linalg.eigvalsh(C)
    for beta in (0.25, 1.0):
        out = neumann_whiten(G, beta).double()
        a = beta / (2 * torch.linalg.matrix_norm(C))
        expect = lam * (1 - a * lam) ** 2
        got = torch.linalg.eigvalsh(out.T @ out)
        assert torch.allclose(got, expect, rtol=1e-4, atol=1e-6 * lam.max())
        n, nu = out.norm(), U.norm()
        assert (1 - beta / 2) * nu * (1 - 1e-6) <= n <= nu * (1 + 1e-6)
        assert got.max() / got.min() <= lam.max() / lam.min() * (1 + 1e-6)


def test_more_terms_converge_to_the_exact_inverse_square_root():
    assert binomial_coefficients(3) == [1.0, -0.5, 0.375, -0.3125]
    G = _table((60, 10), 11)
    U = (G - G.mean(0, keepdim=True)).double()
    C = U.T @ U
    Chat = C / torch.linalg.matrix_norm(C)
    beta = 0.5
    w, Q = torch.linalg.eigh(torch.eye(10, dtype=torch.float64) + beta * Chat)
    exact = U @ (Q @ torch.diag(w.rsqrt()) @ Q.T)
    errs = [(neumann_whiten(G, beta, terms=k).double() - exact).abs().max().item() for k in (1, 2, 4, 8, 30)]
    assert all(e1 > e2 for e1, e2 in zip(errs, errs[1:]))
    assert errs[-1] < 1e-5 * exact.abs().max()
    assert torch.equal(neumann_whiten(G, beta, terms=1), neumann_whiten(G, beta))


# ---------------------------------------------------------------- inside MuonAdamW

TABLES = [(48, 16), (30, 8)]


def _params(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(s, generator=g) * 0.1).to(dtype)) for s in TABLES + [(5,)]]


def _groups(ps, opts=None):
    """Two table groups carrying opts (group keys), and a 1-D group without them."""
    opts = opts or {}
    return [dict(kind="adamw", params=ps[:1], lr=0.6, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0, **opts),
            dict(kind="adamw", params=ps[1:2], lr=0.004, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0, **opts),
            dict(kind="adamw", params=ps[2:], lr=0.5, betas=(0.96, 0.95), eps=1e-10, weight_decay=0.0)]


def _grads(ps, step):
    for i, p in enumerate(ps):
        G = _table(p.shape, 100 * step + i) if p.dim() == 2 else torch.randn(
            p.shape, generator=torch.Generator().manual_seed(100 * step + i))
        p.grad = G.to(p.dtype)


def _run(opts=None, steps=3, dtype=torch.float32):
    ps = _params(dtype=dtype)
    opt = MuonAdamW(_groups(ps, opts))
    for step in range(steps):
        _grads(ps, step)
        opt.step()
    return ps, opt


def test_options_off_are_the_upstream_step_bitwise(monkeypatch):
    # reference: the upstream AdamW recurrence, called directly on p.grad
    ps = _params()
    states = [dict(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p)) for p in ps]
    hp = [(0.6, 0.8), (0.004, 0.8), (0.5, 0.96)]
    for step in range(3):
        _grads(ps, step)
        with torch.no_grad():
            for p, s, (lr, b1) in zip(ps, states, hp):
                s["step"] += 1
                t = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
                adamw_step(p, p.grad, s["exp_avg"], s["exp_avg_sq"], t(s["step"]), t(lr), t(b1), t(0.95),
                           t(1e-10), t(0.0))
    seen = []
    real = muon_module.adamw_step
    monkeypatch.setattr(muon_module, "adamw_step", lambda p, g, *a: (seen.append(g is p.grad), real(p, g, *a)))
    off = WHITEN_DEFAULTS | {"whiten.tau": 3.0, "whiten.terms": 4, "whiten.mean_addback": True}  # kind None: ignored
    for opts in ({}, off):
        seen.clear()
        qs, _ = _run(opts)
        assert all(seen) and len(seen) == 9  # the gradient object itself, untouched
        assert all(torch.equal(p, q) for p, q in zip(ps, qs))


@pytest.mark.parametrize("addback", [False, True])
def test_adamw_receives_the_whitened_gradient(addback, monkeypatch):
    seen = []
    real = muon_module.adamw_step
    monkeypatch.setattr(muon_module, "adamw_step",
                        lambda p, g, *a: (seen.append((p.shape, g.clone(), p.grad.clone())), real(p, g, *a)))
    tau = 2.0
    _run({"whiten.kind": "neumann", "whiten.tau": tau, "whiten.mean_addback": addback}, steps=3)
    for i, (shape, g, raw) in enumerate(seen):
        step = i // 3 + 1  # t = the AdamW step counter, 1 at the first update
        if len(shape) == 1:
            assert torch.equal(g, raw)
            continue
        assert close(g, neumann_ref(raw, min(step / tau, 1.0) ** 2, addback))
    # p.grad is not modified by the step
    ps, _ = _run({"whiten.kind": "neumann"}, steps=1)
    _grads(ps_copy := _params(), 0)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ps, ps_copy))


def test_t0_and_tau_zero():
    seen = []
    real = muon_module.adamw_step

    def capture(p, g, *a):
        seen.append(g.clone())
        return real(p, g, *a)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(muon_module, "adamw_step", capture)
        ps, _ = _run({"whiten.kind": "neumann", "whiten.first_t": 0}, steps=1)  # t = 0 at the first update: beta = 0
        assert torch.equal(seen[0], ps[0].grad - ps[0].grad.mean(0, keepdim=True))
        seen.clear()
        ps, _ = _run({"whiten.kind": "neumann", "whiten.tau": 0.0}, steps=1)  # undamped from the start
        assert close(seen[0], neumann_ref(ps[0].grad, 1.0))


def test_bf16_tables_keep_bf16_state():
    ps, opt = _run({"whiten.kind": "neumann", "whiten.tau": 1.0}, steps=2, dtype=torch.bfloat16)
    assert all(torch.isfinite(p.float()).all() for p in ps)
    st = opt.state_dict()["state"][0]
    assert st["exp_avg"].dtype == torch.bfloat16 and st.keys() == {"step", "exp_avg", "exp_avg_sq"}


def test_master32_moments_get_the_fp32_whitened_gradient_unrounded(monkeypatch):
    """Seed 002 §2.1 (Tier 1), §3 item 3: Neumann-Gram runs in fp32 and feeds the fp32 master's moments directly; a bf16
    rounding in between (the whitened gradient cast back to the bf16 table's dtype) is a different step."""
    seen = []
    real = muon_module.adamw_step
    monkeypatch.setattr(muon_module, "adamw_step", lambda p, g, *a: (seen.append((p, g.clone())), real(p, g, *a)))
    ps, opt = _run({"whiten.kind": "neumann", "whiten.tau": 1.0, "master32": True}, steps=1, dtype=torch.bfloat16)
    master, g = seen[0]
    assert master.dtype == torch.float32 and g.dtype == torch.float32
    want = neumann_ref(ps[0].grad, 1.0)  # t = 1, tau 1: beta = 1, in float64 from the bf16 gradient
    assert close(g, want)
    assert not torch.equal(g, g.bfloat16().float())  # fp32 bits a bf16 rounding would have dropped
    state = opt.state[ps[0]]
    torch.testing.assert_close(state["exp_avg"], (1 - 0.8) * g, rtol=1e-6, atol=0)  # moments from g itself ...
    assert not torch.allclose(state["exp_avg"], (1 - 0.8) * g.bfloat16().float(), rtol=1e-6, atol=0)  # not rounded
    # without master32 the bf16 table keeps bf16 moments: the step gets the whitened gradient rounded once
    seen.clear()
    _run({"whiten.kind": "neumann", "whiten.tau": 1.0}, steps=1, dtype=torch.bfloat16)
    assert seen[0][1].dtype == torch.bfloat16 and torch.equal(seen[0][1], g.bfloat16())


def test_whitening_changes_the_update():
    a, _ = _run({"whiten.kind": "neumann", "whiten.tau": 1.0}, steps=2)
    b, _ = _run(steps=2)
    assert not torch.equal(a[0], b[0]) and not torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_bad_options_raise():
    ps = _params()
    with pytest.raises(ValueError, match=r"whiten\.kind must be"):
        MuonAdamW(_groups(ps, {"whiten.kind": "cholesky"}))
    with pytest.raises(ValueError, match="2-D tables"):
        MuonAdamW([{"kind": "adamw", "params": ps[2:], "lr": 0.1, "whiten.kind": "neumann"}])
    with pytest.raises(ValueError, match=r"whiten\.terms"):
        MuonAdamW(_groups(ps, {"whiten.kind": "neumann", "whiten.terms": 0}))


@pytest.mark.parametrize("extra", [{}, {"whiten.mean_addback": True, "whiten.terms": 2, "whiten.tau": 3.0}])
def test_state_dict_round_trip_continues_bitwise(extra):
    k, n = 2, 3
    opts = {"whiten.kind": "neumann", **extra}
    ref, _ = _run(opts, steps=k + n)
    ps = _params()
    opt = MuonAdamW(_groups(ps, opts))
    for step in range(k):
        _grads(ps, step)
        opt.step()
    buf = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in ps], "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    qs = [torch.nn.Parameter(t) for t in saved["params"]]
    opt2 = MuonAdamW(_groups(qs, opts))
    opt2.load_state_dict(saved["opt"])
    assert opt2.state_dict()["param_groups"][0]["whiten.kind"] == "neumann"
    for step in range(k, k + n):
        _grads(qs, step)
        opt2.step()
    assert all(torch.equal(p, q) for p, q in zip(ref, qs))


# ---------------------------------------------------------------- distributed

DIST_TABLES = [(64, 32), (10, 8)]  # 2048 elements, 64 % 2 == 0: row-sharded at W=2; 80: replicated


def _dist_params():
    g = torch.Generator().manual_seed(3)
    return [torch.nn.Parameter(torch.randn(s, generator=g) * 0.1) for s in DIST_TABLES]


def _dist_groups(ps):
    return [{"kind": "adamw", "params": ps[:1], "lr": 0.6, "whiten.kind": "neumann", "whiten.tau": 2.0},
            {"kind": "adamw", "params": ps[1:], "lr": 0.004, "whiten.kind": "neumann", "whiten.tau": 2.0,
             "whiten.mean_addback": True}]


def _dist_worker(rank, world, steps):
    ps = _dist_params()
    opt = DistMuonAdamW(_dist_groups(ps))
    history = dyadic_steps(opt, ps, rank, steps)
    return {"history": history, "full": opt.full_state_dict(), "shard": copy.deepcopy(opt.state_dict())}


def test_distributed_whitening_equals_one_process(tmp_path):
    steps = 3
    assert adamw_is_sharded(_dist_params()[0], 2) and not adamw_is_sharded(_dist_params()[1], 2)
    results = run_ranks(_dist_worker, 2, tmp_path / "ranks", steps)
    ps = _dist_params()
    opt, ref = averaged_replay(ps, _dist_groups(ps), steps)
    for rank, res in enumerate(results):
        for step in range(steps):
            assert torch.equal(res["history"][step], ref[step]), (rank, step)
        assert_state_equal(res["full"], opt.state_dict())
        assert res["shard"]["state"][0]["exp_avg"].shape == (32, 32)  # state stays row-sharded
        assert res["shard"]["state"][1]["exp_avg"].shape == (10, 8)
