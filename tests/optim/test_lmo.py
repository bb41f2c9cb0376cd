"""Clipped-row LMO of seed 004 (§2.2 eqs. 4–5; App. E–G properties): muonlab.optim.lmo.

The reference is independent of the implementation: eq. (4)/(13) solved for tau by a bracketing
root finder (scipy brentq) in float64, row by row; optimality (Prop. 1) is checked against SLSQP
and against random feasible points, so the reference itself is checked too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

optimize = pytest.importorskip("scipy.optimize", reason="the LMO's references need scipy (pip install 'muonlab[stats]')")
brentq, minimize = optimize.brentq, optimize.minimize

import muonlab.optim.lmo as lmo_mod
from muonlab.optim.lmo import clipped_row_lmo, lmo_objective, tie_norm

KINDS = ("gauss", "heavy", "cauchy", "sparse", "ties", "near_ties", "spiky", "scaled", "zero_rows", "one_hot")


def ref_row(b: np.ndarray, c: float) -> np.ndarray:
    """eq. (4)-(5) directly: tau from sum_j min(c^2, tau^2 b_j^2) = min(d, c^2 k) by brentq (fp64)."""
    d, a = b.size, np.abs(b)
    k = int((a > 0).sum())
    if k == 0:
        return np.zeros(d)
    if c >= math.sqrt(d):  # case 4 (also c = inf), decided in floating point as documented: at
        return math.sqrt(d) * b / np.linalg.norm(b)  # c ~ sqrt(d) the entries move like sqrt(d - c^2)
    if c * c * k <= d:  # every tau >= c / min|b_j| solves (4): c sign(b)
        return c * np.sign(b)
    a = a / a.max()
    energy = lambda tau: np.minimum(c * c, tau * tau * a * a).sum() - d  # noqa: E731
    tau = brentq(energy, 0.0, c / a[a > 0].min(), xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=2000)
    return np.sign(b) * np.minimum(c, tau * a)


def ref(B: np.ndarray, c: float) -> np.ndarray:
    return np.stack([ref_row(b, c) for b in B]) if len(B) else B.copy()


def make_table(kind: str, V: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "gauss":
        return rng.standard_normal((V, d))
    if kind == "heavy":
        return rng.standard_t(1.5, (V, d))
    if kind == "cauchy":  # huge dynamic range inside a row: many Newton steps
        return rng.standard_cauchy((V, d)) ** 3
    if kind == "sparse":
        return rng.standard_normal((V, d)) * (rng.random((V, d)) < rng.uniform(0.02, 0.5))
    if kind == "ties":
        return rng.integers(-3, 4, (V, d)).astype(float)
    if kind == "near_ties":
        return rng.choice([-2.0, -1.0, 1.0, 2.0, 5.0], (V, d)) * (1 + 1e-7 * rng.standard_normal((V, d)))
    if kind == "spiky":
        B = 1e-3 * rng.standard_normal((V, d))
        B[np.arange(V), rng.integers(0, d, V)] = rng.choice([-1.0, 1.0], V)
        return B
    if kind == "scaled":  # row scales from 1e-30 to 1e30: the exact fp64 path for squares out of range
        return rng.standard_normal((V, d)) * 10.0 ** rng.uniform(-30, 30, (V, 1))
    if kind == "zero_rows":
        return rng.standard_normal((V, d)) * (rng.random((V, 1)) < 0.5)
    if kind == "one_hot":
        B = np.zeros((V, d))
        B[np.arange(V), rng.integers(0, d, V)] = rng.standard_normal(V)
        return B
    raise ValueError(kind)


@st.composite
def cases(draw, max_v: int = 8, max_d: int = 48):
    d = draw(st.integers(1, max_d))
    V = draw(st.integers(1, max_v))
    kind = draw(st.sampled_from(KINDS))
    cap = draw(st.one_of(st.sampled_from([1.0, 1.0 + 1e-9, 2.0, 3.0, math.sqrt(d), math.inf]),
                         st.floats(1.0, math.sqrt(d) + 2.0)))
    return make_table(kind, V, d, draw(st.integers(0, 2**32 - 1))), float(cap)


def lmo64(B: np.ndarray, c: float, **kw) -> np.ndarray:
    return clipped_row_lmo(torch.from_numpy(B), c, **kw).numpy()


def lmo32(B: np.ndarray, c: float, **kw) -> np.ndarray:
    B32 = np.clip(B, -1e30, 1e30).astype(np.float32)
    return clipped_row_lmo(torch.from_numpy(B32), c, **kw).double().numpy()


@settings(max_examples=150, deadline=None)
@given(cases())
def test_matches_independent_root_finder(case):
    """Prop. 1 / eq. (4)-(5): equal to the brentq solution, fp64 to 1e-9, fp32 input to 2e-5."""
    B, c = case
    R = ref(B, c)
    scale = max(1.0, min(c, math.sqrt(B.shape[1])))
    np.testing.assert_allclose(lmo64(B, c), R, rtol=0, atol=1e-9 * scale)
    R32 = ref(np.clip(B, -1e30, 1e30).astype(np.float32).astype(np.float64), c)
    np.testing.assert_allclose(lmo32(B, c), R32, rtol=0, atol=2e-5 * scale)


@settings(max_examples=150, deadline=None)
@given(cases(), st.sampled_from(["fp64", "fp32"]))
def test_feasible_energy_support_papr(case, prec):
    """Feasibility, ||L||^2 = min(d, c^2 k), supp L = supp b, PAPR bounds (seed 004 Prop. 1, App. E, Prop. 7 (App. F.3))."""
    B, c = case
    L = lmo64(B, c) if prec == "fp64" else lmo32(B, c)
    if prec == "fp32":
        B = np.clip(B, -1e30, 1e30).astype(np.float32).astype(np.float64)
    d = B.shape[1]
    tol = 1e-12 if prec == "fp64" else 2e-6
    k = (B != 0).sum(1)
    energy = (L * L).sum(1)
    assert np.all(np.abs(L) <= min(c, math.sqrt(d)) * (1 + tol))
    assert np.all(energy <= d * (1 + 4 * tol))
    ck = np.where(k > 0, c * c * np.maximum(k, 1), 0.0)  # c^2 k (0 on zero rows, also for c = inf)
    np.testing.assert_allclose(energy, np.minimum(d, ck), rtol=4 * tol, atol=0)
    np.testing.assert_array_equal(L != 0, B != 0)
    assert np.all(np.sign(L) == np.sign(B))
    nz = k > 0
    papr = d * (L[nz] ** 2).max(1) / energy[nz]
    assert np.all(papr <= d * c * c / np.minimum(d, ck[nz]) * (1 + 8 * tol))
    dense = nz & (ck >= d)
    assert np.all(d * (L[dense] ** 2).max(1) / energy[dense] <= min(c * c, d) * (1 + 8 * tol))
    sup = nz & (ck <= d)
    np.testing.assert_allclose(d * (L[sup] ** 2).max(1) / energy[sup], d / k[sup], rtol=8 * tol)


def test_optimal_against_slsqp_and_random_feasible_points():
    """Prop. 1: <b, L_c(b)> is the max of <b, u> over ||u||_2 <= sqrt(d), ||u||_inf <= c."""
    rng = np.random.default_rng(0)
    for trial in range(40):
        d = int(rng.integers(2, 7))
        c = float(rng.choice([1.0, 1.2, 1.7, 2.0, rng.uniform(1, 3)]))
        kind = KINDS[trial % len(KINDS)]
        b = make_table(kind, 1, d, trial)[0]
        u = lmo64(b[None], c)[0]
        b = b / max(np.abs(b).max(), 1e-300)  # SLSQP wants O(1) data; the LMO is scale invariant
        best = float(b @ u)
        cons = [{"type": "ineq", "fun": lambda x: d - x @ x, "jac": lambda x: -2 * x}]
        slsqp = -math.inf
        for x0 in (np.zeros(d), np.clip(np.sign(b), -c, c), rng.uniform(-1, 1, d)):
            r = minimize(lambda x: -(b @ x), x0, jac=lambda x: -b, bounds=[(-c, c)] * d,
                         constraints=cons, method="SLSQP", options=dict(ftol=1e-14, maxiter=500))
            if r.success and r.x @ r.x <= d * (1 + 1e-9):
                slsqp = max(slsqp, float(b @ r.x))
        assert slsqp <= best + 1e-7 * (1 + abs(best))
        assert best <= slsqp + 1e-5 * (1 + abs(best)), (kind, d, c, best, slsqp)
        X = rng.uniform(-c, c, (4000, d)) * (rng.random((4000, d)) < 0.8)  # random feasible points
        X *= np.minimum(1.0, math.sqrt(d) / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300))
        near = u + 1e-3 * rng.standard_normal((4000, d))  # and feasible points close to L
        near = np.clip(near, -c, c)
        near *= np.minimum(1.0, math.sqrt(d) / np.linalg.norm(near, axis=1, keepdims=True))
        assert np.all(np.concatenate([X, near]) @ b <= best + 1e-12 * (1 + abs(best)))


@pytest.mark.parametrize("steps", [0, 1, 2])
def test_exact_sort_path_and_newton_limit(monkeypatch, steps):
    """With few Newton steps the remaining rows take the sort-based closed form: same answer."""
    monkeypatch.setattr(lmo_mod, "_NEWTON_STEPS", steps)
    for i, kind in enumerate(KINDS):
        B = make_table(kind, 12, 40, 100 + i)
        for c in (1.3, 2.0, 3.0, 6.0):
            np.testing.assert_allclose(lmo64(B, c), ref(B, c), rtol=0, atol=1e-9 * c)


def test_endpoints_exact():
    """c = 1 is sign exactly (sparse rows too); c >= sqrt(d) and c = inf are row-RMS; zero rows 0."""
    B = torch.from_numpy(make_table("sparse", 64, 50, 1)).float()
    B[3] = 0
    assert torch.equal(clipped_row_lmo(B, 1.0), torch.sign(B))
    assert torch.equal(clipped_row_lmo(B.double(), 1.0), torch.sign(B.double()))
    Bd = B.double()
    nrm = Bd.norm(dim=1, keepdim=True)
    rms = torch.where(nrm > 0, Bd * math.sqrt(50) / nrm, 0.0)
    for c in (math.sqrt(50), 7.5, 100.0, math.inf):
        L = clipped_row_lmo(B, c)
        torch.testing.assert_close(L.double(), rms, rtol=2e-6, atol=2e-6)
        assert torch.equal(L[3], torch.zeros(50))
    # c = sqrt(d) exactly with k = 1: case 2 and case 4 agree (c e_1)
    e1 = torch.zeros(1, 16, dtype=torch.float64)
    e1[0, 5] = -0.25
    assert torch.equal(clipped_row_lmo(e1, 4.0), -4.0 * (e1 != 0).double())
    # support-limited rows: c sign(b) exactly
    sparse = torch.zeros(3, 100)
    sparse[0, :5], sparse[1, 7], sparse[2, ::10] = torch.tensor([3.0, -1e-3, 2.0, 5.0, -7.0]), 1e-20, 1.0
    for c in (1.5, 2.0, 3.0):
        assert torch.equal(clipped_row_lmo(sparse, c), c * torch.sign(sparse))


def test_continuity_at_endpoints():
    """The finite-cap solver meets the fast paths at c -> 1+ and c -> sqrt(d)- (seed 004 Prop. 1 endpoints; continuity is our check)."""
    B = torch.from_numpy(make_table("heavy", 30, 64, 2))
    torch.testing.assert_close(clipped_row_lmo(B, 1.0 + 1e-9), torch.sign(B), rtol=0, atol=1e-6)
    torch.testing.assert_close(clipped_row_lmo(B, 8.0 * (1 - 1e-12)), clipped_row_lmo(B, 8.0), rtol=0, atol=1e-8)


def test_rotation_example_and_worked_papr():
    """Seed 004 App. G, Prop. 7: L_c(e_1) = c e_1 (PAPR d), L_c(1/sqrt(d)) = 1."""
    e1 = torch.zeros(1, 16)
    e1[0, 0] = 1.0
    u = clipped_row_lmo(e1, 2.0)
    assert torch.equal(u, 2.0 * e1)
    assert 16 * u.square().max() / u.square().sum() == 16
    q = torch.full((1, 16), 0.25)
    torch.testing.assert_close(clipped_row_lmo(q, 2.0), torch.ones(1, 16), rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(cases(), st.sampled_from([torch.float32, torch.float64]), st.integers(0, 2**32 - 1))
def test_symmetries(case, dtype, seed):
    """Odd (bitwise), positively scale invariant, row- and signed-column-permutation equivariant."""
    B0, c = case
    B = torch.from_numpy(np.clip(B0, -1e30, 1e30)).to(dtype)
    L = clipped_row_lmo(B, c)
    assert torch.equal(clipped_row_lmo(-B, c), -L)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    scale = max(1.0, min(c, math.sqrt(B.shape[1])))
    g = torch.Generator().manual_seed(seed)
    for a in (0.37, 1e3, 2.0**-7):
        Ba = B * a
        if torch.isfinite(Ba).all() and (Ba.abs() >= torch.finfo(dtype).tiny).sum() == (B != 0).sum():
            torch.testing.assert_close(clipped_row_lmo(Ba, c), L, rtol=0, atol=tol * scale)
    P = torch.randperm(B.shape[0], generator=g)
    Q = torch.randperm(B.shape[1], generator=g)
    s = torch.where(torch.rand(B.shape[1], generator=g) < 0.5, -1.0, 1.0).to(dtype)
    torch.testing.assert_close(clipped_row_lmo(B[P][:, Q] * s, c), L[P][:, Q] * s, rtol=0, atol=tol * scale)


@settings(max_examples=60, deadline=None)
@given(cases(max_v=6, max_d=40))
def test_objective_monotone_in_cap(case):
    """h_c(b) = <b, L_c(b)> nondecreasing in c, h_1 = ||b||_1, h_inf = sqrt(d) ||b||_2 (App. F.2);
    lmo_objective matches the closed form c sum_A |b| + tau sum_{not A} b^2 (Cor. 1)."""
    B, _ = case
    B = np.clip(B, -1e30, 1e30) / max(1.0, np.abs(B).max())
    d = B.shape[1]
    Bt = torch.from_numpy(B)
    caps = [1.0, 1.2, 1.5, 2.0, 3.0, 5.0, math.sqrt(d), 10.0, math.inf]
    h = [lmo_objective(Bt, clipped_row_lmo(Bt, c)).numpy() for c in caps]
    for lo, hi in zip(h, h[1:]):
        assert np.all(lo <= hi + 1e-12 * (1 + np.abs(hi)))
    np.testing.assert_allclose(h[0], np.abs(B).sum(1), rtol=1e-12)
    np.testing.assert_allclose(h[-1], math.sqrt(d) * np.linalg.norm(B, axis=1), rtol=1e-12)
    for c, hc in zip(caps, h):
        np.testing.assert_allclose(hc, (B * ref(B, c)).sum(1), rtol=1e-9, atol=1e-300)
    norms = np.linalg.norm(B, axis=1)
    if norms.sum() > 0:
        retention = [x.sum() / (math.sqrt(d) * norms.sum()) for x in h]
        assert 1 / math.sqrt(d) - 1e-12 <= retention[0] and retention[-1] <= 1 + 1e-12


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(KINDS), min_size=1, max_size=4), st.integers(1, 40),
       st.sampled_from([1.0, 1.5, 3.0, 5.0, math.inf]), st.sampled_from([torch.float32, torch.float64]),
       st.integers(0, 2**32 - 1))
def test_chunked_equals_unchunked_bitwise(kinds, d, c, dtype, seed):
    B = torch.from_numpy(np.clip(np.concatenate([make_table(k, 7, d, seed + i) for i, k in enumerate(kinds)]),
                                 -1e30, 1e30)).to(dtype)
    whole = clipped_row_lmo(B, c, chunk_rows=B.shape[0])
    for rows in (1, 2, 5, 13, None):
        assert torch.equal(clipped_row_lmo(B, c, chunk_rows=rows), whole)


def test_dtypes_and_out():
    """bf16/fp16/fp32 in -> fp32 out (as L of the fp32 cast, bitwise); fp64 -> fp64; out= and in place."""
    B = torch.from_numpy(make_table("heavy", 300, 96, 3)).float()
    ref32 = clipped_row_lmo(B, 3.0)
    assert ref32.dtype == torch.float32
    for low in (torch.bfloat16, torch.float16):
        Bl = B.clamp(-6e4, 6e4).to(low)
        L = clipped_row_lmo(Bl, 3.0, chunk_rows=7)
        assert L.dtype == torch.float32 and torch.equal(L, clipped_row_lmo(Bl.float(), 3.0))
    assert clipped_row_lmo(B.double(), 3.0).dtype == torch.float64
    np.testing.assert_allclose(clipped_row_lmo(B.double(), 3.0).numpy(), ref32.double().numpy(), atol=2e-5)
    buf = torch.empty_like(B)
    assert clipped_row_lmo(B, 3.0, out=buf) is buf and torch.equal(buf, ref32)
    inplace = B.clone()
    assert torch.equal(clipped_row_lmo(inplace, 3.0, chunk_rows=64, out=inplace), ref32)
    strided = B.t().contiguous().t()  # a non-contiguous view of the same values
    assert not strided.is_contiguous() and torch.equal(clipped_row_lmo(strided, 3.0), ref32)
    leaf = B.clone().requires_grad_(True)  # runs under no_grad
    assert not clipped_row_lmo(leaf, 3.0).requires_grad
    with pytest.raises(ValueError):
        clipped_row_lmo(B, 3.0, out=torch.empty(300, 96, dtype=torch.float64))
    with pytest.raises(ValueError):
        clipped_row_lmo(B, 3.0, out=torch.empty(300, 95))


def test_validation_and_degenerate_shapes():
    B = torch.randn(4, 8)
    for bad in (0.5, float("nan"), -1.0):
        with pytest.raises(ValueError):
            clipped_row_lmo(B, bad)
    with pytest.raises(ValueError):
        clipped_row_lmo(torch.randn(8), 3.0)
    with pytest.raises(ValueError):
        clipped_row_lmo(torch.ones(4, 8, dtype=torch.int64), 3.0)
    with pytest.raises(ValueError):
        clipped_row_lmo(B, 3.0, chunk_rows=0)
    assert clipped_row_lmo(torch.empty(0, 8), 3.0).shape == (0, 8)
    assert clipped_row_lmo(torch.empty(3, 0), 3.0).shape == (3, 0)
    assert torch.equal(clipped_row_lmo(torch.zeros(5, 8), 3.0), torch.zeros(5, 8))
    one = torch.tensor([[-0.5], [0.0], [2.0]])
    assert torch.equal(clipped_row_lmo(one, 3.0), torch.sign(one))  # d = 1: sqrt(d) <= c


def test_table_scale_feasibility():
    """A NanoGPT-like slice (fp32, d = 768, c = 3): feasible, unit RMS on dense rows, the audit's shape."""
    g = torch.Generator().manual_seed(0)
    B = torch.randn(3000, 768, generator=g) * 1e-3
    B[:1000] = B[:1000] / torch.rand(1000, 768, generator=g).clamp_min(1e-3) ** 0.5  # heavier tails
    L = clipped_row_lmo(B, 3.0)
    assert L.abs().max() <= 3.0
    rms = L.double().square().mean(1).sqrt()
    torch.testing.assert_close(rms, torch.ones(3000, dtype=torch.float64), rtol=3e-6, atol=0)
    capped = (L.abs() == 3.0).any(1).double().mean()
    assert 0.5 < capped <= 1.0  # most rows touch the cap at c = 3 (paper audit: 90% of rows)
    assert float(tie_norm(L, 3.0)) == pytest.approx(1.0, abs=3e-6)


