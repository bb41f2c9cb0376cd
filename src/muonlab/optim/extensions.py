"""MuonAdamW's extension point, the pre-polar conditioner, with each conditioner's record (public API).

MuonAdamW's step is upstream's; a pre-polar conditioner attaches to it instead of being written into
it (DESIGN, "The baseline and its extension points"): a conditioner of a muon group's fp32 Nesterov
tensor, picked by the group key `prepolar.kind` (subclass PrePolar; register_prepolar). Its `stages` hook
may also set the polar normalisation or turn the post-polar NorMuon off. Four conditioners ship with
muonlab and plug-ins add their own; each has one record (settings.MethodInfo, made here).

The other built-in methods of the optimizer have one implementation each at their point, so they are
plain calls, not registries: the polar precision (muon_variant.py), the AdamW gradient transform, the
AdamW state precision and the third group kind (method_points.py). Each is listed by `muonlab methods`
from its one record, the `METHOD` of its section.

A plug-in conditioner, in its own file (tests/model/test_extensions.py does exactly this):

    @dataclass(frozen=True)
    class Power(PrePolar):
        p: float = option(0.5, "the power of |G|")
        def condition(self, G, inputs, ctx):
            return G.sign() * G.abs() ** self.p
    register_prepolar("power", Power, paper="...", tests=("tests/test_power.py",))
    MuonAdamW([{"kind": "muon", "params": ps, "lr": 0.02, "prepolar.kind": "power", "prepolar.p": 0.25}])
    # or: muonlab train --plugin power.py --prepolar power --prepolar-p 0.25

A muon group with no add-on set runs upstream's `muon_step` itself; otherwise the variant step
(muon_variant.py) is composed from the stages once per option set, so torch.compile sees a
static function and nothing is looked up per element.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple

import torch

from muonlab.errors import UsageError
from muonlab.plugins import is_builtin_module
from muonlab.settings import (MethodInfo, MethodSection, check_ranges, coerce, fixed, option, option_fields,
                              option_settings)  # a conditioner's fields: --prepolar-<name>

# the pre-polar conditioners: name -> class, and each one's record (what `muonlab methods` lists)
_CONDITIONERS: dict[str, type] = {}
_RECORDS: dict[str, MethodInfo] = {}


def _register(name: str, cls: type, record: MethodInfo, replace: bool) -> None:
    if name in _CONDITIONERS:
        if not replace:
            raise ValueError(f"pre-polar conditioner {name!r} is already registered")
        theirs = _RECORDS[name].module
        if is_builtin_module(theirs) and not is_builtin_module(record.module):  # a run naming it would train other code under its hash
            raise ValueError(f"pre-polar conditioner {name!r} is built in ({theirs}): a plug-in registers a name of its own")
    _CONDITIONERS[name] = cls
    _RECORDS[name] = record


def unregister_prepolar(name: str) -> None:
    """Remove a conditioner (for tests and interactive use)."""
    _CONDITIONERS.pop(name)
    _RECORDS.pop(name)


def records() -> list[MethodInfo]:
    """The record of every registered conditioner, in registration order."""
    return list(_RECORDS.values())


def group_key(namespace: str, name: str) -> str:
    """A method's optimizer group key: its setting's dotted key below `optim.` (`optim.whiten.tau` is the
    group key `whiten.tau`), so a setting has one name in the config, on the command line and in the groups
    that checkpoints hold."""
    return f"{namespace}.{name}"


class GroupSection(MethodSection):
    """Base of a method whose settings are keys of the optimizer groups it acts on: one frozen
    dataclass that is both the run config's section (settings, flags, help, which act when) and the
    values its implementation reads from a group (`from_group`). A setting's group key is its dotted
    key below `optim.` (`optim.polar.dtype`: `polar.dtype`; group_key), NAMESPACE being where the run
    config holds the section (tests/config checks it); an absent key is the default."""

    NAMESPACE: ClassVar[str]  # the section's dotted key below `optim.` (the run config's field name)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not isinstance(getattr(cls, "NAMESPACE", None), str):
            raise TypeError(f"{cls.__name__}: a GroupSection names its NAMESPACE, where the run config holds it")

    @classmethod
    def group_keys(cls) -> dict[str, str]:
        """{field: group key}."""
        return {f.name: group_key(cls.NAMESPACE, f.name) for f in dataclasses.fields(cls)}

    @classmethod
    def group_defaults(cls) -> dict[str, Any]:
        """{group key: default}, the values a group without the key runs with."""
        return {cls.group_keys()[f.name]: f.default for f in dataclasses.fields(cls)}

    @classmethod
    def from_group(cls, group: dict) -> "GroupSection":
        """The group's values; ValueError naming the first bad one."""
        hints, keys = _type_hints(cls), cls.group_keys()
        values = {}
        for f in dataclasses.fields(cls):
            try:
                values[f.name] = coerce(group.get(keys[f.name], f.default), hints[f.name], keys[f.name])
            except UsageError as e:
                raise ValueError(str(e)) from None
        made = cls(**values)
        try:
            check_ranges(made, lambda f: keys[f.name])
            made.validate()
        except UsageError as e:
            raise ValueError(str(e)) from None
        return made

    def group_values(self) -> dict[str, Any]:
        """{group key: value} of every setting."""
        return {key: getattr(self, name) for name, key in self.group_keys().items()}

    def group_options(self) -> dict[str, Any]:
        """{group key: value} of the settings that differ from their defaults (a group at the
        defaults carries none, as the groups recorded in checkpoints)."""
        defaults = self.group_defaults()
        return {key: value for key, value in self.group_values().items() if value != defaults[key]}


