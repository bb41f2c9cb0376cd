"""Zeta: coordinate whitening of the Nesterov tensor before Polar Express (seed 000 §3.3).

    V_t = b2 V_{t-1} + (1-b2) g_t^2       on the raw gradient (before the in-place Nesterov step)
    G  <- G / (sqrt(V_t / (1 - b2^t)) + eps)

t = 1 at the first update (paper: "Step 0 (t=1)"), b2 = `beta2` (0.99), eps = `eps` (1e-8), the
muon group keys `prepolar.beta2` and `prepolar.eps`, set in Python only (a run keeps the paper's).
State: `zeta_buffer` [N, m, n] fp32, 4 bytes per matrix element (the whole stack's layout even
when a name scope selects some of its matrices). Not reproduced (as in the paper):
Zeta's scalar step-size rule and LR warmup.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from muonlab.optim.extensions import PrePolar, fixed, register_prepolar


def zeta_update(V: torch.Tensor, raw_grads: torch.Tensor, beta2: float) -> None:
    """V <- beta2 V + (1 - beta2) g^2 on the raw gradients (fp32 V)."""
    V.lerp_(raw_grads.float().square(), 1 - beta2)


def zeta_whiten(G: torch.Tensor, V: torch.Tensor, bias_t, eps: float = 1e-8) -> torch.Tensor:
    """G / (sqrt(V / (1 - beta2^t)) + eps); `bias_t` = 1 - beta2^t (float or 0-D tensor)."""
    return G.div_((V / bias_t).sqrt_().add_(eps))


@dataclass(frozen=True)
class Zeta(PrePolar):
    STACKED_STATE = ("zeta_buffer",)

    beta2: float = fixed(0.99, "seed 000 §3.3's second-moment decay, in Python only")
    eps: float = fixed(1e-8, "in Python only")

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.beta2 < 1:
            raise ValueError(f"prepolar.beta2 must be in [0, 1), got {self.beta2}")

    def step_inputs(self, state, t, stack_shape, device) -> dict:
        if "zeta_buffer" not in state:
            state["zeta_buffer"] = torch.zeros(stack_shape, dtype=torch.float32, device=device)
        return {"zeta_buffer": state["zeta_buffer"],
                "bias_t": torch.tensor(1 - self.beta2 ** (t + 1), dtype=torch.float32)}

    def before_momentum(self, raw_grads, inputs):
        zeta_update(inputs["zeta_buffer"], raw_grads, self.beta2)

    def condition(self, G, inputs, ctx):
        return zeta_whiten(G, inputs["zeta_buffer"], inputs["bias_t"], self.eps)


register_prepolar("zeta", Zeta, paper="seed 000 §3.3", tests=("tests/optim/test_prepolar.py", "tests/optim/test_prepolar_arms.py"),
                  summary="coordinate whitening by an EMA of the squared raw gradient")
