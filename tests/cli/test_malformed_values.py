"""Random malformed values for every numeric setting of every model family, for the list options, and
for every verb's own numeric options (issue 32 item 6): each is refused with exit 2 in one line naming
the setting or option, with no traceback and nothing written. Values: NaN and infinities (where the
setting does not take inf), overflowing literals, words, and fractions for integers; values just
outside an option's range; list elements that are empty, negative or not numbers.

Settings: hypothesis draws (setting, value) pairs, 150 examples per property, derandomized (the same draws
on every machine), no deadline; the settings are read from the config sections (`config.family_leaves`),
so a new setting is covered."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from muonlab.cli import build_parser, main
from muonlab.cli.config_flags import DEST
from muonlab.config import all_presets, family_leaves
from muonlab.families import all_families
from muonlab.settings import base_type

PRESET_OF = {}  # each family's first preset: the protocol a flag is tried under
for name, values in all_presets().items():
    PRESET_OF.setdefault(values["family"], name)


def _numeric_leaves():
    seen, out = set(), []
    for family in sorted(all_families()):
        for leaf in family_leaves(family):
            scalar = base_type(leaf.type)[0]
            if scalar in (int, float) and (leaf.flag, family) not in seen and leaf.key != "family":
                seen.add((leaf.flag, family))
                out.append((family, leaf, scalar))
    return out


LEAVES = _numeric_leaves()
FLOAT_BAD = ["nan", "NaN", "-nan", "x", "1,5", "0x"]
INF = ["inf", "-inf", "Infinity", "1e999", "-1e999"]  # 1e999 overflows to inf: refused where inf is
INT_BAD = ["1.5", "x", "nan", "inf", "2e3", "1,2", "--"]


def _case(draw_leaf, draw_value):
    family, leaf, scalar = draw_leaf
    bad = (FLOAT_BAD + ([] if leaf.allow_inf else INF)) if scalar is float else INT_BAD
    return family, leaf, bad[draw_value % len(bad)]


@pytest.fixture
def clean_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MUONLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _refused(capsys, argv, root: Path, *needles: str) -> None:
    before = {p for p in root.rglob("*")}
    code = main(argv)
    out, err = capsys.readouterr()
    message = err.strip()
    assert code == 2, (argv, code, message)
    assert message.startswith("error:") and "\n" not in message and "Traceback" not in out + err, message
    assert any(n in message for n in needles), (argv, message)  # it names what was given
    assert {p for p in root.rglob("*")} == before, argv  # nothing written


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(LEAVES), st.integers(min_value=0, max_value=1000))
def test_a_malformed_number_is_refused_in_one_line(clean_cwd, capsys, leaf, pick):
    family, leaf, value = _case(leaf, pick)
    _refused(capsys, ["config", "--preset", PRESET_OF[family], f"--{leaf.flag}", value], clean_cwd, leaf.key,
             f"--{leaf.flag}")


def test_every_family_and_every_numeric_setting_is_drawn_from():
    assert {family for family, _, _ in LEAVES} == set(all_families())
    assert len(LEAVES) > 60 and any(leaf.allow_inf for _, leaf, _ in LEAVES)
    assert math.isinf(float("1e999"))  # the overflowing literal is an infinity once parsed


LIST_BAD = st.sampled_from(["1,,2", ",1", "1,", "a,b", "-1", "1,-3", "1.5", "", " , "])


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(LIST_BAD, st.sampled_from(["baseline", "baseline,", ",baseline", "baseline,,adamw_only"]))
def test_malformed_lists_are_refused_in_one_line(clean_cwd, capsys, seeds, arms):
    argv = ["sweep", "--preset", "cpu-tiny", "--arms", arms, "--seeds", seeds, "--dry-run"]
    needle = "--arms" if arms.startswith(",") or ",," in arms or arms.endswith(",") else "seed"
    _refused(capsys, argv, clean_cwd, needle)
    assert os.listdir(clean_cwd) in ([], ["cache"])


# the settings that hold a comma-separated list, with a context under which each is read, and its name
LIST_SETTINGS = [(["--trajectory-steps"], "trajectory_steps", True), (["--sinks"], "sinks", False),
                 (["--variant"], "extra_variants", False),
                 (["--qk-scale", "head_temp", "--qk-freeze-layers"], "qk_freeze_layers", True)]
LIST_SETTING_BAD = ["1,,2", ",1", "1,", " , ", ",", "0,,"]
INT_LIST_BAD = ["-1", "1,-3", "a", "1.5", "1,x"]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(LIST_SETTINGS), st.integers(min_value=0, max_value=1000))
def test_malformed_list_settings_are_refused_in_one_line(clean_cwd, capsys, list_setting, pick):
    flags, name, integers = list_setting
    bad = LIST_SETTING_BAD + (INT_LIST_BAD if integers else [])
    _refused(capsys, ["config", "--preset", "cpu-tiny", *flags, bad[pick % len(bad)]], clean_cwd, name)


def _verb_options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(verb path, flag, type) of every option with a value type that is not a config flag, in every verb
    and diagnose tool: the options each verb owns."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _verb_options(sub, path + (name,))
        elif action.option_strings and action.type is not None and not action.dest.startswith(DEST):
            yield path, action.option_strings[0], action.type


VERB_OPTIONS = sorted(_verb_options(build_parser(None)), key=lambda o: (o[0], o[1]))


def test_every_numeric_verb_option_is_parsed_by_a_checked_type():
    """A bare int or float would take nan, inf or -1 as given: each verb's number is parsed by one of
    settings.integer_at_least / finite_number, which carry their range (drawn from below)."""
    assert len(VERB_OPTIONS) >= 25
    bare = [f"{' '.join(path)} {flag}" for path, flag, kind in VERB_OPTIONS if kind in (int, float)]
    assert not bare, bare
    assert all(hasattr(kind, "minimum") for _, _, kind in VERB_OPTIONS)


def _out_of_range(kind, pick: int) -> str:
    """A value the option's type must refuse: malformed, non-finite, or just outside its range."""
    edge = [str(kind.minimum) if kind.above else str(kind.minimum - 1)]
    if kind.maximum is not None:
        edge.append(str(kind.maximum + 1) if kind.integer else repr(kind.maximum * 2))
    bad = ["nan", "inf", "-inf", "1e999", "x", "", "--", "-1", *edge] + (["1.5", "2e3", "1,2"] if kind.integer else [])
    return bad[pick % len(bad)]


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(VERB_OPTIONS), st.integers(min_value=0, max_value=1000))
def test_a_malformed_verb_option_is_refused_in_one_line(clean_cwd, capsys, option, pick):
    path, flag, kind = option
    value = _out_of_range(kind, pick)
    _refused(capsys, [*path, f"{flag}={value}"], clean_cwd, f"argument {flag}:")
