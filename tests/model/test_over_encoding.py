"""Seed 002 hashed n-gram Over-Encoding tables (§2.1 Family A; §3)."""

from collections import Counter

import pytest
import torch

from muonlab.model.variants.over_encoding import OverEncoding


def loop_ids(idx: torch.Tensor, V: int, m: int, n: int, k: int) -> list[list[list[int]]]:
    """Direct transcription of the spec formula with Python ints: per table j, [b][t] -> h_j."""
    x = idx.tolist()
    out = []
    for j in range(k * (n - 1)):
        order = 2 + j // k
        rows = []
        for row in x:
            hs = []
            for t in range(len(row)):
                key = row[t]
                for r in range(1, order):
                    prev = row[t - r] if t - r >= 0 else V  # sentinel only at the row start
                    key += (V + 1) ** r * prev
                hs.append(key % (m + 2 * j))
            rows.append(hs)
        out.append(rows)
    return out


def random_idx(V: int, B: int, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, V, (B, T), generator=g)
    idx[0, :3] = V - 1  # extremes, including at the sequence start
    idx[-1, -3:] = 0
    return idx


@pytest.mark.parametrize("V,m,n,k,T", [(8192, 150_855, 3, 2, 9), (5, 7, 3, 2, 6), (97, 13, 4, 1, 7),
                                       (300, 1000, 2, 3, 5), (8192, 61, 4, 2, 8), (1, 3, 3, 1, 4)])
def test_ids_match_loop_formula(V, m, n, k, T):
    oe = OverEncoding(V, 12 * k * (n - 1), m=m, n=n, k=k)
    idx = random_idx(V, 3, T, seed=V + m + n + k)
    ids = oe.ids(idx)
    assert len(ids) == k * (n - 1)
    for j, (h, ref) in enumerate(zip(ids, loop_ids(idx, V, m, n, k))):
        assert h.dtype == torch.int64 and h.shape == idx.shape
        assert h.tolist() == ref
        assert 0 <= int(h.min()) and int(h.max()) < m + 2 * j
        assert oe.order(j) == 2 + j // k


def test_ids_int64_exact_beyond_int32():
    V, n = 50_000, 3
    huge = 10**15  # larger than every key, so h_j is the raw mixed-radix key
    with torch.device("meta"):  # ids need no table storage
        oe = OverEncoding(V, 8, m=huge, n=n, k=2)
    idx = random_idx(V, 2, 6, seed=1)
    ids = oe.ids(idx.to(torch.int32))
    assert max(int(h.max()) for h in ids) > 2**31
    for h, ref in zip(ids, loop_ids(idx, V, huge, n, 2)):
        assert h.dtype == torch.int64 and h.tolist() == ref
    # spec's maximum id^(3) at V = 8192 is ~5.5e11: all three tokens V-1 (no sentinel at t = 2)
    with torch.device("meta"):
        oe = OverEncoding(8192, 8, m=huge)
    top = oe.ids(torch.full((1, 3), 8191))[-1][0, -1].item()
    assert top == 8191 + 8193 * 8191 + 8193**2 * 8191 and 5.4e11 < top < 5.6e11


def test_padded_sequence_built_once(monkeypatch):
    import torch.nn.functional as F
    calls = []
    real_pad = F.pad
    monkeypatch.setattr(F, "pad", lambda *a, **kw: calls.append(1) or real_pad(*a, **kw))
    OverEncoding(50, 24, m=11, n=4, k=2).ids(random_idx(50, 2, 5, seed=0))
    assert len(calls) == 1


def test_forward_zero_at_init_then_manual_lookup():
    V, d, B, T = 40, 24, 2, 7
    state = torch.get_rng_state()
    oe = OverEncoding(V, d, m=17, n=3, k=2)
    assert torch.equal(torch.get_rng_state(), state)  # zero init consumes no RNG
    idx = random_idx(V, B, T, seed=3)
    out = oe(idx)
    assert out.shape == (B, T, d) and out.dtype == torch.bfloat16
    assert torch.equal(out, torch.zeros_like(out))
    assert [tuple(t.weight.shape) for t in oe.tables] == [(17 + 2 * j, 6) for j in range(4)]
    with torch.no_grad():
        for t in oe.tables:
            t.weight.copy_(torch.randn_like(t.weight, dtype=torch.float32))
    out = oe(idx)
    manual = torch.cat([oe.tables[j].weight[h] for j, h in enumerate(loop_ids_tensors(idx, V, 17))], -1)
    assert torch.equal(out, manual)
    assert not torch.equal(out, torch.zeros_like(out))


def loop_ids_tensors(idx, V, m, n=3, k=2):
    return [torch.tensor(h) for h in loop_ids(idx, V, m, n, k)]


