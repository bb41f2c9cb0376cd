"""Shared-MLP causal LM of seed 004 App. K.9 ("homogeneous dense-parameter reuse", Table 39).

The boundary diagnostic of AF-Muon: ONE MLP up-projection and ONE down-projection reused at
every depth, so one stored dense matrix receives several gradient contributions
G = sum_l G_l (eq. 25) whose uses all share the spectral geometry (eq. 26-27). The paper's
model: "a four-depth causal diagnostic model with hidden size 512, feed-forward size 2048,
and a vocabulary of 49,152 tokens", "normalization parameters remain depth-specific", the
"input embedding, positional embedding, and output head are untied", "without attention or
cross-token mixing", 52.6M parameters. Architecture:
  - x_0 = wte[idx] + wpe[t] (untied input table V x d, learned positional table T x d);
  - x_l = x_{l-1} + down(act(up(norm_l(x_{l-1})))) for l = 1..L, with depth-specific pre-norm
    RMSNorms (`muonlab.families.tied.model.RMSNorm`, eps 1e-6, learnable gain) and the SAME bias-free
    `up` (d -> ff) and `down` (ff -> d) Parameters at every depth;
  - logits = lm_head(norm(x_L)), an untied bias-free head (V x d);
  - init: N(0, init_std) for every Linear and Embedding, gains 1 (the released code's conventions).

Choices where the paper is silent (ours):
  - activation: ScaledReLU^2 = sqrt(2) ReLU(x)^2 (`muonlab.families.tied.model.scaled_relu_sq`), the
    seed's shared MLP convention (the released code's; not in seed 004 App. K.9);
  - positional table length `sequence_len` = 256. The paper gives no context length; its
    52.6M rounds from 52,431,360 + 512 T, which holds for 232 <= T <= 427, and 256 is the
    only power of two there: 52,562,432 parameters (`shared_mlp_expected_num_parameters`).

Split uses (seed 004 App. K.9, "we replace the shared matrix by L equal-valued differentiable
copies"): inside `with model.split_uses() as copies:`, depth l reads copies["up"][l] and
copies["down"][l], clones of the stored weights taken at entry. The clones stay in the graph
of the stored Parameter, so autograd.grad(loss, copies[...]) gives the per-use G_l while a
plain backward still accumulates G = sum_l G_l on the Parameter. Logits are bitwise those of
the shared forward (same values, same ops).

`build_optimizer(model, "hybrid_untied")` (muonlab.optim.af_muon) puts wte, wpe and lm_head
(the tables) and the gains on AdamW and up/down on Muon, as in the paper's run (K.9: "Only
the shared dense matrices are relevant"; Hybrid and AF-Muon share this Muon branch).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from muonlab.families.tied.model import REDUCTIONS, RMSNorm, lm_loss, scaled_relu_sq

SHARED = ("up", "down")


@dataclass(frozen=True)
class SharedMLPConfig:
    """Shape of the K.9 shared-MLP model; defaults are seed 004's (App. K.9) + our T = 256."""

    vocab_size: int = 49152
    n_layer: int = 4  # number of depths that reuse the one MLP (L in eq. 25)
    n_embd: int = 512
    ff_hidden: int = 2048
    sequence_len: int = 256  # positional-table length (not stated in the paper; see module docstring)
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_embd", "ff_hidden", "sequence_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.norm_eps <= 0 or self.init_std < 0:
            raise ValueError("norm_eps must be > 0 and init_std >= 0")


def shared_mlp_expected_num_parameters(cfg: SharedMLPConfig) -> int:
    """From the shape alone: input table + positions + head + ONE up/down pair + L+1 gains:
    V d + T d + V d + 2 d ff + (L + 1) d."""
    d = cfg.n_embd
    return 2 * cfg.vocab_size * d + cfg.sequence_len * d + 2 * d * cfg.ff_hidden + (cfg.n_layer + 1) * d


class SharedMLPLM(nn.Module):
    """Seed 004 K.9's attention-free shared-MLP LM; `forward(idx, targets=None)` -> logits or loss."""

    def __init__(self, config: SharedMLPConfig):
        super().__init__()
        self.config = config
        d = config.n_embd
        self.wte = nn.Embedding(config.vocab_size, d)
        self.wpe = nn.Embedding(config.sequence_len, d)
        self.norms = nn.ModuleList(RMSNorm(d, config.norm_eps) for _ in range(config.n_layer))
        self.up = nn.Linear(d, config.ff_hidden, bias=False)  # one Parameter, used at every depth
        self.down = nn.Linear(config.ff_hidden, d, bias=False)
        self.norm = RMSNorm(d, config.norm_eps)
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self._copies: dict[str, list[torch.Tensor]] | None = None  # set only inside split_uses()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, init_std) for every Linear and Embedding, gains 1 (also materialises a meta model
        after `to_empty`)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    def num_scaling_params(self) -> dict[str, int]:
        """The lab's breakdown (tied_table 0: the model is untied; its tables count as matrices)."""
        vectors = sum(p.numel() for p in self.parameters() if p.ndim <= 1)
        total = self.num_parameters()
        return {"tied_table": 0, "matrices": total - vectors, "vectors": vectors, "total": total}

    def estimate_flops(self) -> int:
        """FLOPs per token, forward + backward: 6 x the matmul parameters a token goes through:
        the shared up/down once per depth (each use is a matmul) and the head; the wte/wpe
        lookups are no matmuls; no attention term (the model has none)."""
        c = self.config
        return 6 * (c.n_layer * 2 * c.n_embd * c.ff_hidden + c.vocab_size * c.n_embd)

    @contextmanager
    def split_uses(self) -> Iterator[dict[str, list[torch.Tensor]]]:
        """Per-depth differentiable copies of the shared weights (K.9's "L equal-valued
        differentiable copies"): {"up": [W_up^(1..L)], "down": [W_down^(1..L)]}. The copies are
        taken at entry, so run the forward passes of interest inside one `with` block."""
        if self._copies is not None:
            raise RuntimeError("split_uses() is already active")
        L = self.config.n_layer
        self._copies = {name: [getattr(self, name).weight.clone() for _ in range(L)] for name in SHARED}
        try:
            yield self._copies
        finally:
            self._copies = None

    def _mlp(self, h: torch.Tensor, depth: int) -> torch.Tensor:
        if self._copies is None:
            return self.down(scaled_relu_sq(self.up(h)))
        return F.linear(scaled_relu_sq(F.linear(h, self._copies["up"][depth])), self._copies["down"][depth])

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean") -> torch.Tensor:
        """Logits [B, T, V] without targets; with targets the cross-entropy (ignore_index -1)."""
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        T = idx.size(1)
        if T > self.config.sequence_len:
            raise ValueError(f"sequence length {T} exceeds sequence_len={self.config.sequence_len}")
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for depth, norm in enumerate(self.norms):
            x = x + self._mlp(norm(x), depth)
        logits = self.lm_head(self.norm(x))
        return logits if targets is None else lm_loss(logits, targets, reduction)
