"""The tied-token family of seed 004: NanoGPT (and NanoGPT-MoE) with one tied embedding/head
table, trained with AF-Muon or its baselines (muonlab.optim.af_muon)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch

from muonlab.errors import UsageError
from muonlab.families import Family, register_family
from muonlab.families.tied.afmuon import AFMuonConfig, LRSchedule, build_optimizer, cpu_matrix_lr, table_stats
from muonlab.settings import POSITIVE_COUNT, MethodInfo, Section, setting
from muonlab.families.tied.model import TIED_SHAPES

TIED_SHAPE_NAMES = tuple(TIED_SHAPES)

@dataclass
class TiedModelConfig(Section):
    """The tied GPT's shape (vocabulary from the data, context from train.sequence_len)."""

    FIELD_METHODS: ClassVar[dict[str, MethodInfo]] = {
        "grad_source": MethodInfo("tied_gradient_source", "seed 004 K.8", "muonlab.families.tied.model",
                                  ("tests/families/test_tied_lab.py",), "grad_source", "both")}

    preset: Literal[TIED_SHAPE_NAMES] = setting("tied-tiny", "the tied model's shape", flag="tied-preset")
    grad_source: Literal["both", "lookup", "softmax"] = setting(
        "both", "seed 004 K.8: the tied table's gradient source (lookup = input-only, softmax = output-only)",
        flag="tied-grad-source")
    n_embd: int | None = setting(None, "the width d (none: the preset's); heads keep the preset's head dim and "
                                 "the MLP its 4d (seed 004 K.4: d 768, 1024, 1536 at head dim 128)",
                                 flag="tied-n-embd", range=POSITIVE_COUNT)
    vocab_rows: int | None = setting(None, "the tied table's rows where the data's vocabulary has fewer (none: the "
                                     "data's): NanoGPT pads its tokenizer to 50,304 rows (seed 004 App. J.1)",
                                     flag="tied-vocab-rows", range=POSITIVE_COUNT)

    def validate(self) -> None:
        head_dim = TIED_SHAPES[self.preset].n_embd // TIED_SHAPES[self.preset].n_head
        if self.n_embd is not None and self.n_embd % head_dim:
            raise UsageError(f"tied_n_embd must be a positive multiple of {self.preset}'s head dim {head_dim}, "
                             f"got {self.n_embd}")

    def shape(self):
        """The preset's TiedGPTConfig with this section's width (vocabulary and context set at build)."""
        base = TIED_SHAPES[self.preset]
        if self.n_embd is None:
            return base
        return replace(base, n_embd=self.n_embd, n_head=self.n_embd // (base.n_embd // base.n_head))


def build_model(cfg, vocab_size: int, runtime):
    """Fp32 parameters (seed 004 keeps parameters and state in fp32 under bf16 autocast), the
    preset's shape with the data's vocabulary (padded to `vocab_rows`) and the run's context."""
    from muonlab.families.tied.model import build_tied_model  # noqa: PLC0415

    rows = max(vocab_size, cfg.model.vocab_rows or 0)
    with torch.device("meta"):
        model = build_tied_model(cfg.model.shape(), vocab_size=rows, sequence_len=cfg.train.sequence_len,
                                 grad_source=cfg.model.grad_source)
    model.to_empty(device=runtime.device)
    model.init_weights()
    return model


def step_hooks(cfg, model) -> list:
    """The MoE's: experts no token chose keep `.grad` None under torch.compile too (muonlab.families.tied.moe)."""
    from muonlab.families.tied.moe import TopKMoE, UnroutedExpertGrads  # noqa: PLC0415

    layers = [m for m in model.modules() if isinstance(m, TopKMoE)]
    return [UnroutedExpertGrads(layers)] if layers else []


def _describe(cfg) -> str:
    shape = cfg.model.shape()
    return f"tied {cfg.model.preset}: width {shape.n_embd}, depth {shape.n_layer}{', MoE' if shape.moe else ''}"


PRESETS = {
    # Seed 004 NanoGPT protocol (App. J.1): tied NanoGPT-124M, T 1024, 16 x 32
    # accumulation = 524,288 tokens per step, 5,100 steps, constant LR, gradient clip 1.0. The paper's
    # FineWeb/SmolLM2-tokenizer cache is replaced by ClimbMix with a 50,304-token BPE (stated, not matched).
    "nanogpt-124m": {"family": "tied", "model.preset": "nanogpt-124m", "optim.kind": "afmuon",
                     "train.sequence_len": 1024, "train.device_batch_size": 16, "train.total_batch_size": 2**19,
                     "train.num_steps": 5100, "schedule.warmup_ratio": 0.0, "schedule.warmdown_ratio": 0.0,
                     "train.grad_clip": 1.0, "train.loss_logged": "mean", "record.checkpoint_every": 250, "train.eval_tokens": 5 * 2**20,
                     # validation every 250 steps (the authors' launcher): Table 1 compares at step 5,000, the last
                     # evaluation within its 2.62B-token budget
                     "train.eval_every": 250,
                     # the table has 50,304 rows whatever the tokenizer (GPT-2's 50,257, SmolLM2's 49,152: App. J.1)
                     "model.vocab_rows": 50304,
                     "data.source": "climbmix", "data.vocab_size": 50304},
    # a seconds-long tied-GPT configuration (seed 004's arms on CPU; on the CPU on a GPU machine too); the Muon
    # lr scaled to its 512-token batch (cpu_matrix_lr: 0.02 / 32), so each Table-1 arm's val loss falls
    "tied-cpu": {"family": "tied", "model.preset": "tied-tiny", "optim.kind": "afmuon", "optim.matrix_lr": cpu_matrix_lr(512),
                 "train.sequence_len": 64,
                 "train.device_batch_size": 4, "train.total_batch_size": 4 * 64 * 2, "train.num_steps": 30,
                 "train.untimed_steps": 1, "schedule.warmup_ratio": 0.0, "schedule.warmdown_ratio": 0.0,
                 "train.grad_clip": 1.0, "train.loss_logged": "mean", "train.eval_tokens": 4 * 64 * 4, "runtime.device": "cpu",
                 "runtime.precision": "fp32", "runtime.compile": "off", "record.log_every": 1,
                 "data.source": "synthetic", "data.vocab_size": 300, "data.synthetic_bytes": 200_000},
}
# NanoGPT-MoE (App. J.6: top-1 over four ReLU^2 experts, load-balancing 0.01) at the CPU size, and at the paper's
PRESETS["tied-moe-cpu"] = {**PRESETS["tied-cpu"], "model.preset": "tied-tiny-moe"}
PRESETS["nanogpt-124m-moe"] = {**PRESETS["nanogpt-124m"], "model.preset": "nanogpt-124m-moe"}

def prepare_data(cfg, log=print):
    """Text through the packed loader (bits per byte), or as NanoGPT blocks seed 004's token memmaps
    and local text tokenized with a Hugging Face tokenizer.json (--tokenizer-json)."""
    from muonlab.families import text_data  # noqa: PLC0415
    from muonlab.families.tied.token_family import block_batcher, token_data  # noqa: PLC0415

    if cfg.data.source == "memmap" or (cfg.data.source == "local" and cfg.data.tokenizer_json):
        return token_data(cfg, log).with_batcher(block_batcher)  # the paper's tokenizer: its token stream
    return text_data(cfg, log)


def evaluate(model, data, cfg, runtime, ctx, splits=("val", "holdout"), tokens=None):
    """Loss (and bits per byte on text) per split; an MoE's router statistics of the same pass beside them
    (seed 004 Table 19: router entropy, max expert fraction, load CV, unused experts)."""
    from muonlab.data.token_data import TokenData  # noqa: PLC0415
    from muonlab.families.tied.token_family import evaluate_token_splits  # noqa: PLC0415
    from muonlab.eval.text import evaluate_text_splits  # noqa: PLC0415
    from muonlab.families.tied.moe import RouterCounts  # noqa: PLC0415

    score = evaluate_token_splits if isinstance(data, TokenData) else evaluate_text_splits
    out = {}
    for split in splits:
        with RouterCounts(model) as router:
            out.update(score(model, data, cfg, runtime, ctx, (split,), tokens))
        if split in out:
            out[split].extra.update(router.stats(ctx.all_reduce_ if ctx.active else None))
    return out


register_family(Family(
    name="tied", description="seed 004's tied-token GPT (NanoGPT, NanoGPT-MoE) with AF-Muon and its baselines",
    model_config=TiedModelConfig, optim_config=AFMuonConfig, build_model=build_model,
    build_optimizer=build_optimizer, schedule=LRSchedule, step_hooks=step_hooks,
    describe=_describe, depth=lambda cfg: cfg.model.shape().n_layer,
    presets=PRESETS, embedding_key="wte.weight", prepare_data=prepare_data, evaluate=evaluate,
    metric="val_ce", summary_metrics=("val_ce", "val_ppl", "holdout_ce", "holdout_ppl"), final_metrics=table_stats,
    data_sources=("climbmix", "local", "stdlib", "synthetic", "memmap"),
))
