"""Step-0 precision/epsilon audit of seed paper 002 (spec-002 §2.4, mechanism §1.7-1.8, numbers §4.3).

At step 0 every c_proj weight and OE table is zero, so each block is the identity in forward and
backward and the readout is x_out = alpha_0 x0, alpha_0 the resid/x0-lambda product-sum (1 + 0.1 L).
Every x0/wte/out-lambda gradient then equals dL/dalpha = sum_t <dL/dN_t, dN_eps(alpha x0_t)/dalpha>,
with dN_eps/dalpha = eps x0 / (alpha^2 q + eps)^(3/2): exactly 0 at eps = 0 (RMSNorm scale
invariance), linear in a small eps, while low-precision rounding makes it ~1e-7..1e-6, and the
AdamW step-0 update -lr g / (|g| + 1e-10) (lr 0.5, t = 1) turns whichever value it is into ~-+0.5.

Choices:
- `norm_eps(eps)` swaps the module-level `muonlab.model.gpt.norm` (every RMSNorm the model calls:
  embedding, pre-block, QK, final, sepden anchor) for F.rms_norm(..., eps=eps) and restores it on
  exit, exceptions included; the model's own forward runs unchanged (gpt.py is not edited).
- float64 = a `.double()` deep copy (bf16 embedding values cast exactly) whose `_logits` skips the
  model's `.float()` cast, so logits, soft-cap and CE stay float64; shden's routing anchor (fp32
  inside the model: alone ~1e-12 at eps = 0) likewise, keeping its own `routing_eps` (a per-token
  multiple of x0, so it cannot break the invariance). `dL_dalpha` re-evaluates §2.4's reduced
  loss CE(softcap(lm_head(N_eps(alpha x0)))) by autograd on alpha, an independent check.
- Low precision = the init model as trained (fp32 params, bf16 embeddings, default eps: 2^-23
  for fp32 and bf16 inputs) under CPU bf16 autocast when available (the paper: compiled bf16 on
  CUDA; no torch.compile here); also the fp32 path (`.float()`, as training at precision=fp32).
  Ratio, difference and displacement compare it with float64 per eps (2^-23 = the matched eps).
- One seeded batch of `batch` random tokens, not the paper's 4 ClimbMix micro-batches; the init
  uses torch.manual_seed(seed) in a forked RNG (the global RNG is untouched).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from muonlab.model import gpt as gpt_module
from muonlab.model import find_variant, gpt_config
from muonlab.model.gpt import GPT, LOGIT_SOFTCAP

FAMILIES = ("resid_lambdas", "x0_lambdas", "wte_lambdas", "out_lambdas")
SCALAR_LR, ADAM_EPS = 0.5, 1e-10


@contextlib.contextmanager
def norm_eps(eps: float) -> Iterator[None]:
    """Within the block, every `muonlab.model.gpt.norm` call uses RMSNorm epsilon `eps`."""
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    original = gpt_module.norm

    def norm(x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.size(-1),), eps=eps)

    gpt_module.norm = norm
    try:
        yield
    finally:
        gpt_module.norm = original


def build_step0(n_layer: int = 6, n_embd: int = 128, head_dim: int = 32, seq_len: int = 64, batch: int = 4,
                vocab: int = 256, oe_m: int = 101, routing: str = "sepden", routing_out: bool = True,
                seed: int = 0) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    """The step-0 model (`init_weights`, fp32 with bf16 embeddings) and one (inputs, targets) batch."""
    if n_embd % head_dim:
        raise ValueError(f"n_embd={n_embd} is not a multiple of head_dim={head_dim}")
    n_head = n_embd // head_dim
    cfg = gpt_config(sequence_len=seq_len, vocab_size=vocab, n_layer=n_layer, n_head=n_head, n_kv_head=n_head,
                    n_embd=n_embd, attn_backend="sdpa", oe_m=oe_m, routing=routing, routing_out=routing_out)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(cfg)
        model.init_weights()
    tokens = torch.randint(vocab, (batch, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    return model, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def float64_model(model: GPT) -> GPT:
    """A float64 copy whose logits, soft-cap, loss (and shden anchor) also stay float64."""
    m64 = copy.deepcopy(model).double()
    m64._logits = lambda x: LOGIT_SOFTCAP * torch.tanh(m64.lm_head(x) / LOGIT_SOFTCAP)  # type: ignore[method-assign]
    routing = find_variant(m64, "routing")
    if routing is not None and routing.cfg.kind == "shden":  # its anchor computes inv_rms and w * inv_rms in fp32
        eps = routing.cfg.eps
        routing.anchor = lambda w, e: w * torch.rsqrt(  # type: ignore[method-assign]
            (w if e is None else w + e).square().mean(-1, keepdim=True) + eps)
    return m64


def family_grads(model: GPT, idx: torch.Tensor, targets: torch.Tensor,
                 autocast: bool = False) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and .grad of the scalar families present and of lm_head (float64 copies)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
        loss = model(idx, targets)
    loss.backward()
    params = {n: getattr(model, n) for n in FAMILIES if hasattr(model, n)} | {"lm_head": model.lm_head.weight}
    return float(loss.detach()), {n: p.grad.detach().double().clone() for n, p in params.items()}


def reduced_dl_dalpha(m64: GPT, idx: torch.Tensor, targets: torch.Tensor, alpha0: float) -> float:
    """§2.4's reduced loss L(alpha) = CE(softcap(lm_head(N(alpha x0)))), d/dalpha at alpha0 (current norm)."""
    with torch.no_grad():
        w = m64.transformer.wte(idx)
        x0 = gpt_module.norm(w + m64.oe(idx) if hasattr(m64, "oe") else w)
    alpha = torch.tensor(alpha0, dtype=torch.float64, requires_grad=True)
    logits = m64._logits(gpt_module.norm(alpha * x0))
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
    (g,) = torch.autograd.grad(loss, alpha)
    return float(g)


