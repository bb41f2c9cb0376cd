"""MuonAdamW: Muon (Polar Express + NorMuon + cautious weight decay) for matrices, AdamW for the rest.

Numerically the upstream optimizer (karpathy/autoresearch train.py @ 228791f). Param groups
carry `kind='muon'` or `kind='adamw'`. Hyperparameters enter the step functions as 0-D fp32
tensors, as upstream, so that (a) torch.compile does not recompile when the schedule changes
them and (b) the arithmetic on them is the same fp32 arithmetic compiled or not.

Muon step per same-shape stack of matrices (one group per shape):
  1. Nesterov momentum via lerp: m <- lerp(m, g, 1-mu);  u <- lerp(g, m, mu)
  2. Polar Express orthogonalisation in bf16 (see polar.py)
  3. NorMuon: per-row (tall) / per-column (wide) second moment v <- lerp(v, mean(u^2), 1-beta2),
     u <- u / sqrt(v), rescaled to keep the Frobenius norm of the orthogonalised update
  4. cautious weight decay (only where update and parameter agree in sign), lr scaled by
     sqrt(max(1, rows/cols)).

Per-group options (muonlab, off by default; see prepolar.py): a pre-polar conditioner between
steps 1 and 2 (`prepolar`, `prepolar_scope`, ...), Polar Express in fp32 (`polar_dtype`) and
the post-polar dtype (`post_polar_dtype`). An adamw group may carry `whiten="neumann"` and its
options (whitening.WHITEN_DEFAULTS): the right-projected Neumann-Gram whitening replaces each
table's gradient before the unchanged AdamW step. With every option off the step is called,
and computes, exactly as upstream.
"""

from __future__ import annotations

import torch

from muonlab.optim import prepolar as _prepolar
from muonlab.optim import whitening as _whitening
from muonlab.optim.polar import polar_express
from muonlab.optim.table_update import moment_free_step

ADAMW_DEFAULTS = dict(betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0)
MUON_DEFAULTS = dict(momentum=0.95, ns_steps=5, beta2=0.95, weight_decay=0.0)


def adamw_step(p, grad, exp_avg, exp_avg_sq, step_t, lr_t, beta1_t, beta2_t, eps_t, wd_t):
    """One AdamW update with bias correction, in place on p and its moments."""
    p.mul_(1 - lr_t * wd_t)
    exp_avg.lerp_(grad, 1 - beta1_t)
    exp_avg_sq.lerp_(grad.square(), 1 - beta2_t)
    bias1 = 1 - beta1_t ** step_t
    bias2 = 1 - beta2_t ** step_t
    denom = (exp_avg_sq / bias2).sqrt() + eps_t
    p.add_(exp_avg / denom, alpha=-(lr_t / bias1))


def muon_step(stacked_grads, stacked_params, momentum_buffer, second_momentum_buffer,
              momentum_t, lr_t, wd_t, beta2_t, ns_steps: int, red_dim: int, *,
              prepolar: str | None = None, select=None, alpha_t=None, passes: int = 2, sides: str = "both",
              eps: float = 1e-10, zeta_buffer=None, bias_t=None, beta2: float = 0.99,
              polar_dtype: torch.dtype | None = None, post_polar_dtype: torch.dtype | None = None,
              aol_reuse_gram: bool = True):
    """One Muon update of a stack [N, rows, cols], in place on params and buffers.

    `stacked_grads` is overwritten (it becomes the Nesterov look-ahead). The keyword arguments
    are the pre-polar and precision options (built by prepolar.step_options; none: upstream).
    `select` (a long tensor) restricts an hbieq/zeta conditioner to those matrices of the stack.
    """
    momentum = momentum_t.to(stacked_grads.dtype)
    if prepolar == "zeta":  # Zeta's EMA reads the raw gradient: before the in-place Nesterov lerp_
        if select is None:
            _prepolar.zeta_update(zeta_buffer, stacked_grads, beta2)
        else:
            v = zeta_buffer.index_select(0, select)
            _prepolar.zeta_update(v, stacked_grads.index_select(0, select), beta2)
            zeta_buffer.index_copy_(0, select, v)
    momentum_buffer.lerp_(stacked_grads, 1 - momentum)
    g = stacked_grads.lerp_(momentum_buffer, momentum)
    if prepolar in ("hbieq", "zeta", "muon2f"):
        g = _condition(g, prepolar, select, alpha_t, passes, sides, eps, zeta_buffer, bias_t,
                       second_momentum_buffer, beta2_t, red_dim)
    if polar_dtype is None and prepolar != "turbo_aol":
        g = polar_express(g, ns_steps)  # the upstream call (tests patch it with this signature)
    else:
        g = polar_express(g, ns_steps, dtype=polar_dtype or torch.bfloat16,
                          normalize="aol" if prepolar == "turbo_aol" else "frobenius", reuse_gram=aol_reuse_gram)
    if post_polar_dtype is not None:
        g = g.to(post_polar_dtype)
    if prepolar != "muon2f":  # Muon^2-F moved the second moment before Polar Express
        g = _normuon(g, second_momentum_buffer, beta2_t, red_dim)
    # cautious weight decay: decay only coordinates where update and parameter agree in sign
    lr = lr_t.to(g.dtype)
    wd = wd_t.to(g.dtype)
    mask = (g * stacked_params) >= 0
    stacked_params.sub_(lr * g + lr * wd * stacked_params * mask)


