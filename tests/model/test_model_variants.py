"""Forward/backward variants of seeds 000 and 003 in the GPT: neutral at init, counts, groups, equivalences."""

import dataclasses

import pytest
import torch

from muonlab.config import preset
from muonlab.errors import UsageError
from muonlab.model import GPT
from muonlab.model.variants import qk_scale
from muonlab.train.build import model_config
from support.models import live_baseline as _live_baseline, small

VARIANT_PARAMS = ("presub_gains", "qk_scales", "rope_tau", "radius_gates")
DEFAULT_LR_MULT = 0.04  # seed 000's "0.04" = 0.04 x scalar_lr


def _variant_like(base: GPT, **variant) -> GPT:
    """The same weights as `base`, with the variant's parameters at their neutral init."""
    model = GPT(small(**variant))
    model.init_weights()
    model.float()
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and set(missing) <= set(VARIANT_PARAMS)
    return model


def _loss_and_grads(model, idx):
    model.zero_grad(set_to_none=True)
    loss = model(idx, idx.roll(-1, 1))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


IDX = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
NEUTRAL_EXACT = [
    *[dict(presub_gains=impl, presub_param=param) for impl in ("unfused_slice", "unfused_contig", "gate_scaled")
      for param in ("linear", "stopexp")],
    *[dict(qk_scale=kind) for kind in qk_scale.QK_SCALES[1:]],
    dict(qk_scale="pair_tied_exp", qk_freeze_layers="0", qk_freeze_planes=4),
    dict(rope="lerope_adapted"),
    *[dict(residual_rule=rule) for rule in ("branch_tangent", "whole_state_tangent", "grad_mag_control")],
    *[dict(radius_gate=kind) for kind in ("state", "branch", "neutral")],
    dict(checkpoint_blocks=True),
]


@pytest.mark.parametrize("variant", NEUTRAL_EXACT, ids=lambda v: "-".join(map(str, v.values())))
def test_neutral_init_reproduces_the_baseline_forward_bitwise(variant):
    base = _live_baseline()
    model = _variant_like(base, **variant)
    assert torch.equal(model(IDX), base(IDX))


def test_weight_fused_and_lerope_shared_match_to_fp32_rounding():
    """Weight fusion reorders the products (W*a)x vs W(a*x); shared LeRoPE uses fp32 trig while
    the baseline tables are bf16-rounded (~4e-3 relative), so these are close, not bitwise."""
    base = _live_baseline()
    fused = _variant_like(base, presub_gains="weight_fused")
    torch.testing.assert_close(fused(IDX), base(IDX), rtol=1e-5, atol=1e-5)
    shared = _variant_like(base, rope="lerope_shared")
    torch.testing.assert_close(shared(IDX), base(IDX), rtol=0.05, atol=0.05)
    assert not torch.equal(shared(IDX), base(IDX))  # the fp32 trigonometry is really used


def test_fused_equals_unfused_with_trained_gains():
    """Seed 000 §1 item 1.3: weight-fused == exact unfused in outputs and gradients (the paper: 1.36e-7 / 4.14e-7)."""
    base = _live_baseline()
    models = {impl: _variant_like(base, presub_gains=impl) for impl in ("unfused_slice", "unfused_contig",
                                                                         "weight_fused", "gate_scaled")}
    gains = 1 + 0.3 * torch.randn(4, 2, 64, generator=torch.Generator().manual_seed(2))
    for m in models.values():
        with torch.no_grad():
            m.presub_gains.copy_(gains)
    ref_loss, ref_grads = _loss_and_grads(models["unfused_slice"], IDX)
    for impl in ("unfused_contig", "weight_fused"):
        loss, grads = _loss_and_grads(models[impl], IDX)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
        for name, g in ref_grads.items():
            rel = (grads[name] - g).norm() / g.norm().clamp_min(1e-30)
            assert rel < 1e-5, (impl, name, rel.item())
    # the gate-scaled control is NOT equivalent: its value-embedding gate sees the scaled input
    with torch.no_grad():
        assert (models["gate_scaled"](IDX) - models["unfused_slice"](IDX)).abs().max() > 1e-5


