"""Right-projected Neumann-Gram vocabulary whitening of AdamW table gradients (seed 002 §2.1 (Tier 1)).

Seed 002 (Family B, "Right-Projected Neumann-Gram Vocabulary Whitening (tau_Neu = 80)"; credited
there to its ref [11]): inside fused AdamW, on the 2-D token/value tables (wte, lm_head, every
value_embeds table), for a gradient G in R^{V x d} (rows = tokens):

    g_bar  = (1/V) 1^T G                      (the mean row)
    U_perp = G - 1 g_bar^T                    (mean-centred gradient)
    C      = U_perp^T U_perp                  (d x d Gram)
    U_w    = U_perp - 1/2 beta_t U_perp C / (||C||_F + 1e-30),   beta_t = min(t / 80, 1)^2

a first-order Neumann (binomial) approximation of U_perp (I + beta_t C_hat)^{-1/2}, C_hat =
C / (||C||_F + 1e-30). C_hat is PSD with ||C_hat||_2 <= 1, so the right factor's eigenvalues lie
in [1 - beta_t/2, 1] (it shrinks the dominant, common-mode directions of the table's update most).
Computed in fp32 (the paper: "executing Neumann-Gram in FP32 on the fly inside adamw_step_fused").

Choices where the paper is silent (seed 002 §2.1 gives only the U_w formula), all options:
- where: the whitened tensor replaces the gradient *before* the moment updates
  (grad <- U_w [+ 1 g_bar^T]; then the unchanged `adamw_step`). p.grad itself is not modified.
- mean add-back (`whiten.mean_addback`, default False = the paper's formula read literally: the
  update is U_w, the common-mode row is dropped); True adds 1 g_bar^T back.
- step index: the one convention of muonlab.optim.homotopy, t = the parameter's completed AdamW
  updates (`state["step"]` before its increment, the counter of Adam's bias correction, the only
  one a fused AdamW step has) + `whiten.first_t` (1: t = 1 at the first update; 0: beta_0 = 0).
  No extra state: the counter round-trips through state_dict with the Adam moments.
- `whiten.tau` (80.0; 0 means beta = 1 from the first step, like prepolar.homotopy_alpha).
- `whiten.terms` (1 = the paper): K > 1 keeps K terms of the binomial series
  (I + beta C_hat)^{-1/2} = sum_k binom(-1/2, k) (beta C_hat)^k, converging to the exact inverse
  square root as K grows (conditionally at beta ||C_hat||_2 = 1). An extension, not in the paper.
- dtype: the result stays fp32; the AdamW step casts it once, to fp32 moments under master32 (seed
  002 §4.3 item 2: "executing Neumann-Gram in FP32 on the fly", its FP32 output fed to the FP32 states,
  never rounded to bf16 in between) or to the table's dtype without master32 (bf16 moments).
- rows = dim 0: wte / value_embeds (nn.Embedding [V, d]) and lm_head (nn.Linear weight [V, d])
  all have the vocabulary along dim 0. Every param of a whitened group must be 2-D.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Literal

import torch

from muonlab.optim.extensions import GroupSection, group_key
from muonlab.optim.homotopy import HOMOTOPY_FIRST_T, homotopy_alpha, homotopy_t
from muonlab.settings import METHOD_OFF, NON_NEGATIVE, POSITIVE_COUNT, MethodInfo, setting

WHITENS = ("neumann",)



def binomial_coefficients(terms: int) -> list[float]:
    """binom(-1/2, k) for k = 0..terms: 1, -1/2, 3/8, -5/16, ..."""
    coefs = [1.0]
    for k in range(1, terms + 1):
        coefs.append(coefs[-1] * (-0.5 - (k - 1)) / k)
    return coefs


def neumann_whiten(G: torch.Tensor, beta, terms: int = 1, mean_addback: bool = False,
                   eps: float = 1e-30) -> torch.Tensor:
    """Right-projected Neumann-Gram whitening of a 2-D table gradient G [V, d] (rows = tokens).

    Returns a new fp32 tensor (G is not modified). `beta` is a float (beta_t = min(t/tau, 1)^2).
    With terms = 1: U_perp - 1/2 beta U_perp C / (||C||_F + eps), C = U_perp^T U_perp.
    """
    if G.dim() != 2:
        raise ValueError(f"neumann_whiten needs a 2-D table, got shape {tuple(G.shape)}")
    X = G.float()
    g_bar = X.mean(dim=0, keepdim=True)
    U = X - g_bar
    C = U.T @ U
    scale = float(beta) / (torch.linalg.matrix_norm(C) + eps)  # 0-D fp32 tensor: no host sync
    coefs = binomial_coefficients(terms)
    if terms == 1:  # the paper's expression, in its order of operations
        out = U - (scale * 0.5) * (U @ C)
    else:
        out, Y = U.clone(), U
        for c in coefs[1:]:
            Y = (Y @ C) * scale  # U (beta C_hat)^k
            out.add_(Y, alpha=c)
    if mean_addback:
        out.add_(g_bar)
    return out


@dataclass(frozen=True)
class NeumannWhitening(GroupSection):
    """Seed 002 §2.1 (Tier 1): right-projected Neumann-Gram whitening of wte, lm_head and value-embedding
    updates. The run config's `optim.whiten` section and the adamw groups' `whiten.*` keys."""

    NAMESPACE: ClassVar[str] = "whiten"

    METHOD: ClassVar[MethodInfo] = MethodInfo('neumann_whitening', 'seed 002 §2.1 (Tier 1)', __name__, ('tests/optim/test_whitening.py',), 'kind', None)

    kind: Literal[None, "neumann"] = setting(None, "none | neumann", flag="whiten")
    tau: float = setting(80.0, "homotopy horizon of beta_t", flag="whiten-tau", range=NON_NEGATIVE)
    terms: int = setting(1, "series terms (1 = the paper's first-order form)", flag="whiten-terms",
                         range=POSITIVE_COUNT)
    mean_addback: bool = setting(False, "add the mean row back (the paper is silent; off = its formula)",
                                 flag="whiten-mean-addback")

    def inactive(self) -> dict[str, str]:
        return {"tau": METHOD_OFF, "terms": METHOD_OFF, "mean_addback": METHOD_OFF} if self.kind is None else {}

    def param_group_keys(self, optim) -> dict[str, dict]:
        """The vocabulary tables' AdamW groups' keys (the homotopy's first t is the optimizer's)."""
        if self.kind is None:
            return {}
        keys = {**self.group_values(), FIRST_T: optim.homotopy_first_t}
        return {"lm_head": keys, "wte": dict(keys), "value_embeds": dict(keys)}


# every option an adamw group may carry, with its default (absent == default): the settings' keys,
# the homotopy's first t (the run's optim.homotopy_first_t) and the Gram norm's epsilon
KIND, TAU, TERMS, MEAN_ADDBACK = (NeumannWhitening.group_keys()[f] for f in ("kind", "tau", "terms", "mean_addback"))
FIRST_T, EPS = group_key(NeumannWhitening.NAMESPACE, "first_t"), group_key(NeumannWhitening.NAMESPACE, "eps")
WHITEN_DEFAULTS = {**NeumannWhitening.group_defaults(), FIRST_T: HOMOTOPY_FIRST_T, EPS: 1e-30}


def options(group: dict) -> dict:
    return {k: group.get(k, v) for k, v in WHITEN_DEFAULTS.items()}


def validate_group(group: dict) -> None:
    """Raise ValueError naming the first bad whitening option of an adamw group."""
    opt = options(group)
    if opt[KIND] is None:
        return
    if opt[TAU] < 0 or int(opt[TERMS]) < 1:
        raise ValueError(f"{TAU} must be >= 0 and {TERMS} >= 1")
    bad = [tuple(p.shape) for p in group["params"] if p.dim() != 2]
    if bad:
        raise ValueError(f"{KIND}={opt[KIND]!r} acts on 2-D tables; the group has shapes {bad}")


def whiten_grad(grad: torch.Tensor, step: int, group: dict) -> torch.Tensor:
    """The gradient the AdamW step should use: `grad` itself when the group has no whitening,
    else the whitened full-table gradient (fp32). `step` = state["step"] after
    its increment (1 at the first update)."""
    opt = options(group)
    if opt[KIND] is None:
        return grad
    return _whitened(grad, step, opt)


def _whitened(grad: torch.Tensor, step: int, opt: dict) -> torch.Tensor:
    beta = homotopy_alpha(homotopy_t(step - 1, int(opt[FIRST_T])), float(opt[TAU]))
    out = neumann_whiten(grad, beta, terms=int(opt[TERMS]), mean_addback=bool(opt[MEAN_ADDBACK]), eps=float(opt[EPS]))
    return out  # fp32: the AdamW step casts it to its state's precision


@dataclass(frozen=True)
class AdamWTransform:
    """A gradient transform of an adamw group, on when `group[key] == "neumann"`.

    `apply(grad, step, group)` returns the gradient the AdamW step uses (never modifies grad), in
    any float dtype: the step casts it once, to its state's precision (fp32 under master32, so an
    fp32 transform reaches fp32 moments unrounded) or else to the param's dtype;
    `step` is the param's AdamW step counter after its increment (1 at the first update).
    `whole_tensor`: it needs the whole averaged gradient (DistMuonAdamW all-reduces it instead
    of reduce-scattering, applies it on every rank, then keeps this rank's rows).
    """

    key: str
    options: dict
    apply: Callable[[torch.Tensor, int, dict], torch.Tensor]
    validate: Callable[[dict], None]
    whole_tensor: bool


# the whole averaged table: the Gram and the mean row are over every row
NEUMANN = AdamWTransform(
    key=KIND, options={k: v for k, v in WHITEN_DEFAULTS.items() if k != KIND},
    apply=lambda grad, step, group: _whitened(grad, step, options(group)),
    validate=validate_group, whole_tensor=True)


def adamw_transform(group: dict) -> AdamWTransform | None:
    """The transform an adamw group turns on (None: the plain AdamW gradient)."""
    return NEUMANN if group.get(NEUMANN.key) == "neumann" else None


def validate_adamw_group(group: dict) -> None:
    """An adamw group's whitening keys; ValueError naming the first bad one."""
    if group.get(NEUMANN.key) is not None and group[NEUMANN.key] != "neumann":
        raise ValueError(f"{NEUMANN.key} must be None or one of ('neumann',), got {group[NEUMANN.key]!r}")
    if adamw_transform(group) is not None:
        NEUMANN.validate(group)