def _condition(g, prepolar, select, alpha_t, passes, sides, eps, zeta_buffer, bias_t,
               second_momentum_buffer, beta2_t, red_dim):
    """The pre-polar conditioner on the fp32 Nesterov tensor (of the selected matrices)."""
    sub = g.float() if select is None else g.index_select(0, select).float()
    if prepolar == "hbieq":
        sub = _prepolar.hbieq(sub, alpha_t, passes=passes, sides=sides, eps=eps)
    elif prepolar == "zeta":
        v = zeta_buffer if select is None else zeta_buffer.index_select(0, select)
        sub = _prepolar.zeta_whiten(sub, v, bias_t, eps)
    else:
        sub = _prepolar.muon2f_precondition(sub, second_momentum_buffer, beta2_t.to(sub.dtype), red_dim)
    if select is None:
        return sub
    return g.index_copy_(0, select, sub.to(g.dtype))


def _normuon(g, second_momentum_buffer, beta2_t, red_dim):
    """NorMuon: per-neuron second moment along the reduced dimension (upstream, unchanged)."""
    beta2 = beta2_t.to(g.dtype)
    v_mean = g.float().square().mean(dim=red_dim, keepdim=True)
    red_dim_size = g.size(red_dim)
    v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * red_dim_size).sqrt()
    second_momentum_buffer.lerp_(v_mean.to(dtype=second_momentum_buffer.dtype), 1 - beta2)
    step_size = second_momentum_buffer.clamp_min(1e-10).rsqrt()
    scaled_sq_sum = (v_mean * red_dim_size) * step_size.float().square()
    v_norm_new = scaled_sq_sum.sum(dim=(-2, -1), keepdim=True).sqrt()
    return g * (step_size * (v_norm / v_norm_new.clamp_min(1e-10))).to(g.dtype)


KINDS = ("muon", "adamw", "oe_mfree")
# seed 002 §1.3: no weight decay, no moments; table-Neumann (§1.11) off
OE_MFREE_DEFAULTS = dict(lr=0.0, weight_decay=0.0, table_whiten=None, table_whiten_tau=80.0)


def table_neumann_beta(group: dict, optimizer_state, p) -> float | None:
    """beta_t of the optional table-Neumann (advances the table's step counter); None when off
    (then the table has no optimizer state at all)."""
    if group["table_whiten"] is None:
        return None
    state = optimizer_state[p]
    state["step"] = state.get("step", 0) + 1
    return _prepolar.homotopy_alpha(state["step"], group["table_whiten_tau"])


def _scalar() -> torch.Tensor:
    return torch.tensor(0.0, dtype=torch.float32, device="cpu")


