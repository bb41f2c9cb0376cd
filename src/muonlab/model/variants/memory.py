"""Seed 003's memory-safe paths ("Forward radius and branch controls"): non-reentrant
per-block activation checkpointing at the block-execution point, and the loss in chunks of
`chunk_tokens` tokens (lm_head + softcap + CE per chunk, recomputed in backward) at the loss
point. Same numbers: the chunked mean sums in another order (fp32 rounding). No parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from muonlab.model.extensions import ModelVariant, register_variant
from muonlab.settings import COUNT, MethodInfo, MethodSection, Section, setting


@dataclass(frozen=True)
class CheckpointBlocksConfig:
    pass


@register_variant("checkpoint_blocks", CheckpointBlocksConfig, paper="seed 003",
                  section="memory-safe implementation (Forward radius and branch controls)", tests=("tests/model/test_model_variants.py",))
class CheckpointBlocks(ModelVariant):
    def run_block(self, block, x, ve, cos_sin, window):
        if torch.is_grad_enabled():
            return checkpoint(block, x, ve, cos_sin, window, use_reentrant=False)
        return block(x, ve, cos_sin, window)


@dataclass(frozen=True)
class ChunkedLossConfig:
    chunk_tokens: int = 4096  # seed 003's chunk

    def __post_init__(self):
        if self.chunk_tokens < 1:
            raise ValueError(f"loss_chunk_tokens must be >= 0 (0: off), got {self.chunk_tokens}")


@register_variant("chunked_loss", ChunkedLossConfig, paper="seed 003",
                  section="memory-safe implementation (Forward radius and branch controls)", tests=("tests/model/test_model_variants.py",))
class ChunkedLoss(ModelVariant):
    def _token_losses(self, x, targets):
        return F.cross_entropy(self.model._logits(x), targets, ignore_index=-1, reduction="none")

    def loss(self, x, targets, reduction):
        """Per-chunk logits are recomputed in backward: no (B*T, vocab) fp32 tensor is kept."""
        flat_x, flat_y = x.reshape(-1, x.size(-1)), targets.reshape(-1)
        n = self.cfg.chunk_tokens
        losses = []
        for start in range(0, flat_y.numel(), n):
            xs, ys = flat_x[start:start + n], flat_y[start:start + n]
            if torch.is_grad_enabled():
                losses.append(checkpoint(self._token_losses, xs, ys, use_reentrant=False))
            else:
                losses.append(self._token_losses(xs, ys))
        per_token = torch.cat(losses)
        if reduction == "none":
            return per_token
        if reduction == "sum":
            return per_token.sum()
        return per_token.sum() / (flat_y != -1).sum()


# run-config settings of this method: its flags, their help, which options act when
@dataclass
class MemorySettings(MethodSection):
    """Seed 003's memory-safe path (usable by any run)."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('memory_safe_path', 'seed 003 (block checkpointing, 4096-token loss chunks)', __name__, ('tests/model/test_model_variants.py',), None, None)

    checkpoint_blocks: bool = setting(False, "non-reentrant activation checkpointing per block")
    loss_chunk_tokens: int = setting(0, "> 0: the loss in recomputed chunks of this many tokens (seed 003: 4096)",
                                     range=COUNT)

    def variant_configs(self, cfg) -> tuple:
        """The model's variant config(s) for this section of the run config `cfg` (none when off)."""
        blocks = (CheckpointBlocksConfig(),) if self.checkpoint_blocks else ()
        return blocks + ((ChunkedLossConfig(self.loss_chunk_tokens),) if self.loss_chunk_tokens > 0 else ())
