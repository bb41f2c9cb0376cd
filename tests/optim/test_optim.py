"""MuonAdamW against its equations: Polar Express, Nesterov, NorMuon, cautious WD, AdamW, state."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from muonlab.optim import MuonAdamW, polar_express
from muonlab.optim.polar import FROBENIUS_EPS, FROBENIUS_SAFETY


def orthogonal(n, seed):
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


@pytest.mark.parametrize("m,n", [(64, 32), (32, 64), (48, 48)])
def test_polar_express_maps_singular_values_near_one(m, n):
    """For spectra in [1e-2, 1], Polar Express keeps the singular vectors and lands sigma near 1."""
    k = min(m, n)
    U, V = orthogonal(m, 1)[:, :k], orthogonal(n, 2)[:, :k]
    s = torch.logspace(-2, 0, k, dtype=torch.float64)
    G = (U * s) @ V.T
    X = polar_express(G.float()).double()
    core = U.T @ X @ V  # should be ~diagonal with entries ~1
    diag = torch.diagonal(core)
    assert diag.min() > 0.6 and diag.max() < 1.25
    off = core - torch.diag(diag)
    assert off.norm() / diag.norm() < 0.05
    assert X.dtype == torch.float64  # caller's cast; the iteration itself ran in bf16


@settings(max_examples=25, deadline=None)
@given(m=st.integers(2, 40), n=st.integers(2, 40), seed=st.integers(0, 10_000))
def test_polar_express_bounded_and_transpose_symmetric(m, n, seed):
    G = torch.randn(m, n, generator=torch.Generator().manual_seed(seed))
    X = polar_express(G)
    assert X.dtype == torch.bfloat16 and torch.isfinite(X).all()
    assert torch.linalg.matrix_norm(X.float(), ord=2) < 1.3
    if m != n:  # the tall and wide branches are transposes of each other
        torch.testing.assert_close(polar_express(G.T).T.float(), X.float(), rtol=0.02, atol=0.02)


def test_polar_express_normalisation():
    G = torch.randn(8, 4)
    # only the direction enters, via the Frobenius norm (a power-of-two scale rounds identically
    # in bf16, so only the 1e-6 epsilon differs)
    torch.testing.assert_close(polar_express(G * 1024).float(), polar_express(G).float(), rtol=0.01, atol=0.01)
    assert FROBENIUS_SAFETY == 1.02 and FROBENIUS_EPS == 1e-6
    with pytest.raises(ValueError):
        polar_express(G, steps=6)


def muon_reference(p, g, m, v, lr, mom, wd, beta2, ns=5):
    """The Muon step written out from its equations, in float64 around the shared bf16 polar step."""
    rows, cols = p.shape
    m = m + (1 - mom) * (g - m)  # momentum buffer
    u = g + mom * (m - g)  # Nesterov look-ahead
    o = polar_express(u, ns).double()
    red = -1 if rows >= cols else -2
    v_mean = o.square().mean(dim=red, keepdim=True)
    v = v + (1 - beta2) * (v_mean - v)
    step = v.clamp_min(1e-10).rsqrt()
    scaled = o * step
    scaled = scaled * (o.norm() / scaled.norm())  # NorMuon keeps the Frobenius norm
    lr_eff = lr * max(1.0, rows / cols) ** 0.5
    mask = (scaled * p) >= 0
    p = p - lr_eff * scaled - lr_eff * wd * p * mask
    return p, m, v


@pytest.mark.parametrize("shape", [(32, 16), (16, 32), (24, 24)])
def test_muon_step_matches_equations(shape):
    """Teacher-forced: each step from the optimizer's own state against the written-out equations.

    Tolerance: the reference forms the Nesterov look-ahead in float64 and the optimizer in fp32,
    so a few entries round to a neighbouring bf16 value before Polar Express; that moves the
    update by well under 2% of its norm (the reference check allows 8%).
    """
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*shape) * 0.1) for _ in range(3)]
    opt = MuonAdamW([dict(kind="muon", params=params, lr=0.04, momentum=0.9, beta2=0.95, weight_decay=0.2)])
    vshape = (3, shape[0], 1) if shape[0] >= shape[1] else (3, 1, shape[1])
    m_all, v_all = torch.zeros(3, *shape), torch.zeros(vshape)
    for it in range(4):
        grads = [torch.randn(*shape) for _ in params]
        before = [p.detach().double().clone() for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        if it > 0:
            state = opt.state[params[0]]
            m_all, v_all = state["momentum_buffer"].clone(), state["second_momentum_buffer"].clone()
        opt.step()
        for i, g in enumerate(grads):
            p_ref, _, _ = muon_reference(before[i], g.double(), m_all[i].double(), v_all[i].double(),
                                         0.04, 0.9, 0.2, 0.95)
            err = (params[i].detach().double() - p_ref).norm() / (p_ref - before[i]).norm()
            assert err < 0.02, (it, i, err.item())


def test_cautious_weight_decay_only_where_signs_agree():
    """Decay acts only where the update and the parameter agree in sign (upstream's cautious
    rule: p -= lr * u + lr * wd * p * [u * p >= 0]). The update u is read off a run without
    decay from the same state; a square matrix keeps the shape factor at 1."""
    torch.manual_seed(0)
    start, grad = torch.randn(8, 8), torch.randn(8, 8)
    lr, wd = 0.1, 0.5
    after = {}
    for decay in (0.0, wd):
        p = torch.nn.Parameter(start.clone())
        opt = MuonAdamW([dict(kind="muon", params=[p], lr=lr, weight_decay=decay)], compile=False)
        p.grad = grad.clone()
        opt.step()
        after[decay] = p.detach().clone()
    step = start - after[0.0]  # lr * u, as the decay-free step applied it
    agree = step * start >= 0
    assert 0 < int(agree.sum()) < agree.numel()  # both cases occur
    # upstream casts lr and wd to the update's dtype (bf16 out of Polar Express) before use
    lr_b, wd_b = (torch.tensor(v).to(torch.bfloat16).float() for v in (lr, wd))
    expected = start - (step + lr_b * wd_b * start * agree)
    torch.testing.assert_close(after[wd], expected, rtol=0, atol=1e-6)
    # where signs disagree, decay leaves the parameter exactly as the decay-free step did
    assert torch.equal(after[wd][~agree], after[0.0][~agree])


def test_adamw_matches_torch_adamw():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5, 7))
    b = torch.nn.Parameter(a.detach().clone())
    ours = MuonAdamW([dict(kind="adamw", params=[a], lr=0.01, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1)])
    theirs = torch.optim.AdamW([b], lr=0.01, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1)
    for _ in range(5):
        g = torch.randn(5, 7)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _model_and_opt(seed=0):
    from muonlab.model import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig(sequence_len=16, vocab_size=32, n_layer=2, n_head=2, n_kv_head=2, n_embd=64,
                          attn_backend="sdpa"))
    model.init_weights()
    model.float()
    return model, model.setup_optimizer(matrix_lr=0.04, embedding_lr=0.6, weight_decay=0.2)


def _train_steps(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 32, (2, 16), generator=g)
        model(x, x).backward()
        opt.step()
        model.zero_grad(set_to_none=True)


def test_state_dict_round_trip_is_exact():
    model, opt = _model_and_opt()
    _train_steps(model, opt, 3, seed=1)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    _train_steps(model, opt, 2, seed=2)

    model2, opt2 = _model_and_opt(seed=123)  # different init, overwritten by the load
    model2.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    assert opt2.state_dict()["state"].keys() == saved_opt["state"].keys()
    _train_steps(model2, opt2, 2, seed=2)
    for (n, p), (_, q) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(p, q), n


def test_groups_are_validated():
    with pytest.raises(ValueError, match="kind"):
        MuonAdamW([dict(params=[torch.nn.Parameter(torch.zeros(2, 2))], lr=0.1)])
    with pytest.raises(ValueError, match="one shape"):
        MuonAdamW([dict(kind="muon", lr=0.1, params=[torch.nn.Parameter(torch.zeros(2, 2)),
                                                      torch.nn.Parameter(torch.zeros(2, 3))])])
    with pytest.raises(ValueError, match="2-D"):
        MuonAdamW([dict(kind="muon", lr=0.1, params=[torch.nn.Parameter(torch.zeros(4))])])


def test_muon_group_without_gradients_is_skipped():
    p = torch.nn.Parameter(torch.ones(4, 4))
    opt = MuonAdamW([dict(kind="muon", params=[p], lr=0.1)])
    opt.step()
    assert torch.equal(p.detach(), torch.ones(4, 4)) and not opt.state


def test_the_raised_recompile_limit_is_the_optimizer_steps_own(monkeypatch):
    """Twelve Muon shape groups are twelve graphs of muon_step: more than dynamo's default limit
    of 8, which fullgraph turns into an error. The compiled step raises the limit for its own
    calls; outside them (the model's compile) the default still holds, so a recompiling model
    is seen. Compiled with dynamo's eager backend: the tracing and its limits are real, the
    kernels are not generated."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": "eager"}))
    torch._dynamo.reset()
    default = torch._dynamo.config.recompile_limit
    params = [torch.nn.Parameter(torch.randn(4 + i, 6)) for i in range(12)]
    opt = MuonAdamW([dict(kind="muon", params=[p], lr=0.02) for p in params], compile=True)
    for p in params:
        p.grad = torch.randn_like(p)
    before = [p.detach().clone() for p in params]
    opt.step()
    assert all(not torch.equal(p, b) for p, b in zip(params, before))  # every group stepped
    assert torch._dynamo.config.recompile_limit == default == 8

    def model_like(x):  # dynamo's default applies here: the 9th shape is not compiled
        return x * 2

    compiled = real_compile(model_like, backend="eager", dynamic=False, fullgraph=True)
    shapes_compiled = 0
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        for n in range(1, 12):
            compiled(torch.zeros(n))
            shapes_compiled += 1
    assert shapes_compiled == default
    torch._dynamo.reset()
