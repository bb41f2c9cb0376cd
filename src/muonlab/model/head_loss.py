"""Soft-capped cross-entropy of the LM head, fused and chunked over rows.

The reference computes z = c * tanh(x W^T / c) for all N = B*T rows in fp32, then
cross-entropy, and autograd keeps the [N, V] logits and builds their [N, V] gradient in
about a dozen passes over memory. Here each chunk of rows computes its logits, its loss and,
when a gradient is needed, its gradient with respect to x and W at once, while the chunk is
in cache; only x's gradient [N, d] and W's gradient [V, d] outlive it, scaled in backward by
the incoming (scalar) gradient (the fused linear cross-entropy of Liger-Kernel / Apple's
cut-cross-entropy, here with upstream's soft cap).

Numerics follow the reference under autocast: the product is formed in the autocast dtype
and widened to fp32, the soft cap and softmax are fp32, the logit gradient is rounded to the
product dtype before the two gradient products, as autograd does through `.float()`. The
row sums of W's gradient are taken per chunk, so results equal the reference up to rounding
(not bitwise); `reference_softcapped_cross_entropy` is the unfused form, kept for tests and
for `reduction='none'` with a gradient (W's gradient of per-row weights is not a scaling).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def default_chunk_rows(n_rows: int, vocab: int, width: int) -> int:
    """Rows per chunk such that a chunk's logits hold about as many numbers as x [N, d]:
    ceil(V / d) chunks (Liger-Kernel's rule), each a multiple of 64 rows. Under torch.compile
    the loop is unrolled, so the chunk count, not the row count, sets the graph's size."""
    chunks = max(1, -(-vocab // width))
    rows = -(-n_rows // chunks)
    return max(64, -(-rows // 64) * 64)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half precision and fp32 (upstream's `.float()`); float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(_accumulation_dtype(t.dtype))


def reference_softcapped_cross_entropy(x, weight, targets, softcap: float, reduction: str = "mean"):
    """The unfused reference: logits for every row, then F.cross_entropy (ignore_index -1)."""
    logits = _wide(F.linear(x, weight))
    logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction=reduction)


def _chunk_logits(x_c, w_c, softcap):
    """(z, t): soft-capped logits (at least fp32) of one chunk and t = tanh(logits / c)."""
    t = torch.tanh(_wide(F.linear(x_c, w_c)) / softcap)
    return softcap * t, t


def _chunk_losses(z, y):
    """(per-row cross-entropy of a chunk, 0 where y == -1; the valid mask; logsumexp per row)."""
    valid = y != -1
    picked = z.gather(1, y.clamp_min(0).unsqueeze(1)).squeeze(1)
    lse = torch.logsumexp(z, dim=1)
    return torch.where(valid, lse - picked, 0.0), valid, lse


class _FusedSoftcapCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, softcap, reduction, chunk_rows, dtype):
        n = x.size(0)
        count = (targets != -1).sum()
        acc = _accumulation_dtype(x.dtype)
        scale = 1.0 / count.clamp_min(1).to(acc) if reduction == "mean" else torch.ones((), dtype=acc, device=x.device)
        x_c_all, w_c = x.to(dtype), weight.to(dtype)
        grad_x = torch.empty_like(x) if x.requires_grad else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if weight.requires_grad else None
        total = torch.zeros((), dtype=acc, device=x.device)
        for lo in range(0, n, chunk_rows):
            x_c, y = x_c_all[lo:lo + chunk_rows], targets[lo:lo + chunk_rows]
            z, t = _chunk_logits(x_c, w_c, softcap)
            losses, valid, lse = _chunk_losses(z, y)
            total += losses.sum()
            # d loss / d z = softmax(z) - onehot(y), zero on ignored rows, times the reduction's scale
            g = z.sub_(lse.unsqueeze(1)).exp_()  # z is not needed again: its buffer becomes softmax(z)
            g.scatter_add_(1, y.clamp_min(0).unsqueeze(1), -torch.ones_like(g[:, :1]))
            g.mul_((valid.to(acc) * scale).unsqueeze(1))
            g.mul_(t.square_().neg_().add_(1))  # through c * tanh(u / c): dz/du = 1 - tanh^2
            g = g.to(dtype)
            if grad_x is not None:
                grad_x[lo:lo + chunk_rows] = (g @ w_c).to(x.dtype)
            if grad_w is not None:
                grad_w += _wide(g.mT @ x_c)
        ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        return total * scale if reduction == "mean" else total

    @staticmethod
    def backward(ctx, grad_out):
        grad_x, grad_w = ctx.saved_tensors
        gx = None if grad_x is None else grad_x * grad_out.to(grad_x.dtype)
        gw = None if grad_w is None else (grad_w * grad_out.to(grad_w.dtype)).to(ctx.weight_dtype)
        return gx, gw, None, None, None, None, None


def softcapped_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float,
                             reduction: str = "mean", chunk_rows: int | None = None) -> torch.Tensor:
    """Cross-entropy of softcap * tanh(x W^T / softcap) against targets (rows of -1 ignored).

    x [N, d], weight [V, d], targets [N]. Never holds more than `chunk_rows` rows of logits
    (None: `default_chunk_rows`)."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be mean, sum or none, got {reduction!r}")
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(x.size(0), weight.size(0), weight.size(1))
    elif chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    dtype = _compute_dtype(x)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if needs_grad and reduction == "none":
        return reference_softcapped_cross_entropy(x, weight, targets, softcap, reduction)
    if needs_grad:
        with torch.autocast(x.device.type, enabled=False):
            return _FusedSoftcapCE.apply(x, weight, targets, softcap, reduction, chunk_rows, dtype)
    with torch.autocast(x.device.type, enabled=False):
        x_c_all, w_c = x.to(dtype), weight.to(dtype)
        parts = [_chunk_losses(_chunk_logits(x_c_all[lo:lo + chunk_rows], w_c, softcap)[0],
                               targets[lo:lo + chunk_rows])[0] for lo in range(0, x.size(0), chunk_rows)]
    losses = torch.cat(parts) if parts else x.new_zeros(0, dtype=_accumulation_dtype(x.dtype))
    if reduction == "none":
        return losses
    total = losses.sum()
    return total / (targets != -1).sum().clamp_min(1) if reduction == "mean" else total
