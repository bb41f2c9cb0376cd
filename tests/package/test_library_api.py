"""The documented library API (docs/design.md, "Who uses it"): moving code behind it does not break it."""

import inspect

import torch


def test_the_optimizer_and_model_names_import_from_their_packages():
    from muonlab.model import GPT, GPTConfig, OverEncoding, residual_add, stop_exp
    from muonlab.optim import (AFMuon, DistMuonAdamW, MuonAdamW, aol_scale, clipped_row_lmo, hbieq,
                               moment_free_step, neumann_whiten, polar_express, zeta_whiten)

    for cls in (GPT, OverEncoding, MuonAdamW, DistMuonAdamW, AFMuon):
        assert inspect.isclass(cls)
    for fn in (residual_add, stop_exp, clipped_row_lmo, polar_express, hbieq, zeta_whiten, aol_scale,
               neumann_whiten, moment_free_step):
        assert callable(fn)
    # upstream's GPTConfig fields (+ attn_backend and the variants), upstream's setup_optimizer arguments
    fields = list(GPTConfig.__dataclass_fields__)
    assert fields[:7] == ["sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "window_pattern"]
    assert set(fields[7:]) == {"attn_backend", "head_loss", "variants"}
    params = list(inspect.signature(GPT.setup_optimizer).parameters)[1:7]
    assert params == ["unembedding_lr", "embedding_lr", "matrix_lr", "weight_decay", "adam_betas", "scalar_lr"]
    muon_step = __import__("muonlab.optim.muon_adamw", fromlist=["muon_step"]).muon_step
    assert len(inspect.signature(muon_step).parameters) == 10


def test_a_plain_gpt_trains_with_muonadamw_as_upstream_calls_it():
    from muonlab.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(sequence_len=32, vocab_size=64, n_layer=2, n_head=1, n_kv_head=1, n_embd=64))
    model.init_weights()
    model.float()
    opt = model.setup_optimizer(matrix_lr=0.02, embedding_lr=0.2, weight_decay=0.0)
    idx = torch.randint(0, 64, (2, 32))
    first = model(idx, idx).item()
    for _ in range(5):
        model(idx, idx).backward()
        opt.step()
        model.zero_grad(set_to_none=True)
    assert model(idx, idx).item() < first
