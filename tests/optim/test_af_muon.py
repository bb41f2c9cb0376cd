"""AF-Muon (seed 004, §2, §3.1): partition, the three branches against direct transcriptions,
presets, state round trip, state memory and the gradient-source tool."""

import copy
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

from muonlab.optim.af_muon import (PRESETS, AFMuon, GradientSources, build_optimizer, gradient_sources,
                                   partition_by_role, state_bytes, tied_lr)
from muonlab.optim.polar import newton_schulz
from muonlab.optim.lmo import clipped_row_lmo

V, D, H = 37, 16, 24


class PlainLM(nn.Module):
    """Tied toy LM: embedding, two Linears (one biased), RMSNorm gain, head sharing the table."""

    def __init__(self, vocab: int = V, d: int = D, hidden: int = H):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d, bias=False)
        self.norm = nn.RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids, src=None):
        x = self.embed(ids)
        if src is not None:  # a second lookup through the same table (T5-style 3-way tie)
            x = x + self.embed(src).mean(dim=1, keepdim=True)
        x = x + self.fc2(torch.relu(self.fc1(x)))
        return self.lm_head(self.norm(x))


class TinyLM(PlainLM):
    """Hugging Face style accessors."""

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.lm_head


def model(seed=0, cls=TinyLM):
    torch.manual_seed(seed)
    return cls()


def batch(seed=0, n=4, t=6, high=V):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (n, t + 1), generator=g)