class MuonAdamW(torch.optim.Optimizer):
    """Combined optimizer: Muon for 2-D matrix groups, AdamW for the others.

    Args:
        param_groups: dicts with `params`, `kind` ('muon' or 'adamw'), `lr`, and optionally
            the kind's hyperparameters (defaults: ADAMW_DEFAULTS / MUON_DEFAULTS). All params
            of a muon group must share one 2-D shape (they are stacked). A muon group may also
            carry the pre-polar/precision options of prepolar.PREPOLAR_DEFAULTS (read with
            their defaults when absent, so older checkpoints' groups load unchanged).
        compile: wrap the step functions in torch.compile. None (default) compiles on CUDA,
            where it pays, and runs eagerly elsewhere.
    """

    def __init__(self, param_groups, compile: bool | None = None):
        groups = []
        for group in param_groups:
            group = dict(group)
            kind = group.get("kind")
            if kind not in KINDS:
                raise ValueError(f"every param group needs kind in {KINDS}, got {kind!r}")
            defaults = {"muon": MUON_DEFAULTS, "adamw": ADAMW_DEFAULTS, "oe_mfree": OE_MFREE_DEFAULTS}[kind]
            for key, value in defaults.items():
                group.setdefault(key, value)
            group["params"] = list(group["params"])
            if kind == "muon":
                shapes = {tuple(p.shape) for p in group["params"]}
                if len(shapes) > 1 or any(len(s) != 2 for s in shapes):
                    raise ValueError(f"a muon group needs 2-D params of one shape, got {sorted(shapes)}")
                _prepolar.validate_group(group)
            elif kind == "adamw":
                _whitening.validate_group(group)
            elif group["table_whiten"] not in (None, "neumann"):
                raise ValueError(f"table_whiten must be None or 'neumann', got {group['table_whiten']!r}")
            groups.append(group)
        super().__init__(groups, defaults={})
        self._compile = compile
        self._fns: dict[str, object] = {}
        self._adamw_step_t, self._adamw_lr_t = _scalar(), _scalar()
        self._adamw_beta1_t, self._adamw_beta2_t = _scalar(), _scalar()
        self._adamw_eps_t, self._adamw_wd_t = _scalar(), _scalar()
        self._muon_momentum_t, self._muon_lr_t = _scalar(), _scalar()
        self._muon_wd_t, self._muon_beta2_t = _scalar(), _scalar()
        # visit counts of the oe_mfree tables (model buffers filled by the training loop per
        # micro-step; not optimizer state: they are zero between steps)
        self.visit_counts: dict[torch.Tensor, torch.Tensor] = {}

    def attach_visit_counts(self, params, counts) -> None:
        """Tell the oe_mfree step where each table's per-row visit counts are accumulated."""
        for p, c in zip(params, counts, strict=True):
            if c.shape != p.shape[:1] or c.dtype != torch.float32:
                raise ValueError(f"visit counts must be fp32 of shape {tuple(p.shape[:1])}, got {c.dtype} {tuple(c.shape)}")
            self.visit_counts[p] = c

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # torch casts loaded state to its param's dtype; fp32 state of a low-precision param
        # (master32's master copy and moments) must stay fp32 to resume exactly
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                current = self.state[p].get(key)
                if (isinstance(value, torch.Tensor) and value.dtype == torch.float32
                        and isinstance(current, torch.Tensor) and current.dtype != torch.float32):
                    self.state[p][key] = value.to(device=p.device, copy=True)

    def _fn(self, name: str, device: torch.device):
        """The step function for `name`, compiled on CUDA unless told otherwise."""
        key = f"{name}:{device.type}"
        if key not in self._fns:
            fn = adamw_step if name == "adamw" else muon_step
            use_compile = self._compile if self._compile is not None else device.type == "cuda"
            if use_compile:
                # one graph per (shape group, option set); every optimizer in the process shares
                # muon_step's cache, so a conditioner on some groups or a second optimizer would
                # pass dynamo's default limit of 8 and, with fullgraph, fail
                torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self._fns[key] = torch.compile(fn, dynamic=False, fullgraph=True) if use_compile else fn
        return self._fns[key]

    def _step_adamw(self, group):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self._adamw_state(group, p, p)
            state["step"] += 1
            grad = _whitening.whiten_grad(p.grad, state["step"], group)  # p.grad itself when off
            self._adamw_update(group, p, grad, state)

    def _adamw_state(self, group, p, share) -> dict:
        """p's AdamW state, created for `share` (p itself, or this rank's rows of it) on first use.

        master32 (seed 002 §1.4e): an fp32 master copy and fp32 moments for a low-precision
        param; the update runs on the master and the param is written from it. Off (the
        upstream "bf16state"), moments live in the param's own dtype.
        """
        state = self.state[p]
        if not state:
            master32 = group.get("master32", False) and p.dtype != torch.float32
            state["step"] = 0
            if master32:
                state["master"] = share.detach().float().clone()
            target = state["master"] if master32 else share
            state["exp_avg"] = torch.zeros_like(target)
            state["exp_avg_sq"] = torch.zeros_like(target)
        return state

    def _adamw_update(self, group, share, grad, state) -> None:
        """One AdamW step of `share` (a param or this rank's rows of it) with `grad`, state["step"]
        already advanced; through the fp32 master under master32."""
        master32 = "master" in state
        self._fill_adamw(group, state["step"])
        target = state["master"] if master32 else share
        self._fn("adamw", share.device)(
            target, grad.float() if master32 else grad, state["exp_avg"], state["exp_avg_sq"],
            self._adamw_step_t, self._adamw_lr_t, self._adamw_beta1_t, self._adamw_beta2_t,
            self._adamw_eps_t, self._adamw_wd_t)
        if master32:
            share.copy_(state["master"])

    def _fill_adamw(self, group, step: int):
        self._adamw_step_t.fill_(step)
        self._adamw_lr_t.fill_(group["lr"])
        self._adamw_beta1_t.fill_(group["betas"][0])
        self._adamw_beta2_t.fill_(group["betas"][1])
        self._adamw_eps_t.fill_(group["eps"])
        self._adamw_wd_t.fill_(group["weight_decay"])

    def _fill_muon(self, group, rows: int, cols: int):
        self._muon_momentum_t.fill_(group["momentum"])
        self._muon_beta2_t.fill_(group["beta2"] if group["beta2"] is not None else 0.0)
        self._muon_lr_t.fill_(group["lr"] * max(1.0, rows / cols) ** 0.5)  # shape factor
        self._muon_wd_t.fill_(group["weight_decay"])

    def _step_muon(self, group):
        params = group["params"]
        if not params:
            return
        if any(p.grad is None for p in params):
            if all(p.grad is None for p in params):
                return
            raise RuntimeError("MuonAdamW: some matrices of a muon group have no gradient")
        p0 = params[0]
        state = self.state[p0]  # the stack's state lives on its first parameter
        rows, cols = p0.shape
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros(len(params), rows, cols, dtype=p0.dtype, device=p0.device)
        if "second_momentum_buffer" not in state:
            shape = (len(params), rows, 1) if rows >= cols else (len(params), 1, cols)
            state["second_momentum_buffer"] = torch.zeros(shape, dtype=p0.dtype, device=p0.device)
        red_dim = -1 if rows >= cols else -2
        stacked_grads = torch.stack([p.grad for p in params])
        stacked_params = torch.stack(params)
        self._fill_muon(group, rows, cols)
        options = _prepolar.step_options(group, state, 0, len(params), p0.device)
        self._fn("muon", p0.device)(
            stacked_grads, stacked_params, state["momentum_buffer"], state["second_momentum_buffer"],
            self._muon_momentum_t, self._muon_lr_t, self._muon_wd_t, self._muon_beta2_t,
            group["ns_steps"], red_dim, **options)
        torch._foreach_copy_(params, list(stacked_params.unbind(0)))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["kind"] == "adamw":
                self._step_adamw(group)
            elif group["kind"] == "muon":
                self._step_muon(group)
            else:
                self._step_oe_mfree(group)
        return loss

    def _step_oe_mfree(self, group):
        """Seed 002's moment-free Over-Encoding table update (optim/table_update.py); eager:
        the number of visited rows changes every step. Optional table-Neumann (§1.11) with
        beta_t = min(t / table_whiten_tau, 1)^2, t = the table's completed steps + 1."""
        for p in group["params"]:
            counts = self.visit_counts.get(p)
            if counts is None:
                raise RuntimeError("oe_mfree group: no visit counts attached (MuonAdamW.attach_visit_counts)")
            moment_free_step(p, p.grad, counts, group["lr"], neumann_beta=table_neumann_beta(group, self.state, p))
