"""The step math of MuonAdamW, as pure functions of tensors (upstream's, karpathy/autoresearch
train.py @ 228791f): AdamW with bias correction, Nesterov momentum by lerp, NorMuon, the cautious
weight decay, and the Muon step they make with Polar Express. MuonAdamW (muon_adamw.py) and the
variant step of its add-ons (muon_variant.py) both call them; neither imports the other for them.
Hyperparameters are 0-D fp32 tensors, so a compiled step does not recompile when they change.
"""

from __future__ import annotations

from muonlab.optim.polar import polar_express


def adamw_step(p, grad, exp_avg, exp_avg_sq, step_t, lr_t, beta1_t, beta2_t, eps_t, wd_t):
    """One AdamW update with bias correction, in place on p and its moments."""
    p.mul_(1 - lr_t * wd_t)
    exp_avg.lerp_(grad, 1 - beta1_t)
    exp_avg_sq.lerp_(grad.square(), 1 - beta2_t)
    bias1 = 1 - beta1_t ** step_t
    bias2 = 1 - beta2_t ** step_t
    denom = (exp_avg_sq / bias2).sqrt() + eps_t
    p.add_(exp_avg / denom, alpha=-(lr_t / bias1))


def nesterov_(stacked_grads, momentum_buffer, momentum_t):
    """Nesterov momentum via lerp; overwrites the gradients with the look-ahead and returns it."""
    momentum = momentum_t.to(stacked_grads.dtype)
    momentum_buffer.lerp_(stacked_grads, 1 - momentum)
    return stacked_grads.lerp_(momentum_buffer, momentum)


def normuon(g, second_momentum_buffer, beta2_t, red_dim):
    """NorMuon: per-neuron second moment along the reduced dimension, Frobenius norm kept."""
    beta2 = beta2_t.to(g.dtype)
    v_mean = g.float().square().mean(dim=red_dim, keepdim=True)
    red_dim_size = g.size(red_dim)
    v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * red_dim_size).sqrt()
    second_momentum_buffer.lerp_(v_mean.to(dtype=second_momentum_buffer.dtype), 1 - beta2)
    step_size = second_momentum_buffer.clamp_min(1e-10).rsqrt()
    scaled_sq_sum = (v_mean * red_dim_size) * step_size.float().square()
    v_norm_new = scaled_sq_sum.sum(dim=(-2, -1), keepdim=True).sqrt()
    return g * (step_size * (v_norm / v_norm_new.clamp_min(1e-10))).to(g.dtype)


def cautious_update_(g, stacked_params, lr_t, wd_t):
    """p <- p - lr g - lr wd p, the decay only where update and parameter agree in sign."""
    lr = lr_t.to(g.dtype)
    wd = wd_t.to(g.dtype)
    mask = (g * stacked_params) >= 0
    stacked_params.sub_(lr * g + lr * wd * stacked_params * mask)


def muon_step(stacked_grads, stacked_params, momentum_buffer, second_momentum_buffer,
              momentum_t, lr_t, wd_t, beta2_t, ns_steps: int, red_dim: int):
    """One Muon update of a stack [N, rows, cols], in place on params and buffers (the grads
    become the Nesterov look-ahead)."""
    g = nesterov_(stacked_grads, momentum_buffer, momentum_t)
    g = polar_express(g, ns_steps)
    g = normuon(g, second_momentum_buffer, beta2_t, red_dim)
    cautious_update_(g, stacked_params, lr_t, wd_t)
