"""Step-0 controls on the scalar families (seed 002 §4.5 item 2 `S0`; paper 002 §4.5.2, Table 8a).

At optimizer step 0 the true gradient on the routing scalars is ~0 (RMSNorm scale invariance),
but bf16 rounding leaves ~1e-7..1e-6, which AdamW (t=1, eps 1e-10) turns into a ±lr jump while
storing m0, v0 and state["step"] = 1. The modes take that package apart; they act only at
optimizer step 0 and leave every later step alone:

  none                  nothing
  nostep0               before step 0: p.grad = None (no state, no displacement; step 1 at t=1)
  mom_only_nodisp       after step 0: restore the pre-step values; keep exp_avg, exp_avg_sq, step=1
  disp_only_nomom       after step 0: optimizer.state[p].clear() (moments and counter; step 1 at t=1)
  disp_stepcount_nomom  after step 0: zero exp_avg, exp_avg_sq; keep the displacement and step=1
                        (step 1 at t=2 on zero moments: multiplier sqrt(1+b2)/(1+b1) = 0.7125)
  nostep0_all           nostep0 on all four scalar families

Contrasts (spec): 12do - dcnt = step-0 moment effect; dcnt - disp = counter effect (t=2 vs t=1);
dcnt - ns0 = displacement + counter.

Choices:
- Every mode but nostep0_all acts on ROUTING_FAMILIES only. A family absent from `params` is
  skipped; a mode none of whose families is present raises ValueError, as does a name that is
  no family (a typo would otherwise control nothing).
- "Step 0" is the `step` argument == 0, the loop's optimizer-step index (not state["step"]).
- nostep0 relies on the optimizer skipping grad-None params: MuonAdamW._step_adamw does (no
  state, no weight decay), and DistMuonAdamW does when no rank has a gradient (call the control
  on every rank). The loop must not re-create the gradient between before_step and step().
- mom_only restores the param and, under master32, the fp32 "master" copy: to its pre-step
  snapshot if the state existed, else to the param's pre-step value (the master was created
  from it at this step). Without that the next step would write the displaced master back.
  A row-sharded master (DistMuonAdamW, large tables only) is refused.
- dcnt zeroes the moments in place and leaves state["step"] as step 0 left it (1).
- mom/disp/dcnt raise if a controlled param has no state after step 0 (not in the optimizer, or
  no gradient): the control would otherwise silently do nothing.
- Works with any torch-style optimizer keeping exp_avg/exp_avg_sq/step per param (MuonAdamW's
  adamw groups, torch.optim.AdamW).
"""

from __future__ import annotations

import torch

STEP0_MODES = ("none", "nostep0", "mom_only_nodisp", "disp_only_nomom", "disp_stepcount_nomom",
               "nostep0_all")
ROUTING_FAMILIES = ("wte_lambdas", "out_lambdas")  # what every mode but nostep0_all acts on
ALL_FAMILIES = ("resid_lambdas", "x0_lambdas", "wte_lambdas", "out_lambdas")


def family_params(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The scalar families the model has (a family it lacks is absent from the dict)."""
    found = {name: getattr(model, name, None) for name in ALL_FAMILIES}
    return {name: p for name, p in found.items() if isinstance(p, torch.nn.Parameter)}


class Step0Control:
    """Applies one step-0 control mode to the named scalar families.

    Call `before_step(step, opt)` right before and `after_step(step, opt)` right after every
    `opt.step()`; both are no-ops unless step == 0.
    """

    def __init__(self, mode: str, params: dict[str, torch.nn.Parameter]):
        if mode not in STEP0_MODES:
            raise ValueError(f"unknown step-0 mode {mode!r}; expected one of {STEP0_MODES}")
        unknown = sorted(set(params) - set(ALL_FAMILIES))
        if unknown:
            raise ValueError(f"not scalar families: {unknown}; known families are {ALL_FAMILIES}")
        needed: tuple[str, ...] = (() if mode == "none" else
                                   ALL_FAMILIES if mode == "nostep0_all" else ROUTING_FAMILIES)
        self.mode = mode
        self.params: dict[str, torch.nn.Parameter] = {n: params[n] for n in needed if n in params}
        if needed and not self.params:
            raise ValueError(f"step-0 mode {mode!r} acts on {needed}, none of which the model has "
                             f"(got {sorted(params)})")
        self._saved: dict[str, tuple[torch.Tensor, torch.Tensor | None]] | None = None

    @property
    def families(self) -> tuple[str, ...]:
        """The families this control acts on (in ALL_FAMILIES order)."""
        return tuple(self.params)

    def before_step(self, step: int, optimizer: torch.optim.Optimizer) -> None:
        if step != 0 or self.mode == "none":
            return
        if self.mode in ("nostep0", "nostep0_all"):
            for p in self.params.values():
                p.grad = None
        elif self.mode == "mom_only_nodisp":
            saved = {}
            for name, p in self.params.items():
                master = optimizer.state.get(p, {}).get("master")
                saved[name] = (p.detach().clone(), None if master is None else master.clone())
            self._saved = saved

    def after_step(self, step: int, optimizer: torch.optim.Optimizer) -> None:
        if step != 0 or self.mode in ("none", "nostep0", "nostep0_all"):
            return
        for name, p in self.params.items():
            state = optimizer.state.get(p)
            if not state:
                raise RuntimeError(f"step-0 mode {self.mode!r}: {name} got no step-0 update (is it in "
                                   "the optimizer, and did it have a gradient?)")
            if self.mode == "mom_only_nodisp":
                self._restore(name, p, state)
            elif self.mode == "disp_only_nomom":
                state.clear()
            else:  # disp_stepcount_nomom
                state["exp_avg"].zero_()
                state["exp_avg_sq"].zero_()
        self._saved = None

    @torch.no_grad()
    def _restore(self, name: str, p: torch.nn.Parameter, state: dict) -> None:
        if self._saved is None:
            raise RuntimeError("mom_only_nodisp: after_step(0) without before_step(0)")
        value, master = self._saved[name]
        p.copy_(value)
        if "master" in state:
            if state["master"].shape != p.shape:
                raise RuntimeError(f"mom_only_nodisp: {name} has a sharded master copy; not supported")
            state["master"].copy_(value.float() if master is None else master)
