"""Seed 004 App. K.9 (Table 39): the shared-MLP model and the homogeneous dense-reuse diagnostic.

The model against an independent float64 transcription of its forward and of its per-use
gradients (eq. 25), the statistics against independent numpy float64 transcriptions of
eq. 28-30 and the pair cosines / norm CV, R_obj <= 1 for the exact polar factor (eq. 29),
the Hybrid-untied partition, the run entry point.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from muonlab.papers.seed004.diagnostics import reuse
from muonlab.errors import UsageError
from muonlab.optim.af_muon import build_optimizer
from muonlab.optim.polar import newton_schulz
from muonlab.families.tied.model import build_tied_model
from muonlab.families.tied.reuse.model import SharedMLPConfig, SharedMLPLM, shared_mlp_expected_num_parameters

TINY = SharedMLPConfig(vocab_size=64, n_layer=4, n_embd=32, ff_hidden=64, sequence_len=16)


def tiny_model(dtype: torch.dtype = torch.float32, seed: int = 0) -> SharedMLPLM:
    torch.manual_seed(seed)
    model = SharedMLPLM(TINY).to(dtype)
    with torch.no_grad():  # gains away from 1, so a misplaced norm shows
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model


def batch(seed: int = 1, B: int = 3, T: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, TINY.vocab_size, (B, T), generator=g),
            torch.randint(0, TINY.vocab_size, (B, T), generator=g))


# ---- independent float64 transcription of the K.9 model (its stored tensors, its equations) ----

def reference_loss(model: SharedMLPLM, idx, targets, up_uses, down_uses):
    """Mean CE of the K.9 model written out by hand: x = E[idx] + P[t]; per depth
    x += W_down (sqrt2 relu(W_up rms_l(x)))^2; logits = W_head rms(x)."""
    p = {k: v.detach().double() for k, v in model.state_dict().items()}
    eps = model.config.norm_eps

    def rms(x, gain):
        return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * gain

    x = p["wte.weight"][idx] + p["wpe.weight"][: idx.shape[1]]
    for depth in range(model.config.n_layer):
        a = rms(x, p[f"norms.{depth}.weight"]) @ up_uses[depth].T
        x = x + (math.sqrt(2.0) * torch.clamp(a, min=0) ** 2) @ down_uses[depth].T
    logits = rms(x, p["norm.weight"]) @ p["lm_head.weight"].T
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -logp.gather(-1, targets[..., None]).mean(), logits


def reference_per_use(model: SharedMLPLM, idx, targets):
    """G_l = d loss / d E_l at E_l = 0 for W + E_l used at depth l only (eq. 25, by perturbation)."""
    L = model.config.n_layer
    W = {n: getattr(model, n).weight.detach().double() for n in ("up", "down")}
    E = {n: [torch.zeros_like(W[n], requires_grad=True) for _ in range(L)] for n in W}
    loss, logits = reference_loss(model, idx, targets, [W["up"] + e for e in E["up"]],
                                  [W["down"] + e for e in E["down"]])
    grads = torch.autograd.grad(loss, E["up"] + E["down"])
    return loss, logits, {"up": grads[:L], "down": grads[L:]}


# ---- independent numpy float64 transcriptions of Table 39's statistics ----

def np_polar(G: np.ndarray) -> np.ndarray:
    U, _, Vh = np.linalg.svd(G, full_matrices=False)
    return U @ Vh * math.sqrt(max(1.0, G.shape[0] / G.shape[1]))


def np_stats(Gs: list[np.ndarray], direction) -> dict:
    G = sum(Gs)
    n = [np.linalg.norm(g) for g in Gs]
    cos = [float(np.sum(Gs[i] * Gs[j]) / (n[i] * n[j])) for i in range(len(Gs)) for j in range(i + 1, len(Gs))]
    D = direction(G)
    V = sum(direction(g) for g in Gs)
    V_tilde = np.linalg.norm(D, 2) / np.linalg.norm(V, 2) * V  # eq. 28, ord=2: largest singular value
    return {"mean_pair_cos": np.mean(cos), "min_pair_cos": min(cos), "negative_pairs": np.mean(np.array(cos) < 0),
            "norm_cv": np.std(n) / np.mean(n),  # np.std: population SD (ddof 0)
            "kappa": np.linalg.norm(G) / sum(n),  # eq. 30
            "direction_cos": np.sum(D * V) / (np.linalg.norm(D) * np.linalg.norm(V)),
            "objective_retained": np.sum(G * V_tilde) / np.sum(G * D)}  # eq. 29


def random_uses(seed: int, shape: tuple[int, int], L: int = 5) -> list[np.ndarray]:
    """Correlated per-use gradients with one anti-aligned use, so some pairs are negative."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=shape)
    Gs = [base * rng.uniform(0.5, 2.0) + rng.normal(size=shape) * rng.uniform(0.3, 1.0) for _ in range(L - 1)]
    return Gs + [-base + 0.5 * rng.normal(size=shape)]


