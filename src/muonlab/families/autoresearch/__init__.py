"""The autoresearch family: the upstream GPT trained with MuonAdamW (karpathy/autoresearch 228791f)."""

from __future__ import annotations

import torch

from muonlab.errors import UsageError
from muonlab.families import Family, register_family
from muonlab.families.autoresearch.config import AutoresearchModelConfig, MuonAdamWConfig
from muonlab.families.autoresearch.presets import PRESETS
from muonlab.settings import method_sections


def gpt_config(cfg, vocab_size: int):
    """The GPTConfig of a run: upstream's fields and the variants that are on."""
    from muonlab.model import GPTConfig  # noqa: PLC0415

    m = cfg.model
    return GPTConfig(sequence_len=cfg.train.sequence_len, vocab_size=vocab_size, n_layer=m.depth,
                     n_head=m.n_head, n_kv_head=m.n_kv_head or m.n_head, n_embd=m.model_dim,
                     window_pattern=m.window_pattern.upper(), attn_backend=m.attn_backend, head_loss=m.head_loss,
                     variants=variant_configs(cfg))


def variant_configs(cfg) -> tuple:
    """The configs of the model variants a run turns on: each method section of the model config
    makes its own (`variant_configs`, beside its variant), then the plug-ins' (`--variant`, with
    their options' settings, `--<variant>-<field>`); in registry order."""
    from muonlab.model.extensions import in_registry_order  # noqa: PLC0415

    m = cfg.model
    built = [c for section in method_sections(m) for c in section.variant_configs(cfg)]
    return in_registry_order(built + [m.plugin_config(name) for name in m.extra_variant_names()])


def build_model(cfg, vocab_size: int, runtime):
    """Construct on the meta device, materialise on the target device, initialise. Under
    precision fp32 the whole model (embeddings included) is cast to fp32 after init_weights,
    as the reference bundle's fp32 recording does."""
    from muonlab.model import GPT  # noqa: PLC0415

    with torch.device("meta"):
        model = GPT(gpt_config(cfg, vocab_size))
    model.to_empty(device=runtime.device)
    model.init_weights()
    if runtime.precision == "fp32":
        model.float()
    model.resolve_attention_backend()
    return model


def build_optimizer(model, cfg, compile_step: bool, distributed: bool = False):
    """MuonAdamW (or with several processes DistMuonAdamW, which averages gradients itself) over the
    model's named groups, the methods that are on adding their keys to the groups they act on."""
    from muonlab.optim import DistMuonAdamW, MuonAdamW  # noqa: PLC0415

    o = cfg.optim
    # each method section of the optimizer config names the groups it acts on and their keys
    # (param_group_keys); a method that is off adds none, so baseline groups stay exactly upstream's
    extra: dict[str, dict] = {}
    with_names = False
    for section in method_sections(o):
        for name, keys in section.param_group_keys(o).items():
            extra.setdefault(name, {}).update(keys)
        with_names = with_names or section.needs_param_names()
    named = model.param_groups(unembedding_lr=o.unembedding_lr, embedding_lr=o.embedding_lr, matrix_lr=o.matrix_lr,
                               weight_decay=o.weight_decay, adam_betas=(o.adam_beta1, o.adam_beta2),
                               scalar_lr=o.scalar_lr)
    on_muon = o.matrix_optimizer == "muon"
    groups = [dict(group, **extra.get(name, {})) for name, group in named if on_muon or name != "muon"]
    if not on_muon:  # the adamw_only control: every block matrix in one AdamW group (not d-scaled)
        groups.append(dict(kind="adamw", params=model.block_matrices(), betas=(o.adam_beta1, o.adam_beta2),
                           eps=1e-10, weight_decay=o.adamw_matrix_weight_decay, lr=o.adamw_matrix_lr))
    if with_names:  # a method reads the parameters' names; torch then wants them on every group
        names = {id(p): n for n, p in model.named_parameters()}
        for group in groups:
            group["param_names"] = [names[id(p)] for p in group["params"]]
    optimizer_cls = DistMuonAdamW if distributed else MuonAdamW
    optimizer = optimizer_cls(groups, compile=compile_step)
    if distributed:
        optimizer.always_collective = cfg.runtime.collectives == "always"
    return model.attach_optimizer(optimizer)