def readout_alpha(model: GPT) -> float:
    """alpha_0: x = x0; x <- r_i x + l_i x0 per layer; + out_lambdas[0] (sublayers and anchors off)."""
    a = 1.0
    for r, lam in zip(model.resid_lambdas.tolist(), model.x0_lambdas.tolist()):
        a = r * a + lam
    return a + (float(model.out_lambdas[0].detach()) if hasattr(model, "out_lambdas") else 0.0)


def eps_label(eps: float) -> str:
    return "2^-23" if eps == 2.0**-23 else f"{eps:g}"


def adamw_step0(g: float, lr: float = SCALAR_LR) -> float:
    """AdamW's first update at t = 1 (bias-corrected m/sqrt(v) = g/|g|): -lr g / (|g| + eps)."""
    return -lr * g / (abs(g) + ADAM_EPS)


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 else (math.copysign(math.inf, a) if a != 0 else math.nan)


def run_step0_audit(n_layer: int = 6, n_embd: int = 128, head_dim: int = 32, seq_len: int = 64, batch: int = 4,
                    vocab: int = 256, oe_m: int = 101, routing: str = "sepden", routing_out: bool = True,
                    seed: int = 0, eps_values: tuple[float, ...] = (0.0, 2**-23, 1e-6)) -> dict[str, Any]:
    """float64 gradients on the residual scalars per RMSNorm eps vs the low-precision gradient."""
    args = dict(n_layer=n_layer, n_embd=n_embd, head_dim=head_dim, seq_len=seq_len, batch=batch, vocab=vocab,
                oe_m=oe_m, routing=routing, routing_out=routing_out, seed=seed)
    model, idx, targets = build_step0(**args)  # type: ignore[arg-type]
    labels = [eps_label(e) for e in eps_values]
    alpha0 = readout_alpha(model)
    m64 = float64_model(model)
    loss64, g64, dl_da, lm_scale = {}, {}, {}, {}
    for eps, lab in zip(eps_values, labels):
        with norm_eps(eps):
            loss64[lab], g64[lab] = family_grads(m64, idx, targets)
            dl_da[lab] = reduced_dl_dalpha(m64, idx, targets, alpha0)
        lm_scale[lab] = float(g64[lab].pop("lm_head").abs().max())
    modes = (["bf16_autocast"] if torch.amp.is_autocast_available("cpu") else []) + ["fp32"]
    loss_lp, g_lp = {}, {}
    for mode in modes:
        lp_model = copy.deepcopy(model).float() if mode == "fp32" else copy.deepcopy(model)
        loss_lp[mode], g_lp[mode] = family_grads(lp_model, idx, targets, autocast=mode != "fp32")
        g_lp[mode].pop("lm_head")
    low = modes[0]
    families: dict[str, Any] = {}
    for name in g64[labels[0]]:
        f64 = {lab: g64[lab][name].tolist() for lab in labels}
        lp = g_lp[low][name].tolist()
        families[name] = {
            "float64": f64, "low_precision": lp, **{m: g_lp[m][name].tolist() for m in modes},
            "ratio": {lab: [_ratio(a, b) for a, b in zip(lp, f64[lab])] for lab in labels},
            "diff": {lab: [a - b for a, b in zip(lp, f64[lab])] for lab in labels},
            "displacement": {"float64": {lab: [adamw_step0(g) for g in f64[lab]] for lab in labels},
                             "low_precision": [adamw_step0(g) for g in lp]},
        }
    return {"config": args, "eps_values": list(eps_values), "eps_labels": labels, "alpha0": alpha0,
            "low_precision_mode": low, "loss": {"float64": loss64, **loss_lp}, "dL_dalpha": dl_da,
            "lm_head_grad_max": lm_scale, "families": families}


