"""Small T5-style (3-way tie) and ImageGPT-style tied models of seed 004 (AF-Muon):
muonlab.families.tied.t5.model and muonlab.families.tied.imagegpt.model.

Shapes and counts from seed 004 App. J.5 / J.7; exact counts not printed there (54,561,792 /
104,893,440 and 33,563,648 parameters); the 3-way gradient G = G_enc + G_dec + G_out from
seed 004 App. I; RGB554, SOS, bits/dim and top-half completion from App. J.7 / Table 23.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from muonlab.errors import UsageError
from muonlab.optim.af_muon import GradientSources, build_optimizer, partition_by_role
from muonlab.families.tied.model import expected_num_parameters
from muonlab.families.tied.imagegpt.model import (
    IMAGEGPT_SHAPES,
    N_COLOURS,
    SOS_ID,
    ColourHead,
    ImageGPTConfig,
    TiedImageGPT,
    bits_per_dim,
    bits_per_token,
    build_imagegpt,
    completion_nll,
    image_lm_batch,
    rgb554_decode,
    rgb554_encode,
)
from muonlab.families.tied.t5.model import (
    T5_SHAPES,
    T5Config,
    TiedT5,
    build_t5,
    contiguous_windows,
    prefix_to_continuation,
    sinusoidal_positions,
    t5_batch,
    t5_expected_num_parameters,
)


def _t5(name: str = "t5-tiny", seed: int = 0, dtype: torch.dtype = torch.float32) -> TiedT5:
    torch.manual_seed(seed)
    return build_t5(name).to(dtype)


def _t5_batch(model: TiedT5, B: int = 2, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    windows = torch.randint(0, model.config.vocab_size, (B, model.config.window_len), generator=g)
    return t5_batch(windows, model.config)


def _igpt(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> TiedImageGPT:
    torch.manual_seed(seed)
    return build_imagegpt("imagegpt-tiny", **overrides).to(dtype)


def _images(n: int = 2, side: int = 8, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, side, side, 3), generator=g, dtype=torch.uint8)


def _roles_cover_every_parameter(model: nn.Module, roles: dict) -> None:
    names = [n for n, _ in model.named_parameters()]  # deduplicated by identity
    assigned = [n for v in roles.values() for n, _ in v]
    assert sorted(assigned) == sorted(names) and len(set(assigned)) == len(assigned)


# --- T5: counts and the tie ------------------------------------------------------------------

def test_t5_parameter_counts_on_meta():
    """Seed 004 App. J.5 / Fig. 10: 54,561,792 shared, 104,893,440 untied."""
    counts = {}
    for name in ("t5-small", "t5-small-untied"):
        with torch.device("meta"):
            model = build_t5(name)
        assert model.wte.weight.is_meta
        counts[name] = model.num_parameters()
        assert counts[name] == t5_expected_num_parameters(model.config)
    assert counts == {"t5-small": 54_561_792, "t5-small-untied": 104_893_440}
    cfg = T5_SHAPES["t5-small"]
    assert (cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.n_embd, cfg.n_head, cfg.ff_hidden,
            cfg.vocab_size, cfg.source_len, cfg.target_len, cfg.bos_id) == (
        4, 4, 512, 8, 2048, 49152, 256, 256, 0)
    # the reading that reproduces the count: 2 norms per encoder layer, 3 per decoder layer
    # (self, cross, FF), one final norm per stack, MultiheadAttention with biases
    d = 512
    assert counts["t5-small"] == (49152 * d + 12 * (4 * d * d + 4 * d) + 8 * 2 * d * 2048
                                  + (4 * 2 + 4 * 3 + 2) * d)


def test_t5_three_way_tie_is_one_parameter():
    model = _t5()
    table = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is table
    assert model.decoder_embeddings().weight is table
    assert list(model.get_output_embeddings().parameters()) == []
    assert [n for n, p in model.named_parameters() if p is table] == ["wte.weight"]
    assert [k for k in model.state_dict() if "wte" in k or "lm_head" in k] == ["wte.weight"]
    assert model.num_parameters() == t5_expected_num_parameters(model.config)

    untied = _t5("t5-tiny-untied")
    tables = {id(untied.wte.weight), id(untied.decoder_embeddings().weight), id(untied.lm_head.weight)}
    assert len(tables) == 3
    assert untied.num_parameters() == model.num_parameters() + 2 * 512 * 64


def test_t5_tie_survives_copy_meta_and_load():
    model = _t5()
    for other in (copy.deepcopy(model), copy.deepcopy(model).to(torch.float64)):
        assert other.get_output_embeddings().weight is other.get_input_embeddings().weight
    with torch.device("meta"):
        meta = build_t5("t5-tiny")
    meta.to_empty(device="cpu")
    meta.init_weights()
    assert meta.get_output_embeddings().weight is meta.get_input_embeddings().weight
    assert torch.equal(meta.pos, model.pos)
    meta.load_state_dict(model.state_dict())
    src, tgt_in, _ = _t5_batch(model)
    assert torch.equal(meta(src, tgt_in), model(src, tgt_in))


def test_t5_init_and_positions():
    model = _t5()
    for layer in (*model.encoder, *model.decoder):
        for m in layer.modules():
            if isinstance(m, nn.MultiheadAttention):
                assert torch.count_nonzero(m.in_proj_bias) == 0 and torch.count_nonzero(m.out_proj.bias) == 0
    assert abs(model.wte.weight.std().item() - 0.02) < 0.002
    pe = sinusoidal_positions(5, 8)
    t, i = 3, 1  # channel pair i = 1 -> frequency 10000^(-2/8)
    w = 10000.0 ** (-2 * i / 8)
    assert pe[t, 2 * i].item() == pytest.approx(math.sin(t * w), abs=1e-6)
    assert pe[t, 2 * i + 1].item() == pytest.approx(math.cos(t * w), abs=1e-6)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 4))


# --- T5: batching, forward, causality ------------------------------------------------------

def test_prefix_to_continuation_batching():
    """Seed 004 App. J.5: 512-token windows -> source 256, target 256, decoder input [0, target[:-1]]."""
    stream = torch.arange(1, 2 * 512 + 7)  # ids 1.. so BOS 0 is distinguishable
    windows = contiguous_windows(stream, 512)
    assert windows.shape == (2, 512)
    assert torch.equal(windows[1], stream[512:1024])
    src, tgt_in, target = prefix_to_continuation(windows)
    assert src.shape == tgt_in.shape == target.shape == (2, 256)
    assert torch.equal(src, windows[:, :256]) and torch.equal(target, windows[:, 256:])
    assert torch.equal(tgt_in[:, 0], torch.zeros(2, dtype=stream.dtype))
    assert torch.equal(tgt_in[:, 1:], target[:, :-1])
    assert all(torch.equal(a, b) for a, b in zip(t5_batch(windows, T5Config()), (src, tgt_in, target)))
    with pytest.raises(ValueError):
        prefix_to_continuation(windows[:, :500])


def test_t5_forward_shapes_and_loss():
    model = _t5()
    src, tgt_in, target = _t5_batch(model, B=3)
    logits = model(src, tgt_in)
    assert logits.shape == (3, 16, 512)
    loss = model(src, tgt_in, target)
    assert loss.ndim == 0 and abs(loss.item() - math.log(512)) < 0.5
    per_token = model(src, tgt_in, target, reduction="none")
    assert per_token.shape == (3, 16) and torch.allclose(per_token.mean(), loss)
    assert torch.allclose(loss, F.cross_entropy(logits.reshape(-1, 512), target.reshape(-1)))
    with pytest.raises(ValueError):
        model(torch.zeros(1, 17, dtype=torch.long), tgt_in[:1])  # longer than the position table
    with pytest.raises(UsageError):
        build_t5("t5-nope")


def test_t5_decoder_is_causal_and_sees_the_whole_source():
    model = _t5(dtype=torch.float64).eval()
    src, tgt_in, _ = _t5_batch(model, B=2)
    base = model(src, tgt_in)
    j = 9
    tgt2 = tgt_in.clone()
    tgt2[:, j] = (tgt2[:, j] + 1) % model.config.vocab_size
    out = model(src, tgt2)
    assert torch.allclose(out[:, :j], base[:, :j], atol=1e-12)
    assert not torch.allclose(out[:, j], base[:, j])
    src2 = src.clone()
    src2[:, -1] = (src2[:, -1] + 1) % model.config.vocab_size  # the last source token
    out = model(src2, tgt_in)
    assert (out - base).abs().amax(dim=-1).min() > 0  # bidirectional encoder: every position moves


# --- T5: the 3-way gradient and AF-Muon's partition ----------------------------------------

def test_t5_tied_gradient_is_encoder_plus_decoder_plus_head():
    """Seed 004 App. I: G = G_enc + G_dec + G_out on the one table (float64, paths detached)."""
    model = _t5(dtype=torch.float64)
    src, tgt_in, target = _t5_batch(model, B=2)
    table = model.wte.weight

    def grad(paths):
        model.zero_grad(set_to_none=True)
        model(src, tgt_in, target, table_paths=paths).backward()
        return table.grad.clone()

    total = grad(("encoder", "decoder", "head"))
    g_enc, g_dec, g_out = grad(("encoder",)), grad(("decoder",)), grad(("head",))
    assert torch.allclose(g_enc + g_dec + g_out, total, rtol=1e-10, atol=1e-14)
    for part in (g_enc, g_dec, g_out):
        assert part.abs().sum() > 0
    rows = lambda g: set(torch.nonzero(g.abs().sum(1)).flatten().tolist())  # noqa: E731
    assert rows(g_enc) == set(src.flatten().tolist())  # sparse lookups: input rows only
    assert rows(g_dec) == set(tgt_in.flatten().tolist())
    assert len(rows(g_out)) == model.config.vocab_size  # dense softmax gradient
    assert g_out.sum(0).abs().max() < 1e-12  # 1^T G_out = 0 (seed 004 Prop. 2)
    with pytest.raises(ValueError):
        grad(("encoder", "bogus"))
    # the lab's K.8 capture sees both lookups as the "lookup" source
    model.zero_grad(set_to_none=True)
    with GradientSources(model) as cap:
        model(src, tgt_in, target).backward()
        sources = cap.sources()
    # (its buffer is fp32, so compare at fp32 precision)
    assert torch.allclose(sources["lookup"].double(), g_enc + g_dec, rtol=1e-5, atol=1e-7)
    assert torch.allclose(sources["softmax"].double(), g_out, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("meta", [False, True])
def test_t5_af_muon_partition_gives_every_parameter_a_role(meta):
    if meta:
        with torch.device("meta"):
            model = build_t5("t5-small")
    else:
        model = _t5()
    roles = partition_by_role(model)
    _roles_cover_every_parameter(model, roles)
    assert [n for n, _ in roles["tied"]] == ["wte.weight"]
    matrices = {n for n, _ in roles["matrix"]}
    vectors = {n for n, _ in roles["vector"]}
    L = model.config.n_encoder_layers + 2 * model.config.n_decoder_layers  # attention modules
    assert sum(n.endswith("in_proj_weight") for n in matrices) == L
    assert sum(n.endswith("out_proj.weight") for n in matrices) == L
    assert sum(n.endswith(("in_proj_bias", "out_proj.bias")) for n in vectors) == 2 * L
    assert all(p.ndim == 2 for _, p in roles["matrix"]) and all(p.ndim == 1 for _, p in roles["vector"])
    assert len(matrices) == 2 * L + 2 * (model.config.n_encoder_layers + model.config.n_decoder_layers)


def test_t5_untied_control_has_no_tied_role():
    with pytest.raises(ValueError, match="untied"):
        partition_by_role(_t5("t5-tiny-untied"))


def _train(model, opt, loss_fn, steps):
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # seed 004 §3.1
        opt.step()
        losses.append(loss.item())
    return losses


def test_t5_af_muon_rho_one_reduces_loss_and_keeps_the_tie():
    """Seed 004 Table 14: the small T5 uses rho_out / rho_hid = 1."""
    model = _t5()
    src, tgt_in, target = _t5_batch(model, B=4)
    opt = build_optimizer(model, "afmuon", rho=1.0)
    assert [g["rho"] for g in opt.param_groups if g["part"] == "tied"] == [1.0]
    table0 = model.wte.weight.detach().clone()
    losses = _train(model, opt, lambda: model(src, tgt_in, target), 8)
    assert losses[-1] < losses[0] - 0.3 and all(b < a for a, b in zip(losses, losses[1:])), losses
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert not torch.equal(model.wte.weight, table0)


def test_t5_untied_control_trains_with_adamw():
    model = _t5("t5-tiny-untied")
    src, tgt_in, target = _t5_batch(model, B=4)
    losses = _train(model, build_optimizer(model, "adamw", lr=3e-3), lambda: model(src, tgt_in, target), 8)
    assert losses[-1] < losses[0] - 0.5, losses


# --- ImageGPT: counts, head, SOS -----------------------------------------------------------

def test_imagegpt_parameter_count_on_meta():
    """Seed 004 App. J.7: V = 16,385; 33,563,648 parameters derived from its shapes."""
    with torch.device("meta"):
        model = build_imagegpt("imagegpt")
    cfg = model.config
    assert model.num_parameters() == expected_num_parameters(cfg) == 33_563_648
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.mlp_hidden) == (8, 512, 8, 64, 2048)
    assert (cfg.vocab_size, cfg.n_colours, cfg.sos_id, cfg.tokens_per_image) == (16385, 16384, 16384, 1024)
    assert IMAGEGPT_SHAPES["imagegpt-tiny"].tokens_per_image == 64
    with pytest.raises(ValueError):
        ImageGPTConfig(image_size=8)  # sequence_len must be 8^2
    with pytest.raises(ValueError):
        ImageGPTConfig(moe=True)


def test_imagegpt_tie_and_colour_head():
    model = _igpt()
    table = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    assert isinstance(head, ColourHead) and head.weight is table and list(head.parameters()) == []
    assert [n for n, p in model.named_parameters() if p is table] == ["wte.weight"]
    roles = partition_by_role(model)
    _roles_cover_every_parameter(model, roles)
    assert [n for n, _ in roles["tied"]] == ["wte.weight"]


def test_imagegpt_sos_is_never_predicted():
    """Seed 004 App. J.7: logits only against the first 16,384 rows; the SOS row is input-only."""
    model = _igpt(dtype=torch.float64)
    tokens = rgb554_encode(_images())
    idx, targets = image_lm_batch(tokens)
    logits = model(idx)
    assert logits.shape == (2, 64, N_COLOURS)
    h, _ = model.backbone(model.wte(idx))
    assert torch.allclose(logits, F.linear(h, model.wte.weight)[..., :N_COLOURS])
    table = model.wte.weight
    model.zero_grad(set_to_none=True)
    model(idx, targets).backward()
    both = table.grad.clone()
    assert both[SOS_ID].abs().sum() > 0  # looked up at every position 0
    out_only = _igpt(dtype=torch.float64, grad_source="softmax")
    out_only.load_state_dict(model.state_dict())
    out_only(idx, targets).backward()
    assert torch.count_nonzero(out_only.wte.weight.grad[SOS_ID]) == 0  # no softmax gradient on SOS
    in_only = _igpt(dtype=torch.float64, grad_source="lookup")
    in_only.load_state_dict(model.state_dict())
    in_only(idx, targets).backward()
    assert torch.allclose(in_only.wte.weight.grad + out_only.wte.weight.grad, both, rtol=1e-10, atol=1e-14)
    assert torch.equal(in_only.wte.weight.grad[SOS_ID], both[SOS_ID])


def test_image_lm_batch_and_loss():
    model = _igpt()
    tokens = rgb554_encode(_images(3))
    idx, targets = image_lm_batch(tokens)
    assert torch.equal(idx[:, 0], torch.full((3,), SOS_ID)) and torch.equal(idx[:, 1:], tokens[:, :-1])
    assert targets is tokens
    loss = model.image_loss(tokens)
    assert torch.allclose(loss, model(idx, targets))
    assert abs(loss.item() - math.log(N_COLOURS)) < 0.5
    with pytest.raises(ValueError):
        image_lm_batch(torch.full((1, 64), SOS_ID))
    with pytest.raises(ValueError):
        model.image_loss(tokens[:, :32])


def test_imagegpt_is_causal():
    model = _igpt(dtype=torch.float64).eval()
    idx, _ = image_lm_batch(rgb554_encode(_images()))
    base = model(idx)
    j = 40
    idx2 = idx.clone()
    idx2[:, j] = (idx2[:, j] + 1) % N_COLOURS
    out = model(idx2)
    assert torch.allclose(out[:, :j], base[:, :j], atol=1e-12)
    assert not torch.allclose(out[:, j], base[:, j])


# --- RGB554, metrics, completion -----------------------------------------------------------

def test_rgb554_formula_on_random_pixels_and_raster_order():
    images = _images(4, side=32, seed=7)
    tokens = rgb554_encode(images)
    assert tokens.shape == (4, 1024) and tokens.dtype == torch.int64
    flat = images.reshape(4, 1024, 3).tolist()
    expected = [[(r >> 3) * 512 + (g >> 3) * 16 + (b >> 4) for r, g, b in img] for img in flat]
    assert tokens.tolist() == expected
    one = torch.zeros(1, 32, 32, 3, dtype=torch.uint8)
    one[0, 2, 5] = torch.tensor([255, 255, 255], dtype=torch.uint8)  # row 2, column 5
    assert torch.nonzero(rgb554_encode(one)[0]).flatten().tolist() == [2 * 32 + 5]
    px = lambda r, g, b: rgb554_encode(torch.tensor([[[[r, g, b]]]], dtype=torch.uint8)).item()  # noqa: E731
    assert (px(0, 0, 0), px(255, 255, 255), px(8, 0, 0), px(0, 8, 0), px(0, 0, 16), px(7, 7, 15)) == (
        0, N_COLOURS - 1, 512, 16, 1, 0)
    with pytest.raises(ValueError):
        rgb554_encode(images.to(torch.int32))


@pytest.mark.parametrize("mode", ["center", "lower"])
def test_rgb554_round_trip_on_bin_representatives(mode):
    every = torch.arange(N_COLOURS).view(16, 1024)  # all colours, as 16 images of 32 x 32
    images = rgb554_decode(every, mode=mode)
    assert images.shape == (16, 32, 32, 3) and images.dtype == torch.uint8
    assert torch.equal(rgb554_encode(images), every)
    # decode(encode(x)) is x's bin representative
    x = _images(2, side=8, seed=3).to(torch.int64)
    rep = rgb554_decode(rgb554_encode(x.to(torch.uint8)), mode=mode).to(torch.int64)
    width = torch.tensor([8, 8, 16])
    lower = x - x % width
    assert torch.equal(rep, lower + width // 2 if mode == "center" else lower)
    with pytest.raises(ValueError):
        rgb554_decode(torch.tensor([[N_COLOURS]]))


def test_bits_per_dim_and_token():
    assert bits_per_dim(3 * math.log(2.0)) == pytest.approx(1.0)
    assert bits_per_token(math.log(2.0)) == pytest.approx(1.0)
    uniform = math.log(N_COLOURS)  # a uniform model over 2^14 colours: 14 bits / token, 14/3 per dim
    assert bits_per_token(uniform) == pytest.approx(14.0)
    assert bits_per_dim(uniform) == pytest.approx(14.0 / 3.0)
    assert float(bits_per_dim(torch.tensor(2.3243))) == pytest.approx(2.3243 / (3 * math.log(2.0)))


def test_top_half_completion_nll():
    """Seed 004 Table 23: condition on the first half, NLL of the second half."""
    model = _igpt(dtype=torch.float64)
    tokens = rgb554_encode(_images(3))
    per_token = model.image_loss(tokens, reduction="none")
    assert per_token.shape == (3, 64)
    nll = completion_nll(model, tokens)
    assert torch.allclose(nll, per_token[:, 32:].mean())
    assert torch.allclose(completion_nll(model, tokens, n_context=0), model.image_loss(tokens))
    # the top half is the context: changing it changes the bottom half's score
    top_changed = tokens.clone()
    top_changed[:, :32] = (top_changed[:, :32] + 1) % N_COLOURS
    assert not torch.allclose(completion_nll(model, top_changed), nll)
    with pytest.raises(ValueError):
        completion_nll(model, tokens, n_context=64)


def test_imagegpt_af_muon_reduces_loss():
    model = _igpt()
    tokens = rgb554_encode(_images(4))
    opt = build_optimizer(model, "afmuon")
    losses = _train(model, opt, lambda: model.image_loss(tokens), 8)
    assert losses[-1] < losses[0] - 0.5, losses
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
