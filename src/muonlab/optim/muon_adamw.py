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

Methods attach at named points: the pre-polar, polar and post-polar stages (muon_variant.py; the
pre-polar conditioner is the extension point plug-ins extend, extensions.py) and the AdamW gradient
transform, the AdamW state precision and extra group kinds (method_points.py, one method each); a
group with none set is stepped by upstream's step functions (steps.py) exactly as upstream steps it.
"""

from __future__ import annotations

import torch

from muonlab.optim import method_points, muon_variant
from muonlab.optim.legacy_group_keys import refuse_old_keys, renamed_group
from muonlab.optim.steps import adamw_step, muon_step

ADAMW_DEFAULTS = dict(betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0)
MUON_DEFAULTS = dict(momentum=0.95, ns_steps=5, beta2=0.95, weight_decay=0.0)


# One graph per (shape group, option set), and every optimizer in the process shares
# muon_step's cache: add-ons on some groups or a second optimizer pass dynamo's default
# recompile limit of 8 (and, with fullgraph, fail). The limit is raised for these calls only,
# so a recompiling model still meets the default and shows.
STEP_RECOMPILE_LIMIT = 64


def compile_step(fn):
    """`fn` under torch.compile (static shapes, one graph), with its own recompile limit."""
    compiled = torch.compile(fn, dynamic=False, fullgraph=True)
    return torch._dynamo.config.patch(recompile_limit=STEP_RECOMPILE_LIMIT)(compiled)


def _scalar() -> torch.Tensor:
    return torch.tensor(0.0, dtype=torch.float32, device="cpu")


class MuonAdamW(torch.optim.Optimizer):
    """Combined optimizer: Muon for 2-D matrix groups, AdamW for the others.

    Args:
        param_groups: dicts with `params`, `kind` ('muon', 'adamw' or a registered kind),
            `lr`, and optionally the kind's hyperparameters (defaults: ADAMW_DEFAULTS /
            MUON_DEFAULTS / the kind's). All params of a muon group must share one 2-D shape
            (they are stacked). A method's options are its settings' dotted keys below `optim.`
            (`prepolar.kind`, `polar.dtype`; the values a method carries beside them in its
            namespace, e.g. `prepolar.first_t`), read with their defaults when absent; a checkpoint
            of an earlier release, whose keys were the flat names, loads renamed.
        compile: wrap the step functions in torch.compile. None (default) compiles on CUDA,
            where it pays, and runs eagerly elsewhere.
    """

    def __init__(self, param_groups, compile: bool | None = None):
        kinds = method_points.GROUP_KINDS
        groups = []
        for group in param_groups:
            group = dict(group)
            refuse_old_keys(group)
            kind = group.get("kind")
            if kind not in ("muon", "adamw", *kinds):
                raise ValueError(f"every param group needs kind in {('muon', 'adamw', *kinds)}, got {kind!r}")
            defaults = MUON_DEFAULTS if kind == "muon" else ADAMW_DEFAULTS if kind == "adamw" else kinds[kind].defaults
            for key, value in defaults.items():
                group.setdefault(key, value)
            group["params"] = list(group["params"])
            if kind == "muon":
                shapes = {tuple(p.shape) for p in group["params"]}
                if len(shapes) > 1 or any(len(s) != 2 for s in shapes):
                    raise ValueError(f"a muon group needs 2-D params of one shape, got {sorted(shapes)}")
                muon_variant.validate_group(group)
            elif kind == "adamw":
                method_points.validate_adamw_group(group)
            else:
                kinds[kind].validate(group)
            groups.append(group)
        super().__init__(groups, defaults={})
        self._compile = compile
        self._fns: dict[tuple, object] = {}
        self._adamw_step_t, self._adamw_lr_t = _scalar(), _scalar()
        self._adamw_beta1_t, self._adamw_beta2_t = _scalar(), _scalar()
        self._adamw_eps_t, self._adamw_wd_t = _scalar(), _scalar()
        self._muon_momentum_t, self._muon_lr_t = _scalar(), _scalar()
        self._muon_wd_t, self._muon_beta2_t = _scalar(), _scalar()
        # per-row visit counts of params in counted group kinds (model buffers filled by the
        # training loop per micro-step; not optimizer state: they are zero between steps)
        self.visit_counts: dict[torch.Tensor, torch.Tensor] = {}

    def attach_visit_counts(self, params, counts) -> None:
        """Tell a counted group kind where each param's per-row visit counts are accumulated."""
        for p, c in zip(params, counts, strict=True):
            if c.shape != p.shape[:1] or c.dtype != torch.float32:
                raise ValueError(f"visit counts must be fp32 of shape {tuple(p.shape[:1])}, got {c.dtype} {tuple(c.shape)}")
            self.visit_counts[p] = c

    def load_state_dict(self, state_dict):
        state_dict = {**state_dict, "param_groups": [renamed_group(g) for g in state_dict["param_groups"]]}
        super().load_state_dict(state_dict)
        # torch casts loaded state to its param's dtype; fp32 state of a low-precision param
        # (an fp32 master copy and its moments) must stay fp32 to resume exactly
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                current = self.state[p].get(key)
                if (isinstance(value, torch.Tensor) and value.dtype == torch.float32
                        and isinstance(current, torch.Tensor) and current.dtype != torch.float32):
                    self.state[p][key] = value.to(device=p.device, copy=True)

    def _fn(self, name, device: torch.device):
        """The step function for "adamw", "muon" or a MuonStages, compiled on CUDA unless told otherwise."""
        key = (name, device.type)
        if key not in self._fns:
            fn = adamw_step if name == "adamw" else muon_step if name == "muon" else muon_variant.build_step(name)
            use_compile = self._compile if self._compile is not None else device.type == "cuda"
            self._fns[key] = compile_step(fn) if use_compile else fn
        return self._fns[key]

    def _muon_call(self, group, state, start: int, stop: int, device):
        """(step function, extra arguments) for the group's matrices [start, stop); advances the
        add-ons' per-step state, so call it once per update on every rank."""
        stages = muon_variant.resolve(group)
        if stages is None:
            return self._fn("muon", device), ()
        return self._fn(stages, device), (muon_variant.step_inputs(group, stages, state, start, stop, device),)

    def _step_adamw(self, group):
        transform = method_points.adamw_transform(group)
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self._adamw_state(group, p, p)
            state["step"] += 1
            grad = p.grad if transform is None else transform.apply(p.grad, state["step"], group)
            self._adamw_update(group, p, grad, state)

    def _adamw_state(self, group, p, share) -> dict:
        """p's AdamW state, created for `share` (p itself, or this rank's rows of it) on first use;
        the moments are made like the tensor the update runs on (a state precision's, or share)."""
        state = self.state[p]
        if not state:
            precision = method_points.adamw_precision_for(group, p)
            state["step"] = 0
            target = share if precision is None else precision.create(state, share)
            state["exp_avg"] = torch.zeros_like(target)
            state["exp_avg_sq"] = torch.zeros_like(target)
        return state

    def _adamw_update(self, group, share, grad, state) -> None:
        """One AdamW step of `share` (a param or this rank's rows of it) with `grad`, state["step"]
        already advanced; through the state precision's tensor when the state has one. `grad` is
        cast once, here: to the state precision's dtype (an fp32 state gets a transform's fp32
        output unrounded, seed 002 §2.1 (Tier 1), §3 item 3) or else to share's dtype."""
        precision = method_points.adamw_precision_of(state)
        self._fill_adamw(group, state["step"])
        target = share if precision is None else precision.target(state)
        self._fn("adamw", share.device)(
            target, grad.to(share.dtype) if precision is None else precision.grad(grad), state["exp_avg"],
            state["exp_avg_sq"],
            self._adamw_step_t, self._adamw_lr_t, self._adamw_beta1_t, self._adamw_beta2_t,
            self._adamw_eps_t, self._adamw_wd_t)
        if precision is not None:
            precision.write_back(share, state)

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
        fn, extra = self._muon_call(group, state, 0, len(params), p0.device)
        fn(stacked_grads, stacked_params, state["momentum_buffer"], state["second_momentum_buffer"],
           self._muon_momentum_t, self._muon_lr_t, self._muon_wd_t, self._muon_beta2_t,
           group["ns_steps"], red_dim, *extra)
        torch._foreach_copy_(params, list(stacked_params.unbind(0)))

    def _step_kind(self, group):
        """A third group kind's own update (eager: e.g. the number of visited rows changes)."""
        handler = method_points.GROUP_KINDS[group["kind"]]
        for p in group["params"]:
            handler.update(self, group, p, p.grad)

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
                self._step_kind(group)
        return loss