def _sublayer_inputs(model, layer: int) -> dict[str, torch.Tensor]:
    """The inputs W_Q, W_K, W_V, the value-embedding gate and W_fc of one block receive on IDX."""
    block, seen, handles = model.transformer.h[layer], {}, []
    for name, module in (("q", block.attn.c_q), ("k", block.attn.c_k), ("v", block.attn.c_v),
                         ("gate", block.attn.ve_gate), ("fc", block.mlp.c_fc)):
        def keep(module, args, out, name=name):  # returns None: the output is left alone
            seen.setdefault(name, args[0].detach().clone())
        handles.append(module.register_forward_hook(keep))
    model(IDX)
    for handle in handles:
        handle.remove()
    return seen


@pytest.mark.parametrize("impl", ["unfused_slice", "unfused_contig", "gate_scaled"])
def test_gains_reach_only_their_inputs(impl):
    """Seed 000 §3.1: a_attn scales the inputs of W_Q, W_K, W_V; the ResFormer gate reads the
    UNSCALED norm output (the gate_scaled control reads the scaled one); a_mlp scales W_fc's input
    and nothing of the attention before it. Gains are random, so a missing or misplaced gain shows."""
    base = _live_baseline()
    model = _variant_like(base, presub_gains=impl)
    layer = next(i for i, b in enumerate(model.transformer.h) if b.attn.ve_gate is not None)
    with torch.no_grad():
        model.presub_gains.copy_(0.5 + torch.rand(model.presub_gains.shape, generator=torch.Generator().manual_seed(3)))
    seen = _sublayer_inputs(model, layer)
    a_attn = model.presub_gains[layer, 0].detach()
    assert torch.equal(seen["q"], seen["k"]) and torch.equal(seen["q"], seen["v"])
    x_hat = seen["q"] / a_attn  # the norm output the gains scaled
    rms = x_hat.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-4, atol=0)  # it is a norm output
    c = model.transformer.h[layer].attn.ve_gate_channels
    expected_gate = seen["q"][..., :c] if impl == "gate_scaled" else x_hat[..., :c]
    torch.testing.assert_close(seen["gate"], expected_gate, rtol=1e-5, atol=1e-6)
    assert (seen["gate"] - (x_hat if impl == "gate_scaled" else seen["q"])[..., :c]).abs().max() > 1e-2
    # doubling this layer's MLP gain doubles W_fc's input and leaves the attention inputs alone
    with torch.no_grad():
        model.presub_gains[layer, 1] *= 2
    doubled = _sublayer_inputs(model, layer)
    torch.testing.assert_close(doubled["fc"], 2 * seen["fc"], rtol=1e-6, atol=1e-6)
    assert all(torch.equal(doubled[k], seen[k]) for k in ("q", "k", "v", "gate"))


def test_stop_exp_value_and_unit_jacobian():
    tau = torch.tensor([-1.0, 0.0, 0.7], requires_grad=True)
    m = qk_scale.stop_exp(tau)
    assert torch.equal(m.detach(), tau.detach().exp())
    m.sum().backward()
    assert torch.equal(tau.grad, torch.ones(3))


@pytest.mark.parametrize("variant,total", [
    (dict(presub_gains="weight_fused", qk_scale="pair_tied_stopexp"), 50_342_416),  # exp17
    (dict(presub_gains="weight_fused", qk_scale="untied_stopexp"), 50_344_464),  # exp41
    (dict(presub_gains="weight_fused", rope="lerope_shared"), 50_340_432),  # exp31
    (dict(presub_gains="weight_fused", rope="lerope_adapted"), 50_342_416),  # exp21
    (dict(presub_gains="weight_fused", qk_scale="head_temp"), 50_340_400),  # exp19
    (dict(presub_gains="weight_fused"), 50_340_368),  # exp07
    (dict(qk_scale="pair_tied_stopexp"), 50_334_224),  # exp64
    (dict(radius_gate="state"), 50_332_208),  # seed 003 gates
])
def test_parameter_counts_match_the_spec(variant, total):
    cfg = preset("gpu-d8")
    with torch.device("meta"):
        model = GPT(dataclasses.replace(model_config(cfg, vocab_size=8192), variants=small(**variant).variants))
    counts = model.num_scaling_params()
    assert counts["total"] == total == sum(p.numel() for p in model.parameters())


