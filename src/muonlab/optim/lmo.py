"""Finite-cap clipped-row LMO of the tied table (seed 004, AF-Muon; §2.2 eqs. 4–5, Apps. E–G).

Norm ||U||_tie,c = max(max_i ||u_i||_2 / sqrt(d), max_ij |U_ij| / c), c >= 1; its unit ball is a
product over rows, so the LMO acts row by row. For a row b with support S = {j: b_j != 0},
k = |S|, eq. (4)/(13): choose tau >= 0 with sum_j min(c^2, tau^2 b_j^2) = min(d, c^2 k), and
eq. (5)/(14): L_c(b)_j = sign(b_j) min(c, tau |b_j|), zero off the support (L_c(0) = 0).
Prop. 1 / Thm 4: L_c(b) maximises <b, u> over ||u||_2 <= sqrt(d), ||u||_inf <= c.

Cases (seed 004 Prop. 1, App. E): c == 1 -> sign(b) exactly (sparse rows included); c >= sqrt(d) or c = inf ->
row-RMS sqrt(d) b / ||b||; c^2 k <= d (support-limited) -> c sign(b) exactly; otherwise
radius-limited, tau unique, output clamp(tau b, -c, c) with ||L||_2^2 = d.

How tau is found (exact; the reference's bisection is not used). With t = tau^2 the energy
f(t) = sum_j min(c^2, t b_j^2) is concave, increasing, piecewise linear. Newton from the row-RMS
scale t_0 = d / ||b||^2 (a lower bound of the root: clipping only lowers energy),
t <- (d - c^2 m) / sum_{uncapped} b^2 with m = #{t b^2 >= c^2}, stays below the root, only
grows the capped set and lands exactly on the root, the closed form of App. F.2
(tau = sqrt((d - c^2 |A|) / sum_{j not in A} b_j^2)) for the final capped set A. A step is
accepted as the root when no uncapped entry reaches the cap at the new t (checked through the
largest uncapped entry, margin 1e-6) or the capped set repeats. Gaussian rows at c = 3 take 1
step, heavy tails 2-5. Each step is 6 fused passes over the rows still moving (mul, clamp, sum,
threshold, sum, amin); m is recovered exactly as the integer (f - t T) / c^2 of two row sums.
Rows not settled after `_NEWTON_STEPS` steps, rows whose uncapped energy vanishes (candidates for
support-limited), zero rows and rows whose squares leave fp range (sum b^2 outside
[tiny^0.8, max^0.8]) take the sort-based closed form of seed 004 App. F.2 in fp64 (rows
divided by their max first), which is exact too; Newton only avoids its sort on the bulk
(a full sort costs ~20x a row-RMS pass on CPU).

Choices: compute in fp32 (fp64 for fp64 input) and return that dtype (fp32 like the momentum
buffer, whatever the input: bf16/fp16/fp32 -> fp32); `out` (contiguous, that dtype, may be B
itself) receives the result; rows are processed in chunks of complete rows (`chunk_rows`,
default ~4 MiB of fp32 per chunk, cache sized; 3 chunk-sized scratch buffers are reused), so
chunking never changes the result (bitwise, for d below torch's 32768-element reduction grain,
beyond which a lone row's sum may be split across threads). Non-finite inputs are not checked.
Runs under no_grad. Two methods, the same answer: "newton" (above; CPU's default) drops settled
rows as it goes, which on CUDA is a host synchronisation per Newton step and chunk; "sort" (CUDA's
default) takes every row through the sort-based closed form in fp64, in chunks of ~64 MiB of
fp64 rows (a 50,304 x 768 table in 5), with no data-dependent shape and so no host
synchronisation: the GPU sorts a row as fast as it reduces one.
lmo_objective returns the per-row objective <b_i, L_i> in fp64 (sum it for
N*_tie,c(B) = sum_i h_c(b_i), Cor. 1); tie_norm returns a 0-dim fp64 tensor.
"""

from __future__ import annotations

import math

import torch

_CHUNK_BYTES = 4 * 2**20  # fp32 bytes of one chunk of rows (newton: a CPU cache)
_SORT_CHUNK_BYTES = 64 * 2**20  # fp64 bytes of one chunk of rows (sort: ~8x that in temporaries)
METHODS = ("newton", "sort")
_NEWTON_STEPS = 12  # Newton steps before the exact sort-based path takes the remaining rows
_VERIFY = 1.0 - 1e-6  # margin of the "no uncapped entry reaches the cap" root test