def format_step0_table(result: dict[str, Any]) -> str:
    """A text table: one row per scalar (family[i]); float64 per eps, low precision, ratio, step-0 jump."""
    labels, low = result["eps_labels"], result["low_precision_mode"]
    ref = "2^-23" if "2^-23" in labels else labels[-1]
    c = result["config"]
    head = [f"step-0 precision/epsilon audit (seed 002 §2.4): L={c['n_layer']} d={c['n_embd']} T={c['seq_len']} "
            f"B={c['batch']} V={c['vocab']} oe_m={c['oe_m']} routing={c['routing']} seed={c['seed']}",
            f"alpha0 = {result['alpha0']:.4f}; reduced dL/dalpha (float64): "
            + ", ".join(f"eps={lab}: {result['dL_dalpha'][lab]:+.3e}" for lab in labels),
            "max |dL/d lm_head| (float64): " + ", ".join(f"{result['lm_head_grad_max'][lab]:.3e}" for lab in labels),
            f"low precision = {low}; ratio and dtheta0 compare with float64 at eps={ref}; "
            f"dtheta0 = -{SCALAR_LR} g/(|g|+{ADAM_EPS:g})"]
    cols = ["param"] + [f"f64 eps={lab}" for lab in labels] + [low] + (["fp32"] if low != "fp32" else []) \
        + [f"{low}/f64", "dtheta0 f64", f"dtheta0 {low}"]
    rows = [cols]
    for name, fam in result["families"].items():
        for i, lp in enumerate(fam["low_precision"]):
            row = [f"{name}[{i}]"] + [f"{fam['float64'][lab][i]:+.3e}" for lab in labels] + [f"{lp:+.3e}"]
            row += [f"{fam['fp32'][i]:+.3e}"] if low != "fp32" else []
            row += [f"{fam['ratio'][ref][i]:+.2e}", f"{fam['displacement']['float64'][ref][i]:+.4f}",
                    f"{fam['displacement']['low_precision'][i]:+.4f}"]
            rows.append(row)
    widths = [max(len(r[j]) for r in rows) for j in range(len(cols))]
    lines = ["  ".join(v.rjust(w) if j else v.ljust(w) for j, (v, w) in enumerate(zip(r, widths))) for r in rows]
    return "\n".join(head + lines)