def test_qmask_freezes_the_spec_entries():
    """Seed 002 QMASK: layer 0 and planes 0-15 of layers 1.. stay at 1: 704 of 2,048 at depth 8."""
    shape = qk_scale.qk_param_shape("pair_tied_exp", 8, 4, 128)
    mask = qk_scale.qk_freeze_mask("pair_tied_exp", shape, (0,), 16)
    assert int((mask == 0).sum()) == 704 and mask.numel() == 2048
    shape6 = qk_scale.qk_param_shape("pair_tied_exp", 6, 3, 128)
    assert int((qk_scale.qk_freeze_mask("pair_tied_exp", shape6, (0,), 16) == 0).sum()) == 432
    model = _variant_like(_live_baseline(), qk_scale="pair_tied_exp", qk_freeze_layers="0", qk_freeze_planes=4)
    _, grads = _loss_and_grads(model, IDX)
    g = grads["qk_scales"]
    assert torch.all(g[0] == 0) and torch.all(g[:, :, :4] == 0) and torch.any(g[1:, :, 4:] != 0)


def test_variant_parameters_get_their_own_adamw_groups():
    model = _variant_like(_live_baseline(), presub_gains="weight_fused", qk_scale="pair_tied_stopexp",
                          rope="lerope_adapted", radius_gate="neutral", qk_lr_mult=0.10)
    opt = model.setup_optimizer(scalar_lr=0.5)
    by_param = {id(p): g for g in opt.param_groups for p in g["params"]}
    variant_params = {name: getattr(model, name) for name in VARIANT_PARAMS}
    for name, p in variant_params.items():
        group = by_param[id(p)]
        assert group["kind"] == "adamw" and group["params"] == [p] and group["weight_decay"] == 0.0
        want = 0.0 if name == "radius_gates" else 0.5 * (0.10 if name == "qk_scales" else DEFAULT_LR_MULT)
        assert group["lr"] == pytest.approx(want)
    muon = {id(p) for g in opt.param_groups if g["kind"] == "muon" for p in g["params"]}
    assert not muon & {id(p) for p in variant_params.values()}


def test_branch_tangent_changes_gradients_not_the_loss():
    base = _live_baseline()
    model = _variant_like(base, residual_rule="branch_tangent")
    base_loss, base_grads = _loss_and_grads(base, IDX)
    loss, grads = _loss_and_grads(model, IDX)
    assert torch.equal(loss, base_loss)
    assert torch.equal(grads["lm_head.weight"], base_grads["lm_head.weight"])  # above the last addition
    w = "transformer.h.0.attn.c_q.weight"
    assert (grads[w] - base_grads[w]).norm() > 1e-3 * base_grads[w].norm()


def test_block_checkpointing_and_chunked_loss_keep_the_numbers():
    base = _live_baseline()
    ref_loss, ref_grads = _loss_and_grads(base, IDX)
    for variant in (dict(checkpoint_blocks=True), dict(loss_chunk_tokens=24), dict(checkpoint_blocks=True,
                                                                                     loss_chunk_tokens=64)):
        model = _variant_like(base, **variant)
        loss, grads = _loss_and_grads(model, IDX)
        # the chunked mean sums in another order: fp32 rounding
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
        for name, g in ref_grads.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-7)
    chunked = _variant_like(base, loss_chunk_tokens=24)
    assert torch.equal(chunked(IDX, IDX.roll(-1, 1), reduction="none"), base(IDX, IDX.roll(-1, 1), reduction="none"))


def test_bad_variant_settings_raise():
    for bad in (dict(presub_gains="fused"), dict(qk_scale="tied"), dict(rope="yarn"), dict(residual_rule="x"),
                dict(radius_gate="x"), dict(qk_freeze_planes=4), dict(loss_chunk_tokens=-1),
                dict(qk_scale="pair_tied_linear", n_kv_head=1)):
        with pytest.raises((UsageError, ValueError)):  # the setting's own check, or the model shape's
            small(**bad)


@pytest.mark.parametrize("kind", ["state", "branch"])
def test_radius_gates_use_ordinary_autograd_unless_told_to_detach(kind):
    """Seed 003: the gate arms use ordinary autograd, so with b != 0 the stream's gradient carries the
    path through z_t(v); --gate-detach-stats drops exactly that path (the forward is the same)."""
    base = _live_baseline()
    live, detached = _variant_like(base, radius_gate=kind), _variant_like(base, radius_gate=kind, gate_detach_stats=True)
    for m in (live, detached):
        with torch.no_grad():
            m.radius_gates[:, :, 1] = 0.5  # b: the gate reads z
    assert torch.equal(live(IDX), detached(IDX))
    (_, g_live), (_, g_det) = _loss_and_grads(live, IDX), _loss_and_grads(detached, IDX)
    # everything below a gate sees a different gradient (the path through z_t), down to the embedding
    assert not torch.allclose(g_live["transformer.wte.weight"], g_det["transformer.wte.weight"], rtol=1e-4, atol=0)