def _rows_exact(X: torch.Tensor, c: float) -> torch.Tensor:
    """L_c of a few rows in fp64 by the sort-based closed form (seed 004 App. F.2)."""
    X = X.double()
    n, d = X.shape
    amax = X.abs().amax(1, keepdim=True)
    q = X / torch.where(amax > 0, amax, 1.0)  # dynamic range; the oracle is scale invariant
    if c >= math.sqrt(d):
        nrm = torch.linalg.vector_norm(q, dim=1, keepdim=True)
        return q * torch.where(nrm > 0, math.sqrt(d) / nrm, 0.0)
    c2 = c * c
    Q = q.abs().sort(dim=1, descending=True).values
    S = Q * Q
    tail = S.flip(1).cumsum(1).flip(1)  # tail[:, m] = T_m = sum_{j >= m} Q_j^2 (0-based), no cancellation
    k = (Q > 0).sum(1, keepdim=True).to(X.dtype)  # float: c2 * k must not round in fp32
    m = torch.arange(d, device=X.device, dtype=X.dtype)  # m = number of capped coordinates
    R = d - c2 * m
    valid = (m < k) & (R > 0) & (tail > 0)
    t_m = torch.where(valid, R / torch.where(valid, tail, 1.0), 0.0)
    m_star = (valid & (t_m * S >= c2)).sum(1, keepdim=True).clamp(max=d - 1)  # tau_m Q_{m+1} >= c
    L = (q * t_m.gather(1, m_star).sqrt()).clamp(-c, c)
    return torch.where(c2 * k <= d, c * torch.sign(q), L)  # support-limited rows (zero rows: 0)


