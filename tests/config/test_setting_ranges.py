"""Every number setting with a range is refused outside it where it is set, in one line naming its dotted key,
and taken inside it: drawn at the edges and between them (hypothesis), for every ranged leaf of the run config."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muonlab.config import RunConfig
from muonlab.errors import UsageError
from muonlab.settings import base_type, leaves, set_dotted


def _ranged():
    """The ranged leaves of the default run config (the autoresearch family's sections and the run's own)."""
    return [leaf for leaf in leaves(RunConfig()) if leaf.range is not None]


RANGED = _ranged()


def test_the_ranges_cover_the_counts_fractions_and_momenta():
    keys = {leaf.key for leaf in RANGED}
    assert {"train.num_steps", "train.max_loss", "train.eval_tokens", "schedule.final_lr_frac",
            "optim.muon_momentum_start", "optim.muon_momentum_end", "optim.muon_momentum_warmup_steps",
            "model.depth"} <= keys


def _kind(leaf):
    scalar, _ = base_type(leaf.type)
    return scalar


def _inside(leaf):
    r, kind = leaf.range, _kind(leaf)
    low = r.low if r.low is not None else -1e6
    high = r.high if r.high is not None else 1e6
    if kind is int:
        return st.integers(int(low) + int(r.low_open), int(high) - int(r.high_open))
    return st.floats(low, high, exclude_min=r.low_open, exclude_max=r.high_open, allow_nan=False)


def _outside(leaf):
    r, kind = leaf.range, _kind(leaf)
    sides = []
    if r.low is not None:
        sides.append(st.integers(max_value=int(r.low) - (0 if r.low_open else 1)) if kind is int
                     else st.floats(max_value=r.low, exclude_max=not r.low_open, allow_nan=False, allow_infinity=False))
    if r.high is not None:
        sides.append(st.integers(min_value=int(r.high) + (0 if r.high_open else 1)) if kind is int
                     else st.floats(min_value=r.high, exclude_min=not r.high_open, allow_nan=False,
                                    allow_infinity=False))
    return st.one_of(*sides)


@pytest.mark.parametrize("leaf", RANGED, ids=[leaf.key for leaf in RANGED])
def test_a_setting_takes_its_range_and_refuses_what_lies_outside(leaf):
    r = leaf.range
    cfg = RunConfig()
    for edge, inside in ((r.low, not r.low_open), (r.high, not r.high_open)):
        if edge is None or (edge is not None and math.isinf(edge)):
            continue
        value = int(edge) if _kind(leaf) is int else float(edge)
        if inside:
            set_dotted(cfg, leaf.key, value)
        else:
            with pytest.raises(UsageError, match=leaf.key.replace(".", r"\.")):
                set_dotted(cfg, leaf.key, value)

    @settings(max_examples=25, deadline=None)
    @given(inside=_inside(leaf), outside=_outside(leaf))
    def drawn(inside, outside):
        set_dotted(RunConfig(), leaf.key, inside)
        with pytest.raises(UsageError) as refused:
            set_dotted(RunConfig(), leaf.key, outside)
        message = str(refused.value)
        assert leaf.key in message and "\n" not in message and "must be" in message

    drawn()