def schedule(cfg):
    from muonlab.optim.schedules import Schedule  # noqa: PLC0415

    o, s = cfg.optim, cfg.schedule
    return Schedule(warmup_ratio=s.warmup_ratio, warmdown_ratio=s.warmdown_ratio, final_lr_frac=s.final_lr_frac,
                    weight_decay=o.weight_decay, momentum_start=o.muon_momentum_start,
                    momentum_end=o.muon_momentum_end, momentum_warmup_steps=o.muon_momentum_warmup_steps,
                    momentum_cooldown=o.muon_momentum_cooldown, wd_schedule=o.muon_wd_schedule,
                    lr_scale=o.lr_scale)


def step_hooks(cfg, model) -> list:
    """What the methods that are on do around each step (a section's `step_hooks(model)`)."""
    return [hook for part in (cfg.model, cfg.optim) for section in method_sections(part)
            for hook in section.step_hooks(model)]


def trajectory(model) -> dict:
    """The full residual scalars (seed 000 Table 4B)."""
    return {"x0_lambdas": model.x0_lambdas.detach().float().tolist(),
            "resid_lambdas": model.resid_lambdas.detach().float().tolist()}


def validate(cfg) -> None:
    """The checks that cross sections (a section's `check_with(cfg)`: a method that needs another),
    then the GPT's own checks (each variant config checks its values and the model's shape)."""
    if cfg.data.source == "local" and cfg.data.tokenizer_json:  # the data section lets it act for local text
        raise UsageError("--tokenizer-json does not act on model family autoresearch: its GPT reads text through "
                         "its own BPE (bits per byte need each token's bytes); the seed-004 families (tied, hf, t5, "
                         "reuse) read a Hugging Face tokenizer")
    for part in (cfg.model, cfg.optim):
        for section in method_sections(part):
            section.check_with(cfg)
    try:
        gpt_config(cfg, vocab_size=cfg.data.vocab_size)
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_model_fits(cfg)


BYTES_PER_PARAMETER = 16  # fp32 weight, gradient and two optimizer moments: the least a trained parameter holds


def check_model_fits(cfg) -> None:
    """Refuse, before anything is built or written, a shape whose parameters alone exceed this machine's
    memory: 12 d^2 a block (attention 4 d^2, MLP 8 d^2) and the embedding and head (2 V d), each held as
    BYTES_PER_PARAMETER bytes. A lower bound: activations come on top."""
    from muonlab.device import machine_memory_bytes  # noqa: PLC0415

    m = cfg.model
    params = 12 * m.depth * m.model_dim ** 2 + 2 * cfg.data.vocab_size * m.model_dim
    have = machine_memory_bytes()
    if have and params * BYTES_PER_PARAMETER > have:
        need = params * BYTES_PER_PARAMETER / 2**30
        shown = f"{need:,.0f}" if need < 1e6 else f"{need:.3g}"
        raise UsageError(f"model depth {m.depth}, width {m.model_dim}: about {params:.3g} parameters need at least "
                         f"{shown} GiB to train, this machine has {have / 2**30:,.0f} GiB: choose a smaller --depth "
                         "/ --aspect-ratio")


register_family(Family(
    name="autoresearch", description="the upstream GPT with MuonAdamW (karpathy/autoresearch 228791f)",
    model_config=AutoresearchModelConfig, optim_config=MuonAdamWConfig, build_model=build_model,
    build_optimizer=build_optimizer, schedule=schedule,
    describe=lambda cfg: f"width {cfg.model.model_dim}, depth {cfg.model.depth}", depth=lambda cfg: cfg.model.depth,
    step_hooks=step_hooks, trajectory=trajectory, validate=validate, presets=PRESETS,
    final_metrics=lambda model: model.summary_counts(),
    attention_backend=lambda model: model.transformer.h[0].attn.backend,
))