def _newton(S: torch.Tensor, t: torch.Tensor, c2: float, ws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Newton on f(t) = d for rows S = b^2 (S lives in ws[0] or ws[2]; ws[1] scratch).

    Returns t (the root of every settled row) and a mask of rows for the exact path."""
    n, d = S.shape
    rows = torch.arange(n, device=S.device)
    t_out, hard = t.clone(), torch.zeros(n, dtype=torch.bool, device=S.device)
    m_old = torch.zeros(n, dtype=torch.float64, device=S.device)
    for _ in range(_NEWTON_STEPS):
        na = S.shape[0]
        Zn = torch.mul(S, (-t).unsqueeze(1), out=ws[1][:na])  # -t b^2
        f = -Zn.clamp_(min=-c2).sum(1).double()  # f(t) = c^2 m + t T; capped entries now -c^2
        tT = -torch.threshold_(Zn, -c2, 0.0).sum(1).double()  # t T: uncapped (t b^2 < c^2) only
        zu = -Zn.amin(1).double()  # t * largest uncapped b^2
        m = torch.round((f - tT) / c2)  # capped count: an integer, the sums' error << c^2 / 2
        R = d - c2 * m
        bad = (tT <= 0) | (R <= 0)  # every support entry capped (support-limited?) or odd: exact path
        t64 = t.double()
        t_next = torch.maximum(t, (t64 * R / torch.where(bad, 1.0, tT)).to(t.dtype))  # monotone
        root = zu * t_next.double() < c2 * _VERIFY * t64  # nothing new reaches the cap at t_next
        same = m == m_old  # the capped set repeated: t itself is the root
        done = bad | root | same
        t_out[rows[done]] = torch.where(same, t, t_next)[done]
        hard[rows[bad]] = True
        idx = (~done).nonzero().squeeze(1)
        if idx.numel() == 0:
            return t_out, hard
        if idx.numel() < na:  # keep only the moving rows (ping-pong between ws[0] and ws[2])
            other = ws[2] if S.data_ptr() == ws[0].data_ptr() else ws[0]
            S = torch.index_select(S, 0, idx, out=other[:idx.numel()])
        t, m_old, rows = t_next[idx], m[idx], rows[idx]
    hard[rows] = True
    return t_out, hard


def _lmo_rows(X: torch.Tensor, c: float, Y: torch.Tensor, ws: torch.Tensor) -> None:
    """L_c of every row of X, written into Y (same shape, compute dtype); ws [3, >= n, d] scratch."""
    if X.dtype != Y.dtype:
        X = Y.copy_(X)
    if c == 1.0:
        torch.sign(X, out=Y)
        return
    n, d = Y.shape
    S = torch.mul(X, X, out=ws[0][:n])
    T0 = S.sum(1)
    fin = torch.finfo(Y.dtype)
    fine = (T0 >= fin.tiny ** 0.8) & (T0 <= fin.max ** 0.8)  # squares safely in range, nonzero row
    t = torch.where(fine, d / T0, 0.0)  # tau^2 of row-RMS
    hard = ~fine
    capped = c < math.sqrt(d)
    if capped:
        act = (fine & (t * S.amax(1) >= c * c)).nonzero().squeeze(1)  # row-RMS reaches the cap
        if 2 * act.numel() > n:  # mostly active: all rows (the others settle at once, unchanged)
            t_n, hard_n = _newton(S, t, c * c, ws)
            t, hard = torch.where(fine, t_n, t), hard | (hard_n & fine)
        elif act.numel():
            Sa = torch.index_select(S, 0, act, out=ws[2][:act.numel()])
            t[act], hard_a = _newton(Sa, t[act], c * c, ws)
            hard[act] |= hard_a
    h = hard.nonzero().squeeze(1)
    exact = _rows_exact(X.index_select(0, h), c) if h.numel() else None  # before Y (may be X) changes
    torch.mul(X, t.sqrt().unsqueeze(1), out=Y)
    if capped:
        Y.clamp_(-c, c)
    if exact is not None:
        Y[h] = exact.to(Y.dtype)


def _sort_rows(X: torch.Tensor, c: float, Y: torch.Tensor) -> None:
    """L_c of every row of X into Y by the closed form alone: no host synchronisation."""
    if c == 1.0:
        torch.sign(X, out=Y)
    else:
        Y.copy_(_rows_exact(X, c))


@torch.no_grad()
def clipped_row_lmo(B: torch.Tensor, cap: float, chunk_rows: int | None = None,
                    out: torch.Tensor | None = None, method: str | None = None) -> torch.Tensor:
    """Row-wise clipped-row LMO L_c of a table B [V, d] (seed 004 eq. 4-5 / 13-14), fp32 out.

    method: "newton" or "sort" (module docstring); None picks sort on CUDA, newton elsewhere."""
    if B.ndim != 2 or not B.is_floating_point():
        raise ValueError(f"clipped_row_lmo wants a 2-D floating tensor, got {tuple(B.shape)} {B.dtype}")
    cap = float(cap)
    if math.isnan(cap) or cap < 1.0:
        raise ValueError(f"cap must be >= 1 (inf allowed), got {cap}")
    V, d = B.shape
    dtype = torch.float64 if B.dtype == torch.float64 else torch.float32
    if out is None:
        out = torch.empty((V, d), dtype=dtype, device=B.device)
    elif out.shape != B.shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {dtype} tensor of shape {tuple(B.shape)}")
    method = method or ("sort" if B.device.type == "cuda" else "newton")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if chunk_rows is None:
        chunk_bytes = _CHUNK_BYTES // 4 if method == "newton" else _SORT_CHUNK_BYTES // 8
        chunk_rows = max(1, chunk_bytes // max(d, 1))
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if V == 0 or d == 0:
        return out
    rows = min(chunk_rows, V)
    if method == "sort":
        for i in range(0, V, rows):
            _sort_rows(B[i:i + rows], cap, out[i:i + rows])
        return out
    ws = torch.empty((3, rows, d), dtype=dtype, device=B.device)  # scratch reused by every chunk
    for i in range(0, V, rows):
        _lmo_rows(B[i:i + rows], cap, out[i:i + rows], ws)
    return out


def lmo_objective(B: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """Per-row objective <b_i, L_i> in fp64 [V]; its sum is N*_tie,c(B) when L = L_c(B) (Cor. 1)."""
    return (B.double() * L.double()).sum(1)


def tie_norm(U: torch.Tensor, cap: float) -> torch.Tensor:
    """||U||_tie,c = max(max_i ||u_i||_2 / sqrt(d), max_ij |U_ij| / c) as a 0-dim fp64 tensor."""
    if U.ndim != 2:
        raise ValueError(f"tie_norm wants a 2-D tensor, got {tuple(U.shape)}")
    if U.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=U.device)
    U = U.double()
    row = torch.linalg.vector_norm(U, dim=1).amax() / math.sqrt(U.shape[1])
    return torch.maximum(row, U.abs().amax() / float(cap))