def lm_loss(m, ids):
    logits = m(ids[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def fixed_grads(m, seed):
    g = torch.Generator().manual_seed(seed)
    for p in m.parameters():
        p.grad = torch.randn(p.shape, generator=g)


# ---------------------------------------------------------------- partition


def test_partition_roles_and_tied_dedup():
    m = model()
    parts = partition_by_role(m)
    names = {k: [n for n, _ in v] for k, v in parts.items()}
    assert names == {"tied": ["embed.weight"], "matrix": ["fc1.weight", "fc2.weight"],
                     "vector": ["fc1.bias", "norm.weight"]}
    assert parts["tied"][0][1] is m.lm_head.weight  # the head's weight is the table, listed once
    assert sum(len(v) for v in parts.values()) == len(list(m.parameters()))


def test_partition_without_hf_accessors_uses_tied_argument():
    m = model(cls=PlainLM)
    with pytest.raises(ValueError, match="no tied table"):
        partition_by_role(m)
    assert [n for n, _ in partition_by_role(m, tied="embed.weight")["tied"]] == ["embed.weight"]
    assert partition_by_role(m, tied=m.embed.weight)["tied"][0][1] is m.embed.weight
    m.tied_embedding = lambda: m.embed.weight
    assert partition_by_role(m)["tied"][0][1] is m.embed.weight


def test_partition_errors_name_the_tensor():
    m = model()
    m.wpe = nn.Embedding(8, D)
    with pytest.raises(ValueError, match=r"wpe\.weight: a second embedding table has no AF-Muon role"):
        partition_by_role(m)
    m = model()
    m.lm_head.weight = nn.Parameter(m.embed.weight.detach().clone())
    with pytest.raises(ValueError, match=r"lm_head\.weight: untied output head"):
        partition_by_role(m)
    m = model(cls=PlainLM)
    m.lm_head.weight = nn.Parameter(m.embed.weight.detach().clone())
    with pytest.raises(ValueError, match=r"lm_head\.weight: an untied output head"):
        partition_by_role(m, tied="embed.weight")
    m = model()
    m.extra = nn.Parameter(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"extra: unrecognised 2-D tensor"):
        partition_by_role(m)
    assert "extra" in [n for n, _ in partition_by_role(m, matrices="all")["matrix"]]


# ---------------------------------------------------------------- Newton–Schulz


def ns_transcription(G, steps=5):
    """The released code's Newton–Schulz written out (cf. seed 004 §2.2): bf16, transpose if rows > cols, Frobenius + 1e-7, quintic."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.to(torch.bfloat16)
    t = X.shape[0] > X.shape[1]
    X = X.T if t else X
    X = X / (torch.linalg.matrix_norm(X) + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.T if t else X


@pytest.mark.parametrize("shape", [(24, 16), (16, 40), (32, 32)])
def test_newton_schulz_matches_transcription_and_is_nearly_orthogonal(shape):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    O = newton_schulz(G)
    assert O.dtype == torch.bfloat16 and O.shape == G.shape
    torch.testing.assert_close(O.float(), ns_transcription(G).float(), atol=1e-3, rtol=0)
    # the quintic does not converge to 1: singular values land in a band around 1 (0.6 .. 1.25 stated)
    s = torch.linalg.svdvals(O.double())
    assert s.min() > 0.6 and s.max() < 1.25, s
    # same orientation either way (bf16 matmuls on transposed layouts round differently: loose)
    torch.testing.assert_close(newton_schulz(G.T).float(), O.T.float(), atol=5e-2, rtol=0)


def test_newton_schulz_eps_on_tiny_and_zero_inputs():
    assert torch.equal(newton_schulz(torch.zeros(4, 6)), torch.zeros(4, 6, dtype=torch.bfloat16))
    G = 1e-7 * torch.randn(12, 20, generator=torch.Generator().manual_seed(4))  # ||G|| ~ eps: eps matters
    torch.testing.assert_close(newton_schulz(G).float(), ns_transcription(G).float(), atol=1e-3, rtol=0)


def test_newton_schulz_flattens_4d_and_batches_3d():
    G = torch.randn(8, 3, 2, 2, generator=torch.Generator().manual_seed(2))
    assert torch.equal(newton_schulz(G), newton_schulz(G.reshape(8, 12)).reshape(G.shape))
    S = torch.randn(3, 6, 10, generator=torch.Generator().manual_seed(3))
    for i in range(3):
        torch.testing.assert_close(newton_schulz(S)[i].float(), newton_schulz(S[i]).float(), atol=1e-2, rtol=0)


# ---------------------------------------------------------------- the three branches


def test_each_branch_matches_a_direct_transcription():
    m, lr, lr_v, wd, mu, c, s, rho = model(), 0.02, 3e-4, 0.1, 0.95, 3.0, 0.5, 60.0
    opt = build_optimizer(m, "afmuon")
    W = {n: p.detach().clone() for n, p in m.named_parameters()}
    buf = {n: torch.zeros_like(p) for n, p in W.items()}
    for k in range(3):
        fixed_grads(m, seed=10 + k)
        G = {n: p.grad.clone() for n, p in m.named_parameters()}
        opt.step()
        for n in ("fc1.weight", "fc2.weight"):  # Nesterov EMA, NS, shape factor, decoupled decay
            buf[n] = mu * buf[n] + (1 - mu) * G[n]
            O = newton_schulz((1 - mu) * G[n] + mu * buf[n]).float() * math.sqrt(max(1, W[n].shape[0] / W[n].shape[1]))
            W[n] = W[n] * (1 - lr * wd) - lr * O
        buf["embed.weight"] = mu * buf["embed.weight"] + G["embed.weight"]
        W["embed.weight"] = W["embed.weight"] - lr * rho * s / D * clipped_row_lmo(buf["embed.weight"], c)
        for n in ("fc1.bias", "norm.weight"):
            buf[n] = mu * buf[n] + G[n]
            rms = buf[n].pow(2).mean().sqrt()
            W[n] = W[n] - lr_v * buf[n] / max(rms.item(), 1e-8)
        for n, p in m.named_parameters():
            torch.testing.assert_close(p.detach(), W[n], atol=2e-6, rtol=1e-6, msg=f"{n} step {k}")
            torch.testing.assert_close(opt.state[p]["momentum_buffer"], buf[n], atol=1e-6, rtol=1e-6)
    assert m.lm_head.weight is m.embed.weight


def test_tied_lr_formula():
    g = {"rho": 60.0, "scale": 0.5, "d": None}
    assert tied_lr(0.02, g, torch.empty(4, 768)) == pytest.approx(7.8125e-4)
    assert tied_lr(0.02, {**g, "scale": 1.0}, torch.empty(4, 768)) == pytest.approx(1.5625e-3)
    assert tied_lr(0.02, g, torch.empty(4, 2048)) == pytest.approx(2.9297e-4, rel=1e-4)
    assert tied_lr(0.02, {**g, "rho": 1.0, "d": 512}, torch.empty(4, 7)) == pytest.approx(1.953e-5, rel=1e-3)


def test_sign_preset_is_the_exact_sign_update():
    m = model()
    opt = build_optimizer(m, "sign")
    tied = next(g for g in opt.param_groups if g["role"] == "tied")
    assert (tied["cap"], tied["scale"]) == (1.0, 1.0)
    E0 = m.embed.weight.detach().clone()
    fixed_grads(m, seed=4)
    m.embed.weight.grad[3] = 0.0  # a zero row gets no update
    G = m.embed.weight.grad.clone()
    opt.step()
    assert torch.equal(m.embed.weight.detach(), E0 - 0.02 * 60 * 1.0 / D * torch.sign(G))
    with pytest.raises(ValueError, match="cap"):
        build_optimizer(model(), "sign", cap=3.0)


def test_vector_rms_of_a_scalar_and_eps_floor():
    p, q = nn.Parameter(torch.tensor(2.0)), nn.Parameter(torch.zeros(4))
    opt = AFMuon([{"params": [p, q], "role": "vector", "lr": 0.1}])
    p.grad, q.grad = torch.tensor(-5.0), torch.full((4,), 1e-12)
    opt.step()
    assert p.item() == pytest.approx(2.1)  # a scalar is RMS-normalised to +-1
    torch.testing.assert_close(q.detach(), torch.full((4,), -0.1 * 1e-12 / 1e-8))


def test_decoupled_weight_decay_only_on_matrices():
    m = model()
    opt = build_optimizer(m, "afmuon")
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in m.named_parameters():
        expect = before[n] * (1 - 0.02 * 0.1) if n in ("fc1.weight", "fc2.weight") else before[n]
        assert torch.equal(p.detach(), expect), n
    for role in ("tied", "vector"):
        with pytest.raises(ValueError, match="decays matrices only"):
            AFMuon([{"params": [m.fc1.bias] if role == "vector" else [m.embed.weight], "role": role,
                     "weight_decay": 0.1}])


def test_grad_none_is_skipped_and_roles_are_checked():
    m = model()
    opt = build_optimizer(m, "afmuon")
    fixed_grads(m, seed=5)
    m.fc1.weight.grad = None
    m.norm.weight.grad = None
    w, g = m.fc1.weight.detach().clone(), m.norm.weight.detach().clone()
    opt.step()
    assert torch.equal(m.fc1.weight.detach(), w) and torch.equal(m.norm.weight.detach(), g)
    assert m.fc1.weight not in opt.state and m.norm.weight not in opt.state
    assert len(opt.state) == 3
    with pytest.raises(ValueError, match="unknown role"):
        AFMuon([{"params": [m.fc1.weight], "role": "sign"}])
    with pytest.raises(ValueError, match="vector group got a 2-D"):
        AFMuon([{"params": [m.fc1.weight], "role": "vector"}])


# ---------------------------------------------------------------- presets and state


@pytest.mark.parametrize("preset", ["afmuon", "hybrid"])
def test_state_dict_round_trip_continues_bitwise(preset):
    m = model()
    opt = build_optimizer(m, preset)
    for k in range(3):
        opt.zero_grad()
        lm_loss(m, batch(k)).backward()
        opt.step()
    m2 = copy.deepcopy(m)
    opt2 = build_optimizer(m2, preset)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    for k in range(3, 5):
        for mm, oo in ((m, opt), (m2, opt2)):
            oo.zero_grad()
            lm_loss(mm, batch(k)).backward()
            oo.step()
    for (n, p), p2 in zip(m.named_parameters(), m2.parameters()):
        assert torch.equal(p, p2), n


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_builds_and_trains(preset):
    m = model()
    opt = build_optimizer(m, preset)
    losses = []
    for k in range(4):
        opt.zero_grad()
        loss = lm_loss(m, batch(0))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert m.lm_head.weight is m.embed.weight
    if preset == "adamw":
        assert isinstance(opt, torch.optim.AdamW)
        assert (opt.defaults["lr"], opt.defaults["weight_decay"], opt.defaults["eps"]) == (6e-4, 0.1, 1e-8)
        return
    roles = {g["part"]: g["role"] for g in opt.param_groups}
    if preset == "hybrid_untied":  # Table 15's control: every vocabulary table (here the tied one) on AdamW
        assert roles == {"matrix": "matrix", "tables": "adamw", "vector": "adamw"}
        return
    rule_t, rule_v = {"afmuon": ("lmo", "rms"), "sign": ("lmo", "rms"), "hybrid": ("adamw", "adamw")}.get(
        preset, tuple(preset.split("_")[1:]))
    assert roles == {"matrix": "matrix", "tied": "tied" if rule_t == "lmo" else "adamw",
                     "vector": "vector" if rule_v == "rms" else "adamw"}
    aux_wd = 0.01 if preset == "hybrid" else 0.0
    for g in opt.param_groups:
        assert g["weight_decay"] == (0.1 if g["role"] == "matrix" else aux_wd if g["role"] == "adamw" else 0.0)


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match="afmuon.*hybrid.*sign.*factorial_lmo_rms.*factorial_adamw_adamw.*adamw"):
        build_optimizer(model(), "scion")
    with pytest.raises(TypeError, match="unknown build_optimizer overrides"):
        build_optimizer(model(), "afmuon", tied_cap=2.0)


def test_hybrid_adamw_groups_match_torch_adamw():
    m, ref = model(), model()
    opt = build_optimizer(m, "hybrid")
    aux = [ref.embed.weight, ref.fc1.bias, ref.norm.weight]
    torch_opt = torch.optim.AdamW(aux, lr=3e-4, betas=(0.9, 0.95), eps=1e-10, weight_decay=0.01, foreach=False)
    for k in range(3):
        fixed_grads(m, 20 + k)
        fixed_grads(ref, 20 + k)
        opt.step()
        torch_opt.step()
    for n in ("embed.weight", "fc1.bias", "norm.weight"):
        torch.testing.assert_close(m.get_parameter(n), ref.get_parameter(n), atol=1e-7, rtol=0)
    assert set(opt.state[m.embed.weight]) == {"step", "exp_avg", "exp_avg_sq"}


class NanoGPTShapes(nn.Module):
    """The NanoGPT-124M parameter set of seed 004 App. J.1 (V 50304, d 768, 12 layers, separate q/k/v/o)."""

    def __init__(self, vocab=50304, d=768, layers=12, ff=3072):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            blk = nn.ModuleDict({k: nn.Linear(d, d, bias=False) for k in ("q", "k", "v", "o")})
            blk.update(dict(up=nn.Linear(d, ff, bias=False), down=nn.Linear(ff, d, bias=False),
                            n1=nn.RMSNorm(d), n2=nn.RMSNorm(d)))
            self.blocks.append(blk)
        self.norm = nn.RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.lm_head


def test_state_bytes_afmuon_vs_hybrid():
    # small model: the real state after one step equals what init_state() builds, and the counts
    n_all = sum(p.numel() for p in model().parameters())
    n_aux = V * D + H + D
    for preset, expect in (("afmuon", 4 * n_all), ("hybrid", 4 * (n_all + n_aux))):
        m, m0 = model(), model()
        opt, opt0 = build_optimizer(m, preset), build_optimizer(m0, preset)
        lm_loss(m, batch(0)).backward()
        opt.step()
        opt0.init_state()
        assert state_bytes(opt) == state_bytes(opt0) == expect
        for p, p0 in zip(m.parameters(), m0.parameters()):
            a, b = opt.state[p], opt0.state[p0]
            assert set(a) == set(b) and all(
                a[k].shape == b[k].shape and a[k].dtype == b[k].dtype == torch.float32
                for k in a if torch.is_tensor(a[k]))
    # NanoGPT-124M shapes on the meta device
    with torch.device("meta"):
        big = NanoGPTShapes()
    assert sum(p.numel() for p in big.parameters()) == 123_587_328
    sizes = {}
    for preset in ("afmuon", "hybrid"):
        opt = build_optimizer(big, preset)
        opt.init_state()
        sizes[preset] = state_bytes(opt)
    ratio = sizes["afmuon"] / sizes["hybrid"]
    assert sizes["afmuon"] == 4 * 123_587_328
    assert sizes["hybrid"] == 4 * (123_587_328 + 50304 * 768 + 25 * 768)
    assert ratio <= 0.8  # the paper's ~20% saving (here 0.7618, i.e. 23.8% saved)
    assert ratio == pytest.approx(0.7618, abs=1e-4)


# ---------------------------------------------------------------- gradient sources (K.8)


def test_gradient_sources_match_untied_copies():
    m = model()
    ids = batch(7, high=20)  # the inputs use only rows 0..19 of 37
    out = gradient_sources(m, lambda mm: lm_loss(mm, ids))
    E = m.embed.weight.detach()
    E_in, E_out = E.clone().requires_grad_(), E.clone().requires_grad_()
    logits = functional_call(m, {"embed.weight": E_in, "lm_head.weight": E_out}, (ids[:, :-1],), tie_weights=False)
    loss = nn.functional.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
    g_in, g_out = torch.autograd.grad(loss, (E_in, E_out))
    torch.testing.assert_close(out["lookup"], g_in, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(out["softmax"], g_out, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(out["both"], g_in + g_out, atol=1e-7, rtol=1e-5)
    used = torch.zeros(V, dtype=torch.bool)
    used[ids[:, :-1].reshape(-1)] = True
    assert out["lookup_rows"] == pytest.approx(used.float().mean().item())
    assert not out["lookup"][~used].any()
    assert out["softmax_rows"] == 1.0
    torch.testing.assert_close(out["softmax"].sum(0), torch.zeros(D), atol=1e-6, rtol=0)  # 1^T G_out = 0
    cos = (g_in * g_out).sum() / (g_in.norm() * g_out.norm())
    assert out["cosine"] == pytest.approx(cos.item(), abs=1e-5)


def test_gradient_sources_accumulate_two_lookups():
    m = model()
    ids, src = batch(8), batch(9, t=3)
    out = gradient_sources(m, lambda mm: nn.functional.cross_entropy(
        mm(ids[:, :-1], src).reshape(-1, V), ids[:, 1:].reshape(-1)))
    E = m.embed.weight.detach()
    E_in, E_out = E.clone().requires_grad_(), E.clone().requires_grad_()
    logits = functional_call(m, {"embed.weight": E_in, "lm_head.weight": E_out}, (ids[:, :-1], src),
                             tie_weights=False)
    g_in = torch.autograd.grad(nn.functional.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1)), E_in)[0]
    torch.testing.assert_close(out["lookup"], g_in, atol=1e-7, rtol=1e-5)


def test_gradient_source_intervention_accumulates_micro_batches_and_replaces_the_gradient():
    m = model()
    per_batch = [gradient_sources(m, lambda mm, k=k: lm_loss(mm, batch(k, high=20)))["lookup"] for k in (1, 2)]
    m.zero_grad(set_to_none=True)
    with GradientSources(m) as cap:
        for k in (1, 2):
            lm_loss(m, batch(k, high=20)).backward()
        src = cap.sources()
        torch.testing.assert_close(src["lookup"], per_batch[0] + per_batch[1], atol=1e-7, rtol=1e-5)
        cap.apply("softmax")
        assert torch.equal(m.embed.weight.grad, src["softmax"])
        with pytest.raises(ValueError, match="source must be one of"):
            cap.apply("input")
    lm_loss(m, batch(3)).backward()  # hooks are gone after the context
    assert torch.equal(cap.lookup, src["lookup"])