# ---------------------------------------------------------------- pre-polar conditioners

class MuonContext(NamedTuple):
    """What a conditioner may read besides its own inputs: NorMuon's buffer and hyperparameter."""

    second_momentum_buffer: torch.Tensor
    beta2_t: torch.Tensor
    red_dim: int


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A conditioner's field types, resolved once (from_group runs at every step's resolve)."""
    return typing.get_type_hints(cls)


PREPOLAR = "prepolar"  # the run config's `optim.prepolar`: a conditioner's field `tau` is the group key `prepolar.tau`
GROUP_PREFIX = group_key(PREPOLAR, "")


class PrePolar:
    """Base of a pre-polar conditioner. A subclass is a frozen dataclass whose fields are its
    options, each written once: the default, the description and a number's range
    (`option(default, help, range=...)`, or a plain field with a docstring below it), any other check
    (`__post_init__`, raising ValueError, calling PrePolar's: it checks the ranges). Every field
    is a setting (`--prepolar-f`, `optim.prepolar.f`) unless declared `fixed(default, why)`. A field
    `f` is read from a muon group's key `prepolar.f` (its dotted key below `optim.`).

    Class attributes:
        STACKED_STATE: state keys holding one slice per matrix [n, ...] (sliced by a name scope,
            sharded with the matrices by DistMuonAdamW).
        WHOLE_GROUPS_ONLY: refuse a `prepolar.scope` selecting a strict subset of a stack.
    Hooks (None: the stage is skipped; all run inside the possibly compiled step):
        before_momentum(raw_grads, inputs): reads the raw gradient, before the Nesterov update.
        condition(G, inputs, ctx) -> G: G is the fp32 Nesterov tensor [n, m, k] of the selected
            matrices (statistics per matrix only); may work in place.
    A field named `first_t` follows the optimizer's homotopy convention (muonlab.optim.homotopy:
    `optim.homotopy_first_t` sets it in a run).
    """

    STACKED_STATE: ClassVar[tuple[str, ...]] = ()
    WHOLE_GROUPS_ONLY: ClassVar[bool] = False
    before_momentum: ClassVar[Callable | None] = None
    condition: ClassVar[Callable | None] = None

    def __post_init__(self) -> None:
        """The declared ranges hold (ValueError naming the group key): a conditioner made in Python or read
        back from a group is held to what the command line checks."""
        try:
            check_ranges(self, lambda f: GROUP_PREFIX + f.name)
        except UsageError as e:
            raise ValueError(str(e)) from None

    @classmethod
    def group_defaults(cls) -> dict[str, Any]:
        """{muon group key: default} of every option."""
        return {GROUP_PREFIX + f.name: f.default for f in dataclasses.fields(cls)}

    @classmethod
    def settings(cls) -> list[dataclasses.Field]:
        """The options the run config and the command line set (every field not declared `fixed`)."""
        return option_fields(cls)

    @classmethod
    def from_group(cls, group: dict) -> "PrePolar":
        """The conditioner a muon group's keys describe (absent key: the default); ValueError
        names the first bad value."""
        hints = _type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):
            value = group.get(GROUP_PREFIX + f.name, f.default)
            if hints[f.name] in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = hints[f.name](value)
            values[f.name] = value
        return cls(**values)

    def group_options(self) -> dict[str, Any]:
        """The muon group keys of the options that differ from their defaults (a group at the
        defaults carries none, as the groups recorded in checkpoints)."""
        return {GROUP_PREFIX + f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    def step_inputs(self, state: dict, t: int, stack_shape: tuple[int, int, int], device) -> dict:
        """Host side, once per update on every rank: the tensors this step's hooks read, made
        (with its state, lazily) for this rank's `stack_shape` = (n, rows, cols). `t` counts
        the group's completed updates (0 at the first)."""
        return {}

    def stages(self, stages):
        """The muon_variant.MuonStages with this conditioner's polar / post-polar changes."""
        return stages


