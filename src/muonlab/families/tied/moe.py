"""Top-k routed mixture of experts for the tied NanoGPT-MoE of seed 004 (AF-Muon).

Seed 004, App. J.6: "we replace each dense MLP with a top-1 router
over four expert MLPs. Each expert uses the same hidden expansion as the dense NanoGPT
MLP", with "router auxiliary load-balancing coefficient 0.01" and "router z-loss
coefficient zero". The matrix partition puts "attention, expert, and router matrices"
on Muon in every arm, so the router and every expert are `nn.Linear` modules here.

Routing, as the released code does it (seed 004 App. J.6 gives only top-1 and the 0.01 load-balancing coefficient):
  - router probabilities p = softmax(W_r x) in fp32 (or fp64 for an fp64 model), W_r = `nn.Linear(d, E, bias=False)`;
  - each token goes to its top-k experts; the selected probabilities are renormalised to
    sum to 1, so with top-1 the gate is p/p = 1 and **the LM loss sends no gradient to the
    router**: it learns only through the load-balancing loss. For top-1 we use the exact
    constant 1 (the value and the derivative of p/p), so that gradient is exactly zero;
  - Switch-style load-balancing loss per layer, `coef * E * sum_e importance_e * load_e`,
    with importance_e = mean over tokens of p_e and load_e = fraction of tokens whose
    first choice is e (no gradient flows through load_e). The model sums it over layers.
  - An expert that receives no token in a batch is not called, so its weights get no
    gradient (`.grad` stays None: AF-Muon then skips it, no momentum update, no decay).

Dispatch. Eagerly, each expert runs on the tokens that chose it (an index_select per expert).
Those token counts change with every batch, and `torch.compile(dynamic=False)` would compile a
graph per count (the recompile limit within two steps), so under compile every expert runs on
every token, weighted by its gate where the token chose it and by 0 elsewhere: one static graph,
the same sum (a token's other experts add exact zeros, in the same expert order), at E times the
expert FLOPs (E = 4 in seed 004). Its unchosen experts' weights then get exact-zero gradients;
`UnroutedExpertGrads`, a step hook, puts an expert that no token of a step chose back to
`.grad` None before the optimizer step, as eagerly.

The experts are built by a caller-supplied factory so that this module needs no
knowledge of the MLP (the dense ScaledReLU^2 MLP lives in `muonlab.families.tied.model`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Upcast bf16/fp16 to fp32, keep fp32/fp64 (router softmax and losses in >= fp32)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def load_balancing_loss(probs: torch.Tensor, top1: torch.Tensor, n_experts: int,
                        coef: float) -> torch.Tensor:
    """Seed 004 App. J.6 router auxiliary loss: `coef * E * sum_e mean_prob_e * top1_frac_e`.

    probs: [N, E] router softmax (gradient flows through it); top1: [N] first-choice ids.
    Equals `coef` exactly when routing is uniform in both probability and load.
    """
    importance = at_least_fp32(probs).mean(dim=0)
    load = F.one_hot(top1, num_classes=n_experts).to(importance.dtype).mean(dim=0)
    return coef * n_experts * torch.sum(importance * load)


def router_stats(counts: torch.Tensor) -> dict[str, float]:
    """Seed 004 Table 19 router diagnostics from per-expert token counts [E].

    Normalised entropy of the load (1 = uniform), max expert fraction, coefficient of
    variation of the load (population std / mean) and the number of unused experts.
    """
    counts = counts.float()
    n_experts = counts.numel()
    frac = counts / counts.sum().clamp_min(1.0)
    p = frac.clamp_min(1e-12)
    entropy = -(p * p.log()).sum() / math.log(n_experts) if n_experts > 1 else torch.tensor(1.0)
    return {
        "router_entropy": float(entropy),
        "router_max_frac": float(frac.max()),
        "router_cv": float(frac.std(unbiased=False) / frac.mean().clamp_min(1e-12)),
        "router_unused_experts": float((counts == 0).sum()),
    }


class TopKMoE(nn.Module):
    """`n_experts` expert MLPs behind a bias-free linear router with top-k routing.

    forward(x [..., d]) -> (y [..., d], aux scalar). `last_counts` keeps the first-choice
    token count per expert of the latest call (detached, for `router_stats`), `last_routed` the
    count over all k choices (for `UnroutedExpertGrads`).
    """

    def __init__(self, n_embd: int, n_experts: int, top_k: int, aux_loss_coef: float,
                 make_expert: Callable[[], nn.Module]):
        super().__init__()
        if n_experts < 1:
            raise ValueError(f"n_experts must be >= 1, got {n_experts}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        if aux_loss_coef < 0:
            raise ValueError(f"aux_loss_coef must be >= 0, got {aux_loss_coef}")
        self.n_experts = n_experts
        self.top_k = top_k
        self.aux_loss_coef = aux_loss_coef
        self.router = nn.Linear(n_embd, n_experts, bias=False)
        self.experts = nn.ModuleList([make_expert() for _ in range(n_experts)])
        self.last_counts: torch.Tensor | None = None
        self.last_routed: torch.Tensor | None = None

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (probs [N, E] in >= fp32, top_idx [N, k], gates [N, k]) for tokens flat [N, d]."""
        probs = torch.softmax(at_least_fp32(self.router(flat)), dim=-1)
        top_p, top_idx = torch.topk(probs, k=self.top_k, dim=-1)
        if self.top_k == 1:
            gates = torch.ones_like(top_p)  # p/p: value 1, derivative 0 (seed 004 ref)
        else:
            gates = top_p / top_p.sum(dim=-1, keepdim=True)
        return probs, top_idx, gates

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.reshape(-1, x.size(-1))
        probs, top_idx, gates = self.route(flat)
        # chosen while tracing: a compiled graph holds the dense dispatch only (see the module doc)
        dispatch = self._dispatch_dense if torch.compiler.is_compiling() else self._dispatch_sparse
        out = dispatch(flat, top_idx, gates)
        chose = (top_idx.detach().unsqueeze(-1) == torch.arange(self.n_experts, device=top_idx.device))
        self.last_counts = chose[:, 0].sum(dim=0)  # first choices per expert
        self.last_routed = chose.sum(dim=(0, 1))  # tokens per expert over all k choices
        aux = load_balancing_loss(probs, top_idx[:, 0], self.n_experts, self.aux_loss_coef)
        return out.view_as(x), aux

    def _dispatch_sparse(self, flat: torch.Tensor, top_idx: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """Each expert on the tokens that chose it; an expert no token chose is not called."""
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (top_idx == e).nonzero(as_tuple=True)
            if token.numel() == 0:
                continue
            y = expert(flat.index_select(0, token)) * gates[token, slot].unsqueeze(-1)
            out.index_add_(0, token, y.to(out.dtype))
        return out

    def _dispatch_dense(self, flat: torch.Tensor, top_idx: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """Every expert on every token, times the token's gate for it (0 where it did not choose
        it): the sparse dispatch's sum with shapes that do not depend on the routing."""
        chose = top_idx.unsqueeze(-1) == torch.arange(self.n_experts, device=top_idx.device)  # [N, k, E]
        weight = (chose * gates.unsqueeze(-1)).sum(dim=1)  # [N, E]: each token's gate per expert
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            out = out + (expert(flat) * weight[:, e : e + 1]).to(out.dtype)
        return out


class RouterCounts:
    """First-choice token counts per expert of every TopKMoE layer, summed over the forwards run while
    the context is open (an evaluation pass), and Table 19's router statistics from them."""

    def __init__(self, model: nn.Module):
        self.layers = [m for m in model.modules() if isinstance(m, TopKMoE)]
        self.counts: torch.Tensor | None = None
        self._handles: list = []

    def __enter__(self) -> RouterCounts:
        if self.layers:  # zeros on every rank, so a rank with no batch still joins the reduction
            self.counts = torch.zeros(len(self.layers), self.layers[0].n_experts, dtype=torch.float64,
                                      device=self.layers[0].router.weight.device)
        self._handles = [layer.register_forward_hook(self._add) for layer in self.layers]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()

    def _add(self, layer: TopKMoE, args, out) -> None:
        self.counts[self.layers.index(layer)] += layer.last_counts.double()

    def stats(self, reduce=None) -> dict[str, float]:
        """router_stats per layer over the summed counts (summed across ranks by `reduce`): entropy, max
        fraction and CV averaged over the layers, unused experts summed over them (our choice: the
        paper's Table 19 gives one value per run)."""
        if not self.layers:
            return {}
        if reduce is not None:
            reduce(self.counts)
        per_layer = [router_stats(c) for c in self.counts]
        out = {k: sum(s[k] for s in per_layer) / len(per_layer) for k in per_layer[0]}
        out["router_unused_experts"] = sum(s["router_unused_experts"] for s in per_layer)
        return out


class UnroutedExpertGrads:
    """Step hook: before the optimizer step, `.grad` None for each expert that no token of the
    step's micro-batches chose (exact zeros from the dense dispatch under compile; None already
    eagerly), so AF-Muon skips it as seed 004's reference does. Reads each layer's `last_routed`
    after every micro-batch (before the next one, and before the step): one sync per step."""

    def __init__(self, layers: list[TopKMoE]):
        self.layers = layers
        self._routed: torch.Tensor | None = None
        self._in_step = False

    def _collect(self) -> None:
        routed = torch.stack([layer.last_routed for layer in self.layers])
        self._routed = routed if self._routed is None else self._routed + routed

    def before_micro_step(self, x) -> None:
        if self._in_step:  # the previous micro-batch of this step has run
            self._collect()
        self._in_step = True

    def before_step(self, step: int, optimizer) -> None:
        self._collect()
        for layer, counts in zip(self.layers, self._routed.tolist()):
            for expert, n in zip(layer.experts, counts):
                if n == 0:
                    for p in expert.parameters():
                        p.grad = None
        self._routed, self._in_step = None, False