# ---- the model ----

def test_parameter_count_at_the_paper_shape_is_52_6m():
    cfg = SharedMLPConfig()
    with torch.device("meta"):
        model = SharedMLPLM(cfg)
    V, T, d, ff, L = 49152, 256, 512, 2048, 4  # seed 004 App. K.9 (+ our T = 256)
    hand = V * d + T * d + L * d + d * ff + ff * d + d + d * V
    n = model.num_parameters()
    assert n == hand == shared_mlp_expected_num_parameters(cfg) == model.num_scaling_params()["total"]
    assert round(n / 1e6, 1) == 52.6
    tiny = SharedMLPLM(TINY)
    assert tiny.num_parameters() == shared_mlp_expected_num_parameters(TINY)
    assert sum(t.numel() for t in tiny.state_dict().values()) == tiny.num_parameters()


def test_one_up_and_one_down_parameter_serve_every_depth():
    model = tiny_model()
    matrices = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.ndim == 2]
    assert matrices == [("wte.weight", (64, 32)), ("wpe.weight", (16, 32)), ("up.weight", (64, 32)),
                        ("down.weight", (32, 64)), ("lm_head.weight", (64, 32))]
    assert model.get_input_embeddings() is model.wte and model.get_output_embeddings() is model.lm_head
    assert model.lm_head.weight is not model.wte.weight  # untied (K.9)
    _, _, per_use = reference_per_use(model.double(), *batch())
    for name in ("up", "down"):  # every depth sends a gradient to the one Parameter
        assert all(float(g.norm()) > 0 for g in per_use[name])


def test_forward_matches_the_float64_transcription():
    model = tiny_model(torch.float64)
    x, y = batch()
    W = {n: getattr(model, n).weight.detach() for n in ("up", "down")}
    ref_loss, ref_logits = reference_loss(model, x, y, [W["up"]] * 4, [W["down"]] * 4)
    torch.testing.assert_close(model(x), ref_logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model(x, y), ref_loss, rtol=1e-12, atol=0)
    assert model(x, y, reduction="none").shape == y.shape
    with pytest.raises(ValueError, match="sequence_len"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_no_cross_token_mixing():
    model = tiny_model()
    x, _ = batch()
    x2 = x.clone()
    x2[:, 7] = (x2[:, 7] + 1) % TINY.vocab_size
    changed = (model(x) != model(x2)).any(dim=-1).any(dim=0)
    assert changed.tolist() == [t == 7 for t in range(16)]


def test_init_weights():
    model = tiny_model()
    model.init_weights()
    for name, p in model.named_parameters():
        if p.ndim == 1:
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            p = p.detach()
            assert abs(float(p.std()) / TINY.init_std - 1) < 0.2 and abs(float(p.mean())) < 0.01, name


def test_estimate_flops_counts_each_use_of_the_shared_matrices():
    c = TINY
    assert SharedMLPLM(c).estimate_flops() == 6 * (4 * (c.n_embd * c.ff_hidden * 2) + c.vocab_size * c.n_embd)


# ---- split uses ----

@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_split_copies_reproduce_the_shared_forward_and_gradient(dtype, tol):
    model = tiny_model(dtype)
    x, y = batch()
    logits = model(x)
    shared = torch.autograd.grad(model(x, y), [model.up.weight, model.down.weight])
    with model.split_uses() as copies:
        assert all(torch.equal(c, model.up.weight) for c in copies["up"])
        assert torch.equal(model(x), logits)  # same values, same ops
        loss = model(x, y)
        per_use = torch.autograd.grad(loss, copies["up"] + copies["down"], retain_graph=True)
        loss.backward()  # the copies stay in the Parameter's graph
    assert model._copies is None
    for i, name in enumerate(("up", "down")):
        G_l = per_use[4 * i:4 * i + 4]
        assert reuse.split_error(G_l, shared[i]) < tol
        assert reuse.split_error(G_l, getattr(model, name).weight.grad) < tol
    res = reuse.reuse_diagnostics(model, x, y)
    assert res["loss_split"] == res["loss_shared"] and res["logits_max_abs_diff"] == 0 and res["finite"]
    assert res["up"]["split_error"] < tol and res["down"]["split_error"] < tol


def test_per_use_gradients_match_the_perturbation_transcription():
    model = tiny_model(torch.float64)
    x, y = batch()
    ref_loss, _, ref = reference_per_use(model, x, y)
    got = reuse.per_use_gradients(model, x, y)
    assert got["loss_shared"] == pytest.approx(float(ref_loss.detach()), rel=1e-12)
    for name in ("up", "down"):
        for g, r in zip(got["per_use"][name], ref[name], strict=True):
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-14)


