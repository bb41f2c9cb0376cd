"""Build the model and optimizer of a run exactly as upstream's set-up does."""

from __future__ import annotations

import torch

from muonlab.config import TrainConfig
from muonlab.device import Runtime
from muonlab.model import GPT, GPTConfig


def model_config(cfg: TrainConfig, vocab_size: int) -> GPTConfig:
    n_head = cfg.n_head
    return GPTConfig(sequence_len=cfg.sequence_len, vocab_size=vocab_size, n_layer=cfg.depth,
                     n_head=n_head, n_kv_head=cfg.n_kv_head or n_head, n_embd=cfg.model_dim,
                     window_pattern=cfg.window_pattern.upper(), attn_backend=cfg.attn_backend,
                     **cfg.model_variants())


def build_model(cfg: TrainConfig, vocab_size: int, runtime: Runtime) -> GPT:
    """Construct on the meta device, materialise on the target device, initialise.

    Under precision fp32 the whole model (embeddings included) is cast to fp32 after
    init_weights, as the reference bundle's fp32 recording does.
    """
    if cfg.model_family == "tied":
        return _build_tied_model(cfg, vocab_size, runtime)
    with torch.device("meta"):
        model = GPT(model_config(cfg, vocab_size))
    model.to_empty(device=runtime.device)
    model.init_weights()
    if runtime.precision == "fp32":
        model.float()
    model.resolve_attention_backend()
    return model


def _build_tied_model(cfg: TrainConfig, vocab_size: int, runtime: Runtime):
    """Seed 004's tied GPT: fp32 parameters (its runs keep parameters and state in fp32 under
    bf16 autocast), the preset's shape with the data's vocabulary and the run's context."""
    from muonlab.tied import build_tied_model

    with torch.device("meta"):
        model = build_tied_model(cfg.tied_preset, vocab_size=vocab_size, sequence_len=cfg.sequence_len,
                                 grad_source=cfg.tied_grad_source)
    model.to_empty(device=runtime.device)
    model.init_weights()
    return model


def build_optimizer(model, cfg: TrainConfig, compile_step: bool, distributed: bool = False):
    """MuonAdamW, or with several processes DistMuonAdamW (it averages gradients itself); for the
    tied family the AF-Muon builder's preset `cfg.optimizer` (seed 004)."""
    if cfg.model_family == "tied":
        return _build_af_optimizer(model, cfg, distributed)
    from muonlab.optim import DistMuonAdamW, MuonAdamW
    from muonlab.optim.prepolar import PREPOLAR_DEFAULTS

    # only non-default options go on the groups, so baseline groups stay exactly upstream's
    muon_options = {k: getattr(cfg, k) for k in ("prepolar", "prepolar_scope", "prepolar_tau", "prepolar_passes",
                                                 "prepolar_sides", "polar_dtype", "post_polar_dtype")
                    if getattr(cfg, k) != PREPOLAR_DEFAULTS[k]}
    whiten_options = {} if cfg.whiten is None else dict(
        whiten=cfg.whiten, whiten_tau=cfg.whiten_tau, whiten_terms=cfg.whiten_terms,
        whiten_mean_addback=cfg.whiten_mean_addback)

    return model.setup_optimizer(
        optimizer_cls=DistMuonAdamW if distributed else MuonAdamW, unembedding_lr=cfg.unembedding_lr, embedding_lr=cfg.embedding_lr, matrix_lr=cfg.matrix_lr,
        weight_decay=cfg.weight_decay, adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
        scalar_lr=cfg.scalar_lr, matrix_optimizer=cfg.matrix_optimizer,
        adamw_matrix_lr=cfg.adamw_matrix_lr, adamw_matrix_weight_decay=cfg.adamw_matrix_weight_decay,
        muon_options=muon_options, whiten_options=whiten_options,
        master32=cfg.embedding_state == "master32", variant_lr_mult=cfg.variant_lr_mult(),
        table_whiten_options=None if cfg.table_whiten is None else dict(
            table_whiten=cfg.table_whiten, table_whiten_tau=cfg.table_whiten_tau),
        compile=compile_step)


def _build_af_optimizer(model, cfg: TrainConfig, distributed: bool):
    from muonlab.errors import UsageError
    from muonlab.optim import af_muon

    if distributed:
        raise UsageError("AF-Muon runs in one process for now; drop torchrun for model_family tied")
    if cfg.optimizer == "adamw":  # seed 004's protein baseline: plain AdamW everywhere
        optimizer = af_muon.build_optimizer(model, "adamw", lr=cfg.af_matrix_lr)
    else:
        extra = {} if cfg.optimizer == "sign" else dict(cap=cfg.af_cap, scale=cfg.af_scale)
        optimizer = af_muon.build_optimizer(model, cfg.optimizer, lr=cfg.af_matrix_lr, vector_lr=cfg.af_vector_lr,
                                            aux_lr=cfg.af_vector_lr, rho=cfg.af_rho, **extra)
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]  # the lab's schedule scales every group from here
    return optimizer
