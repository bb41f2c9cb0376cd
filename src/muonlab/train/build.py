"""Build the model and optimizer of a run exactly as upstream's set-up does."""

from __future__ import annotations

import torch

from muonlab.config import TrainConfig
from muonlab.device import Runtime
from muonlab.model import GPT, GPTConfig, variants_from_keys

# settings of the variants' optimizer groups (each variant's config owns them; see its module)
VARIANT_GROUP_KEYS = ("presub_lr_mult", "qk_lr_mult", "rope_lr_mult", "gate_lr_mult", "table_whiten",
                      "table_whiten_tau")


def model_config(cfg: TrainConfig, vocab_size: int) -> GPTConfig:
    n_head = cfg.n_head
    variants = variants_from_keys(**cfg.model_variants(), **{k: getattr(cfg, k) for k in VARIANT_GROUP_KEYS})
    return GPTConfig(sequence_len=cfg.sequence_len, vocab_size=vocab_size, n_layer=cfg.depth,
                     n_head=n_head, n_kv_head=cfg.n_kv_head or n_head, n_embd=cfg.model_dim,
                     window_pattern=cfg.window_pattern.upper(), attn_backend=cfg.attn_backend,
                     variants=variants)


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
    # Neumann-Gram vocabulary whitening on wte, lm_head and value embeddings (seed 002 §1.4d);
    # fp32 master weights and moments for wte and value embeddings (seed 002 §1.4e)
    table = {} if cfg.whiten is None else dict(
        whiten=cfg.whiten, whiten_tau=cfg.whiten_tau, whiten_terms=cfg.whiten_terms,
        whiten_mean_addback=cfg.whiten_mean_addback)
    embed = dict(table, master32=True) if cfg.embedding_state == "master32" else table
    group_options = dict(lm_head=table, wte=embed, value_embeds=embed, muon=muon_options)
    # the adamw_only control: every block matrix on AdamW (lr not d-scaled)
    matrix_adamw = None if cfg.matrix_optimizer == "muon" else dict(
        lr=cfg.adamw_matrix_lr, weight_decay=cfg.adamw_matrix_weight_decay)
    return model.setup_optimizer(
        unembedding_lr=cfg.unembedding_lr, embedding_lr=cfg.embedding_lr, matrix_lr=cfg.matrix_lr,
        weight_decay=cfg.weight_decay, adam_betas=(cfg.adam_beta1, cfg.adam_beta2), scalar_lr=cfg.scalar_lr,
        optimizer_cls=DistMuonAdamW if distributed else MuonAdamW, group_options=group_options,
        matrix_adamw=matrix_adamw, compile=compile_step)


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