def test_split_error_catches_a_broken_decomposition(monkeypatch):
    model = tiny_model()
    x, y = batch()
    split = model.split_uses

    @contextmanager
    def skewed():  # depth 1 sees a slightly different up-projection than the shared forward
        with split() as copies:
            copies["up"][1] = copies["up"][1] * 1.01
            yield copies

    monkeypatch.setattr(model, "split_uses", skewed)
    res = reuse.reuse_diagnostics(model, x, y)
    assert res["up"]["split_error"] > 1e-4 and res["logits_max_abs_diff"] > 0
    assert res["loss_split"] != res["loss_shared"]


# ---- the statistics ----

@pytest.mark.parametrize("shape", [(12, 5), (5, 12), (7, 7)])
def test_statistics_match_the_numpy_transcription(shape):
    Gs = random_uses(sum(shape), shape)
    ref = np_stats(Gs, np_polar)
    # the draw exercises the negative-pair count (not 1/2, so counting positives would show)
    assert 0 < ref["negative_pairs"] < 1 and ref["negative_pairs"] != 0.5
    got = reuse.reuse_statistics([torch.from_numpy(g) for g in Gs], polar="svd")
    assert got["depths"] == 5
    assert got["grad_norms"] == pytest.approx([np.linalg.norm(g) for g in Gs], rel=1e-12)
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-10, abs=1e-12), key
    # the Newton–Schulz default: the same formulas around the map Muon applies
    ns = lambda G: reuse.muon_direction(torch.from_numpy(G), "ns").numpy()  # noqa: E731
    ref_ns = np_stats(Gs, ns)
    got_ns = reuse.reuse_statistics([torch.from_numpy(g) for g in Gs])
    for key in ("direction_cos", "objective_retained"):
        assert got_ns[key] == pytest.approx(ref_ns[key], rel=1e-10), key


def test_muon_direction_is_muons_update_or_the_exact_polar_factor():
    G = torch.from_numpy(np.random.default_rng(3).normal(size=(24, 6)))  # tall: shape factor 2
    assert torch.equal(reuse.muon_direction(G, "ns"), newton_schulz(G.float()).double() * 2.0)
    assert torch.equal(reuse.muon_direction(G, "ns", ns_steps=2), newton_schulz(G.float(), 2).double() * 2.0)
    np.testing.assert_allclose(reuse.muon_direction(G, "svd").numpy(), np_polar(G.numpy()), rtol=0, atol=1e-12)
    np.testing.assert_allclose(reuse.muon_direction(G.T, "svd").numpy(), np_polar(G.T.numpy()), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="polar"):
        reuse.muon_direction(G, "qr")


def test_objective_retention_is_at_most_one_for_the_exact_polar_factor():
    rng = np.random.default_rng(11)
    worst = -math.inf
    for trial in range(40):
        shape = (int(rng.integers(2, 12)), int(rng.integers(2, 12)))
        L = int(rng.integers(2, 7))
        common = rng.normal(size=shape) * rng.uniform(0, 2)
        Gs = [torch.from_numpy(common + rng.normal(size=shape) * rng.uniform(0.1, 2)) for _ in range(L)]
        worst = max(worst, reuse.reuse_statistics(Gs, polar="svd")["objective_retained"])
    assert worst <= 1 + 1e-12  # eq. 29, exact LMO and operator norms
    assert worst > 0.5  # not vacuous


@pytest.mark.parametrize("polar", ["ns", "svd"])
def test_one_use_retains_everything(polar):
    G = torch.from_numpy(np.random.default_rng(5).normal(size=(9, 4)))
    got = reuse.reuse_statistics([G], polar=polar)
    assert got["objective_retained"] == 1.0  # V_raw = D(G), so V~ = D(G)
    assert got["direction_cos"] == pytest.approx(1.0, abs=1e-12)
    assert got["kappa"] == 1.0 and got["norm_cv"] == 0.0
    assert math.isnan(got["mean_pair_cos"]) and math.isnan(got["negative_pairs"])


def test_equal_uses_do_not_cancel():
    G = torch.from_numpy(np.random.default_rng(6).normal(size=(8, 5)))
    got = reuse.reuse_statistics([G.clone() for _ in range(4)], polar="svd")
    assert got["kappa"] == pytest.approx(1.0, abs=1e-12)
    assert got["mean_pair_cos"] == pytest.approx(1.0, abs=1e-12) and got["min_pair_cos"] == pytest.approx(1.0)
    assert got["negative_pairs"] == 0.0 and got["norm_cv"] == 0.0
    assert got["objective_retained"] == pytest.approx(1.0, abs=1e-12)


