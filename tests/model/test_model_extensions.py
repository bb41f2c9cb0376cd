"""The model-variant registry is public API: a variant defined here, outside the package,
plugs into the GPT, starts as the baseline forward and trains in its own AdamW group."""

from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import torch
from support.models import live_baseline as _live_baseline, small

from muonlab.errors import UsageError
from muonlab.model import GPT, REGISTRY, GPTConfig, ModelVariant, describe, register_variant
from muonlab.model.extensions import HOOKS, ExtensionPoints

IDX = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(5))
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BranchScaleConfig:
    lr_mult: float = 0.1


class BranchScale(ModelVariant):
    """y = u + (1 + beta[i, slot]) f: a per-addition branch scale, beta = 0 at init."""
    param_names = ("branch_beta",)

    def create(self):
        self.model.branch_beta = torch.nn.Parameter(torch.empty(self.config.n_layer, 2))

    def init_weights(self):
        self.model.branch_beta.zero_()

    def param_groups(self, lrs):
        return [lrs.adamw([self.model.branch_beta], lrs.scalar_lr * self.cfg.lr_mult)]

    def branch(self, i, slot, u, f):
        return (1 + self.model.branch_beta[i, slot]) * f


@pytest.fixture
def plugin():
    register_variant("test_branch_scale", BranchScaleConfig, paper="(test)", section="-",
                     tests=("tests/model/test_extensions.py",))(BranchScale)
    yield BranchScaleConfig
    del REGISTRY["test_branch_scale"]


def _like(base, config):
    model = GPT(config)
    model.init_weights()
    model.float()
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert missing == ["branch_beta"] and not unexpected
    return model


def test_a_plugin_variant_is_the_baseline_at_init_and_trains_in_its_own_group(plugin):
    base = _live_baseline()
    cfg = small()
    model = _like(base, GPTConfig(**{f.name: getattr(cfg, f.name) for f in fields(cfg)}
                                  | {"variants": (plugin(lr_mult=0.2),)}))
    assert "branch_beta" in model.state_dict() and model.points.branch is not None
    assert torch.equal(model(IDX), base(IDX))  # (1 + 0) * f == f, bit for bit

    opt = model.setup_optimizer(scalar_lr=0.5)
    loss = model(IDX, IDX.roll(-1, 1))
    loss.backward()
    assert model.branch_beta.grad is not None and torch.count_nonzero(model.branch_beta.grad) > 0
    group = next(g for g in opt.param_groups if any(p is model.branch_beta for p in g["params"]))
    assert group["kind"] == "adamw" and group["params"] == [model.branch_beta]
    assert group["lr"] == pytest.approx(0.5 * 0.2) and group["weight_decay"] == 0.0
    before = model.branch_beta.detach().clone()
    opt.step()
    assert not torch.equal(model.branch_beta.detach(), before)
    counts = model.num_scaling_params()
    assert counts["branch_beta"] == 8 and counts["total"] == sum(p.numel() for p in model.parameters())


def test_a_plugin_is_switched_on_by_name_and_shared_hooks_are_refused(plugin):
    on = small(variant="test_branch_scale")  # --variant test_branch_scale: the plug-in with its config's defaults
    assert on.variants == (plugin(),) and small().variants == ()
    row = next(row for row in describe() if row["name"] == "test_branch_scale")
    assert row["config"] == ["lr_mult"]
    with pytest.raises(ValueError, match="both attach to 'branch'"):  # radius gates use the same hook
        GPT(small(variant="test_branch_scale", radius_gate="state"))
    with pytest.raises(ValueError, match="given twice"):
        GPTConfig(variants=(plugin(), plugin()))


def test_unregistered_configs_and_unknown_keys_raise():
    @dataclass(frozen=True)
    class Stray:
        pass
    with pytest.raises(ValueError, match="not the config of a registered"):
        GPTConfig(variants=(Stray(),))
    with pytest.raises(UsageError, match="unknown setting 'qk_scael'"):
        small(qk_scael="pair_tied_exp")


def test_the_baseline_wires_no_hook():
    model = GPT(small())
    assert model.variants == () and model.points == ExtensionPoints()
    for block in model.transformer.h:
        assert block.points is model.points and block.attn.points is model.points


def test_every_builtin_variant_is_described_and_its_files_exist():
    rows = {row["name"]: row for row in describe()}
    assert {"presub_gains", "qk_scale", "lerope", "residual_rule", "radius_gate", "over_encoding", "routing",
            "checkpoint_blocks", "chunked_loss"} <= set(rows)
    for name, row in rows.items():
        assert row["paper"].startswith("seed 00") and len(row["paper"].split()) > 2, name  # and where in it
        assert isinstance(row["config"], list), name
        method = getattr(REGISTRY[name].config, "METHOD", None)
        if method is not None:  # one record: the config's METHOD, not a second copy at registration
            assert (row["paper"], tuple(row["tests"])) == (method.paper, method.tests), name
        assert row["module"].startswith("muonlab.model.variants."), name
        for test in row["tests"]:
            assert (ROOT / test).is_file(), (name, test)
    assert set(HOOKS) == {f.name for f in fields(ExtensionPoints)}
