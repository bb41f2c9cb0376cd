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
    with torch.device("meta"):
        model = GPT(model_config(cfg, vocab_size))
    model.to_empty(device=runtime.device)
    model.init_weights()
    if runtime.precision == "fp32":
        model.float()
    model.resolve_attention_backend()
    return model


def build_optimizer(model: GPT, cfg: TrainConfig, compile_step: bool, distributed: bool = False):
    """MuonAdamW, or with several processes DistMuonAdamW (it averages gradients itself)."""
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