def test_tie_norm():
    U = torch.tensor([[3.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert float(tie_norm(U, 2.0)) == pytest.approx(1.5)  # row: ||(3,0,0,0)|| / 2 = 1.5; entry 3/2
    assert float(tie_norm(U, 1.0)) == pytest.approx(3.0)  # entry term dominates
    assert float(tie_norm(U, math.inf)) == pytest.approx(1.5)
    assert float(tie_norm(torch.zeros(0, 4), 2.0)) == 0.0
    B = torch.from_numpy(make_table("sparse", 50, 30, 4))
    for c in (1.0, 2.0, 3.0, math.inf):  # the LMO lands on the unit sphere of the norm
        assert float(tie_norm(clipped_row_lmo(B, c), c)) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError):
        tie_norm(torch.ones(3), 2.0)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_sort_method_matches_independent_root_finder(case):
    """The CUDA method (the closed form on every row): the same reference, the same tolerances."""
    B, c = case
    scale = max(1.0, min(c, math.sqrt(B.shape[1])))
    np.testing.assert_allclose(lmo64(B, c, method="sort"), ref(B, c), rtol=0, atol=1e-9 * scale)
    R32 = ref(np.clip(B, -1e30, 1e30).astype(np.float32).astype(np.float64), c)
    np.testing.assert_allclose(lmo32(B, c, method="sort"), R32, rtol=0, atol=2e-5 * scale)


class _NoHostSync(torch.overrides.TorchFunctionMode):
    """Refuses the tensor operations that make a CUDA stream wait for the host: a value read
    back (item, tolist, bool) or a shape that depends on values (nonzero, boolean indexing)."""

    SYNCING = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.nonzero, torch.nonzero,
               torch.Tensor.masked_select, torch.masked_select, torch.Tensor.cpu, torch.unique, torch.Tensor.unique}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        index_ops = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)
        if func in self.SYNCING or (func in index_ops and _holds_a_bool_tensor(args[1])):
            raise AssertionError(f"host synchronisation: {getattr(func, '__name__', func)}")
        return func(*args, **kwargs)