# ---- optimizer partition and the run entry point ----

def test_hybrid_untied_partition():
    model = tiny_model()
    opt = build_optimizer(model, "hybrid_untied")
    assert opt.roles == {"matrix": ["up.weight", "down.weight"],
                         "tables": ["wte.weight", "wpe.weight", "lm_head.weight"],
                         "vector": [f"norms.{i}.weight" for i in range(4)] + ["norm.weight"]}
    assert {g["part"]: g["role"] for g in opt.param_groups} == {"matrix": "matrix", "tables": "adamw",
                                                                 "vector": "adamw"}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = batch()
    model(x, y).backward()
    opt.step()
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())
    with pytest.raises(ValueError, match="untied"):
        build_optimizer(model, "afmuon")  # AF-Muon needs a tied table; K.9's model has none


@pytest.fixture(scope="module")
def k9_run(tmp_path_factory):
    """The K.9 arm trained from the command line under its CPU preset (a real run directory)."""
    from muonlab.cli import main

    tmp = tmp_path_factory.mktemp("k9")
    assert main(["train", "--preset", "reuse-cpu", "--arm", "k9_reuse_hybrid", "--seed", "43", "--num-steps", "4",
                 "--cache-dir", str(tmp / "cache"), "--runs-dir", str(tmp / "runs"), "--quiet"]) == 0
    (run_dir,) = [p for p in (tmp / "runs").iterdir() if p.is_dir()]
    return run_dir


def test_the_arm_trains_the_papers_optimizer_on_the_shared_model(k9_run):
    from muonlab.diagnostics.runs import load_run

    loaded = load_run(k9_run)
    assert isinstance(loaded.model, SharedMLPLM) and loaded.cfg.family == "reuse"
    groups = {g["part"]: g for g in loaded.optimizer.param_groups}
    # K.9: Muon lr 0.02 and wd 0.1 on the shared matrices, AdamW 3e-4 with wd 0.01 on the rest
    assert (groups["matrix"]["lr"], groups["matrix"]["weight_decay"]) == (0.02, 0.1)
    assert all((groups[p]["lr"], groups[p]["weight_decay"]) == (3e-4, 0.01) for p in ("tables", "vector"))
    assert loaded.runtime.precision == "fp32" and loaded.cfg.runtime.precision == "fp32"  # no autocast


def test_run_reads_the_pending_batch_and_the_runs_ns_steps(k9_run):
    from muonlab.diagnostics.runs import load_run

    res = reuse.run(k9_run)
    loaded = load_run(k9_run)
    x, y = loaded.pending_batch()
    direct = reuse.reuse_diagnostics(loaded.model, x, y, ns_steps=5)
    assert (res["run_dir"], res["arm"], res["step"], res["ns_steps"]) == (str(k9_run), "k9_reuse_hybrid", 4, 5)
    assert res["up"] == direct["up"] and res["down"] == direct["down"]
    assert res["paper_table39"]["up"]["objective_retained"] == 0.7408
    table = reuse.format_table(res)
    assert str(k9_run) in table and "0.7408" in table and f"{res['down']['kappa']:.4f}" in table


def test_diagnose_reuse_from_the_command_line(k9_run, tmp_path, capsys):
    import json

    from muonlab.cli import main

    assert main(["diagnose", "reuse", "--run", str(k9_run), "--polar", "svd", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["polar"] == "svd" and all(res[n]["objective_retained"] <= 1 + 1e-9 for n in ("up", "down"))
    assert all(res[n]["split_error"] < 1e-6 for n in ("up", "down"))  # sum of per-use gradients = shared


def test_run_rejects_a_model_that_is_not_the_shared_mlp(tmp_path, capsys):
    from muonlab.cli import main

    runs = tmp_path / "runs"
    assert main(["train", "--preset", "tied-cpu", "--num-steps", "2", "--cache-dir", str(tmp_path / "cache"),
                 "--runs-dir", str(runs), "--quiet"]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    with pytest.raises(UsageError, match="SharedMLPLM"):
        reuse.run(run_dir)
    assert main(["diagnose", "reuse", "--run", str(run_dir)]) == 2
    assert "SharedMLPLM" in capsys.readouterr().err


def test_the_family_refuses_an_optimizer_that_needs_a_tie(tmp_path, capsys):
    from muonlab.cli import main

    assert main(["train", "--preset", "reuse-cpu", "--optimizer", "afmuon", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "untied" in err and "\n" not in err
