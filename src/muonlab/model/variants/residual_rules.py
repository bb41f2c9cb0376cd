"""Branch-credit backward rules (seed 003 "Backward branch-credit intervention", spec-000-003
§1.E) at the residual point: the forward stays u + f bit for bit, the cotangents change. The
custom autograd Functions are in muonlab.model.residual. No parameters.

`use_rule(model, rule)` swaps the rule of a built model for a while (the replay diagnostic
compares rules on one checkpoint); outside it the table stays fixed, as torch.compile needs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from muonlab.model.extensions import ModelVariant, register_variant
from muonlab.model.residual import RESIDUAL_RULES
from muonlab.model.residual import residual_add as _residual_add


@dataclass(frozen=True)
class ResidualRuleConfig:
    rule: str = "branch_tangent"  # branch_tangent | whole_state_tangent | grad_mag_control

    def __post_init__(self):
        if self.rule not in RESIDUAL_RULES[1:]:
            raise ValueError(f"residual_rule must be one of {', '.join(RESIDUAL_RULES)}, got {self.rule!r}")


@register_variant("residual_rule", ResidualRuleConfig, paper="seed 003",
                  section="Backward branch-credit intervention (spec-000-003 §1.E)",
                  switch=("residual_rule", "ordinary"), keys={"residual_rule": "rule"},
                  tests=("tests/test_residual.py", "tests/test_model_variants.py", "tests/test_diagnostics_replay.py"))
class ResidualRule(ModelVariant):
    def residual_add(self, u, f):
        return _residual_add(u, f, self.cfg.rule)


@contextlib.contextmanager
def use_rule(model, rule: str):
    """Run `model` with residual rule `rule` ("ordinary": plain autograd) inside the block."""
    if rule not in RESIDUAL_RULES:
        raise ValueError(f"residual_rule must be one of {', '.join(RESIDUAL_RULES)}, got {rule!r}")
    points, previous = model.points, model.points.residual_add
    points.residual_add = None if rule == "ordinary" else ResidualRule(ResidualRuleConfig(rule), model.config).residual_add
    try:
        yield model
    finally:
        points.residual_add = previous