_RESERVED_OPTIONS = ("kind", "scope", "step")  # the pre-polar point's own names (prepolar.kind, .scope; STEP_KEY)


def register_prepolar(name: str, cls: type[PrePolar], *, paper: str, tests=(), summary: str = "",
                      replace: bool = False) -> type[PrePolar]:
    """Make `cls` selectable with a muon group's `prepolar.kind` = name (`--prepolar name`). Its options
    share one namespace with the other conditioners' (`--prepolar-<field>`): a name another
    conditioner already declares must keep its type and default."""
    if not (isinstance(cls, type) and issubclass(cls, PrePolar) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"a pre-polar conditioner is a dataclass subclassing PrePolar, got {cls!r}")
    hints = typing.get_type_hints(cls)
    option_settings(cls, name, "prepolar")  # every field a flag can carry, or declared fixed: refused here
    for f in dataclasses.fields(cls):
        if f.name in _RESERVED_OPTIONS:
            raise ValueError(f"pre-polar conditioner {name!r}: option name {f.name!r} is reserved")
        for other_name, other in _CONDITIONERS.items():
            if other_name == name or f.name not in {g.name for g in other.settings()} or "fixed" in f.metadata:
                continue
            theirs = next(g for g in dataclasses.fields(other) if g.name == f.name)
            if (typing.get_type_hints(other)[f.name], theirs.default) != (hints[f.name], f.default):
                raise ValueError(f"pre-polar conditioner {name!r}: option {f.name!r} is {other_name}'s with another "
                                 f"type or default; name it differently")
    module = sys._getframe(1).f_globals.get("__name__", "?")  # the module calling register_prepolar
    _register(name, cls, MethodInfo(name, paper, module, tuple(tests), summary=summary), replace)
    return cls


def prepolars() -> dict[str, type[PrePolar]]:
    return dict(_CONDITIONERS)


def stacked_state_keys() -> tuple[str, ...]:
    """State keys of a muon group holding one slice per matrix (sharded with the matrices)."""
    extra = [k for cls in _CONDITIONERS.values() for k in cls.STACKED_STATE]
    return ("momentum_buffer", "second_momentum_buffer", *dict.fromkeys(extra))


__all__ = ["MuonContext", "GroupSection", "PrePolar", "option", "records", "register_prepolar", "unregister_prepolar"]