def _holds_a_bool_tensor(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def test_sort_method_never_waits_for_the_host():
    """On CUDA the LMO runs every optimizer step over a 50,304-row table: the sort method reads
    nothing back; the Newton method (which drops settled rows) does, and the check sees it."""
    B = torch.from_numpy(np.concatenate([make_table(k, 20, 64, i) for i, k in enumerate(KINDS)])).float()
    for c in (1.0, 2.5, 3.0, math.inf):
        with _NoHostSync():
            got = clipped_row_lmo(B, c, chunk_rows=37, method="sort")
        np.testing.assert_allclose(got.double().numpy(), lmo32(B.double().numpy(), c), rtol=0, atol=2e-5 * min(c, 8))
    with pytest.raises(AssertionError, match="host synchronisation"), _NoHostSync():
        clipped_row_lmo(B, 3.0, method="newton")


def test_sort_method_chunks_and_method_choice():
    B = torch.from_numpy(make_table("heavy", 300, 96, 3)).float()
    whole = clipped_row_lmo(B, 3.0, method="sort", chunk_rows=300)
    for rows in (1, 7, None):
        assert torch.equal(clipped_row_lmo(B, 3.0, method="sort", chunk_rows=rows), whole)
    assert torch.equal(clipped_row_lmo(B, 3.0), clipped_row_lmo(B, 3.0, method="newton"))  # CPU: newton
    with pytest.raises(ValueError, match="method"):
        clipped_row_lmo(B, 3.0, method="bisect")