def test_meta_build_then_reset():
    with torch.device("meta"):
        oe = OverEncoding(30, 8, m=5)
    oe.to_empty(device="cpu")
    oe.reset_parameters()
    assert all(torch.equal(t.weight, torch.zeros_like(t.weight)) for t in oe.tables)
    assert all(c.sum().item() == 0 for c in oe.counts())
    assert oe(random_idx(30, 1, 4, seed=0)).abs().sum().item() == 0


def test_counts_match_counter_accumulate_and_reset():
    V, m = 23, 9
    oe = OverEncoding(V, 8, m=m)
    micro = [random_idx(V, 3, 11, seed=s) for s in range(4)]  # four accumulation micro-steps
    expected = [Counter() for _ in range(4)]
    for step, idx in enumerate(micro):
        with torch.enable_grad():
            got = oe.count_(idx)
        for j, hs in enumerate(loop_ids(idx, V, m, 3, 2)):
            expected[j].update(h for row in hs for h in row)
        for j, c in enumerate(got):
            assert c is getattr(oe, f"counts_{j}") and not c.requires_grad
            assert c.dtype == torch.float32 and c.shape == (m + 2 * j,)
            assert c.tolist() == [float(expected[j][r]) for r in range(m + 2 * j)]
            assert c.sum().item() == (step + 1) * 33
    fresh = oe.count(micro[0])  # functional form leaves the buffers alone
    assert fresh[0].sum().item() == 33 and oe.counts_0.sum().item() == 4 * 33
    oe.reset_counts_()
    assert all(c.sum().item() == 0 for c in oe.counts())


def test_count_refuses_eval_and_cast_buffers():
    oe = OverEncoding(10, 8, m=5)
    oe.eval()
    with pytest.raises(RuntimeError, match="eval"):
        oe.count_(random_idx(10, 1, 4, seed=0))
    oe.train().bfloat16()
    with pytest.raises(TypeError, match="fp32"):
        oe.count_(random_idx(10, 1, 4, seed=0))


# FLOPs are counted from the model by papers/seed002/diagnostics/accounting.py (tests/papers/test_diagnostics_accounting.py)
@pytest.mark.parametrize("depth,d,params,mib", [(6, 384, 57_929_472, 223.29), (8, 512, 77_239_296, 296.95)])
def test_parameters_and_memory_match_spec(depth, d, params, mib):
    with torch.device("meta"):
        oe = OverEncoding(8192, d)
    assert oe.rows == [150_855, 150_857, 150_859, 150_861] and sum(oe.rows) == 603_432
    assert oe.width == d // 4
    assert oe.num_parameters() == params == sum(p.numel() for p in oe.parameters())
    assert all(p.dtype == torch.bfloat16 for p in oe.parameters())
    assert round(oe.memory_bytes() / 2**20, 2) == mib
    assert round(4 * sum(oe.rows) / 2**20, 2) == 2.30  # the fp32 count vector
    names = {name for name, _ in oe.named_buffers()}
    assert names == {f"counts_{j}" for j in range(4)}
    assert set(oe.state_dict()) == {f"tables.{j}.weight" for j in range(4)}


def test_gradient_dense_bf16_on_visited_rows_only():
    V, m, d = 50, 37, 16
    oe = OverEncoding(V, d, m=m)
    with torch.no_grad():
        for t in oe.tables:
            t.weight.normal_()
    idx = random_idx(V, 2, 13, seed=5)
    up = torch.randn(2, 13, d)
    (oe(idx).float() * up).sum().backward()
    counts = oe.count(idx)
    for j, (t, c, h) in enumerate(zip(oe.tables, counts, oe.ids(idx))):
        g = t.weight.grad
        assert g is not None and not g.is_sparse and g.dtype == torch.bfloat16
        assert g.shape == (m + 2 * j, d // 4)
        assert torch.equal(g.abs().sum(1) > 0, c > 0)
        cols = up[..., 4 * j:4 * j + 4].reshape(-1, 4)
        ref = torch.zeros(m + 2 * j, d // 4).index_add_(0, h.reshape(-1), cols)
        torch.testing.assert_close(g.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kwargs,match", [(dict(m=0), "m must be"), (dict(n=1), "order n"),
                                          (dict(k=0), "k must be"), (dict(n_embd=10), "multiple"),
                                          (dict(vocab_size=0), "vocab_size"),
                                          (dict(vocab_size=2**21), "overflows")])
def test_constructor_rejects(kwargs, match):
    args = dict(vocab_size=100, n_embd=8, m=5, n=3, k=2) | kwargs
    with pytest.raises(ValueError, match=match):
        OverEncoding(**args)
