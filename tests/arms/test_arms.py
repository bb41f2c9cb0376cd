"""The arms registry: every registered arm's overrides act under each model family it runs in (checked
here, not when muonlab.arms is imported), and an arm whose override does not act is refused when it
is used."""

from __future__ import annotations

import pytest

from muonlab.arms import ARMS, Arm, check_arm, register, resolve_config
from muonlab.errors import UsageError


@pytest.mark.parametrize("name", sorted(ARMS))
def test_every_registered_arm_resolves(name):
    check_arm(ARMS[name])


def test_an_override_that_does_not_act_is_refused_when_the_arm_is_used():
    arm = register(Arm(name="test_tau_without_hbieq", description="prepolar_tau while no conditioner is on",
                       overrides={"prepolar_tau": 25.0}))
    try:
        assert arm.overrides == {"optim.prepolar.tau": 25.0}  # stored by dotted key
        with pytest.raises(UsageError, match="does not act"):
            check_arm(arm)
        with pytest.raises(UsageError, match="does not act"):
            resolve_config(arm.name, "cpu-tiny")
    finally:
        del ARMS[arm.name]


def test_an_override_that_names_no_setting_is_refused_at_registration():
    with pytest.raises(UsageError, match="unknown setting"):
        register(Arm(name="test_typo", description="a misspelt flag", overrides={"prepolar_tua": 25.0}))
    assert "test_typo" not in ARMS
