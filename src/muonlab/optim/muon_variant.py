"""The variant Muon step: upstream's step with a muon group's add-ons composed in.

    [before_momentum] -> Nesterov -> [pre-polar condition] -> polar -> [post-polar dtype]
    -> [NorMuon] -> cautious weight decay

`resolve(group)` reads the group's options once per step into a frozen MuonStages (None when
nothing is set: the caller then runs upstream's `muon_step` itself, so the baseline stays
bitwise upstream); `build_step(stages)` closes over the chosen stages, so the function
torch.compile(fullgraph=True) sees has no dispatch left in it; `step_inputs` makes the
per-step tensors (a conditioner's state and scalars, a name scope's index) on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from muonlab.optim import extensions, steps
from muonlab.optim import prepolar as _prepolar
from muonlab.optim.addons.polar_precision import PolarPrecision
from muonlab.optim.polar import polar_express


@dataclass(frozen=True)
class PolarStage:
    """Which orthogonalisation: Polar Express in `dtype` with the `normalize` normalisation."""

    dtype: torch.dtype = torch.bfloat16
    normalize: str = "frobenius"
    reuse_gram: bool = True

    def kwargs(self) -> dict:
        # the upstream call is polar_express(g, ns_steps): keep it when nothing changed
        return {} if self == PolarStage() else dict(dtype=self.dtype, normalize=self.normalize,
                                                     reuse_gram=self.reuse_gram)


@dataclass(frozen=True)
class MuonStages:
    """What a muon group's step does beyond upstream (hashable: one step function each)."""

    prepolar: extensions.PrePolar | None = None
    subset: bool = False  # the conditioner acts on the matrices `inputs["select"]` only
    polar: PolarStage = field(default_factory=PolarStage)
    post_polar_dtype: torch.dtype | None = None
    normuon: bool = True


def validate_group(group: dict) -> None:
    """The conditioner's and the polar precision's checks of a muon group's options."""
    _prepolar.validate_group(group)
    PolarPrecision.from_group(group)


def resolve(group: dict) -> MuonStages | None:
    """The group's stages; None when they are upstream's."""
    cond, subset = _prepolar.conditioner(group)
    stages = MuonStages(prepolar=cond, subset=subset)
    if cond is not None:
        stages = cond.stages(stages)
    stages = PolarPrecision.from_group(group).configure(stages)
    return None if stages == MuonStages() else stages


def step_inputs(group: dict, stages: MuonStages, state: dict, start: int, stop: int, device) -> dict:
    """The per-step tensors of the group's matrices [start, stop); call once per update on every
    rank (it advances the conditioner's step counter and makes its state lazily)."""
    cond = stages.prepolar
    if cond is None:
        return {}
    t = state.get(_prepolar.STEP_KEY, 0)
    state[_prepolar.STEP_KEY] = t + 1
    rows, cols = group["params"][0].shape
    inputs = cond.step_inputs(state, t, (stop - start, rows, cols), device)
    if stages.subset:
        local = _prepolar.selected_indices(group, start, stop)
        inputs["select"] = torch.tensor(local, dtype=torch.long, device=device)
    return inputs


def build_step(stages: MuonStages):
    """The step function for `stages`: muon_step's 10 arguments, then `inputs` (step_inputs)."""
    nesterov_, normuon, cautious_update_ = steps.nesterov_, steps.normuon, steps.cautious_update_

    cond = stages.prepolar
    before = cond.before_momentum if cond is not None else None
    condition = cond.condition if cond is not None else None
    stacked = cond.STACKED_STATE if cond is not None else ()
    subset, polar_kwargs = stages.subset, stages.polar.kwargs()
    post_polar_dtype, run_normuon = stages.post_polar_dtype, stages.normuon

    def selected(inputs, select):
        return {k: (v.index_select(0, select) if k in stacked else v) for k, v in inputs.items()}

    def variant_muon_step(stacked_grads, stacked_params, momentum_buffer, second_momentum_buffer,
                          momentum_t, lr_t, wd_t, beta2_t, ns_steps: int, red_dim: int, inputs: dict):
        select = inputs["select"] if subset else None
        if before is not None:  # e.g. Zeta's EMA reads the raw gradient: before the in-place Nesterov lerp_
            if select is None:
                before(stacked_grads, inputs)
            else:
                sub = selected(inputs, select)
                before(stacked_grads.index_select(0, select), sub)
                for k in stacked:
                    inputs[k].index_copy_(0, select, sub[k])
        g = nesterov_(stacked_grads, momentum_buffer, momentum_t)
        if condition is not None:  # on the fp32 Nesterov tensor of the selected matrices
            ctx = extensions.MuonContext(second_momentum_buffer, beta2_t, red_dim)
            if select is None:
                g = condition(g.float(), inputs, ctx)
            else:
                sub = condition(g.index_select(0, select).float(), selected(inputs, select), ctx)
                g = g.index_copy_(0, select, sub.to(g.dtype))
        g = polar_express(g, ns_steps, **polar_kwargs)
        if post_polar_dtype is not None:
            g = g.to(post_polar_dtype)
        if run_normuon:
            g = normuon(g, second_momentum_buffer, beta2_t, red_dim)
        cautious_update_(g, stacked_params, lr_t, wd_t)

    return variant_muon_step
