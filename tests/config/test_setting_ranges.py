"""Every number setting with a range is refused outside it where it is set, in one line naming its dotted key,
and taken inside it: drawn at the edges and between them (hypothesis), for every ranged leaf of the run config."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muonlab.config import RunConfig
from muonlab.errors import UsageError
from muonlab.settings import base_type, leaves, set_dotted, validate_tree


def _tied_config() -> RunConfig:
    from muonlab.arms import resolve_config

    return resolve_config("baseline", "tied-cpu", {})


_TIED = _tied_config()
CONFIGS = {"autoresearch": RunConfig, "tied": lambda: copy.deepcopy(_TIED)}


def _ranged():
    """The ranged leaves of each family's run config: its model and optimizer sections (the tied family's
    `optim.matrix_lr` is AF-Muon's, not MuonAdamW's), the method sections, and the run's own sections once."""
    out, seen = [], set()
    for family, make in CONFIGS.items():
        for leaf in leaves(make()):
            if leaf.range is not None and (leaf.key, leaf.range) not in seen:
                seen.add((leaf.key, leaf.range))
                out.append((family, leaf))
    return out


RANGED = _ranged()


def test_the_ranges_cover_the_counts_fractions_momenta_rates_and_shapes():
    keys = {leaf.key for _, leaf in RANGED}
    assert {family for family, leaf in RANGED if leaf.key == "optim.matrix_lr"} == {"autoresearch", "tied"}
    assert {"train.num_steps", "train.max_loss", "train.eval_tokens", "schedule.final_lr_frac",
            "optim.muon_momentum_start", "optim.muon_momentum_end", "optim.muon_momentum_warmup_steps",
            "model.depth", "optim.matrix_lr", "optim.adam_beta2", "optim.lr_scale", "optim.whiten.tau",
            "optim.table_whiten.tau", "model.oe.m", "model.oe.n", "model.qk.lr_mult", "data.val_fraction",
            "optim.cap", "optim.rho", "optim.vector_lr", "model.n_embd", "model.vocab_rows", "optim.prepolar.tau",
            "optim.prepolar.passes", "data.vocab_size", "data.prefetch_batches", "data.download_timeout_s",
            "data.synthetic_bytes", "record.log_every", "record.checkpoint_keep"} <= keys  # both bounds in one place


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


@pytest.mark.parametrize(("family", "leaf"), RANGED, ids=[f"{family}:{leaf.key}" for family, leaf in RANGED])
def test_a_setting_takes_its_range_and_refuses_what_lies_outside(family, leaf):
    r, make = leaf.range, CONFIGS[family]
    cfg = make()
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
        set_dotted(make(), leaf.key, inside)
        with pytest.raises(UsageError) as refused:
            set_dotted(make(), leaf.key, outside)
        message = str(refused.value)
        assert leaf.key in message and "\n" not in message and "must be" in message

    drawn()


def _section_of(cfg, key):
    section = cfg
    for part in key.split(".")[:-1]:
        section = getattr(section, part)
    return section


@pytest.mark.parametrize(("family", "leaf"), RANGED, ids=[f"{family}:{leaf.key}" for family, leaf in RANGED])
def test_a_config_made_in_code_is_held_to_the_same_ranges(family, leaf):
    """A library user's config, built or changed in code rather than set, is refused by `validate` too."""
    r, cfg = leaf.range, CONFIGS[family]()
    if r.low is not None:
        value = r.low if r.low_open else r.low - 1
    else:
        value = r.high if r.high_open else r.high + 1
    object.__setattr__(_section_of(cfg, leaf.key), leaf.key.rsplit(".", 1)[1],
                       int(value) if _kind(leaf) is int else float(value))
    with pytest.raises(UsageError, match=f"^{leaf.key.replace('.', '[.]')} must be"):
        validate_tree(cfg)
