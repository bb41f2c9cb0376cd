"""Typed, nested, self-validating configuration sections (the machinery, not the settings).

A component owns its settings as a `Section`: a dataclass whose fields are declared with
`setting(default, help, flag=...)`. Sections nest; the run configuration is a tree of them.

- Every leaf has a dotted key (`optim.prepolar.tau`) and a unique flat flag (`--prepolar-tau`);
  arms and presets override dotted keys, the command line uses the flags.
- A section says which of its settings act in its current state (`inactive()`): setting one
  that does not act is a usage error, and inactive settings are left out of the config hash.
- A section class with `HASHED = False` (bookkeeping: where files go, what is printed) is never
  hashed, by construction; so is a single field declared with `hashed=False`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Iterator, Literal, get_args, get_origin

from muonlab.errors import UsageError


@dataclass(frozen=True)
class Range:
    """The interval a number setting is checked against where it is set (command line, arm, preset, file)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # (low, ...: low itself is refused
    high_open: bool = False  # ..., high): high itself is refused
    why: str = ""  # what the bound stands for, said when it is crossed

    def holds(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))

    def __str__(self) -> str:
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        left = "(" if self.low_open or self.low is None else "["
        return f"{left}{low}, {high}{')' if self.high_open or self.high is None else ']'}"


MAX_COUNT = 10**12  # steps, micro-batches, layers: more than any run on any machine takes
MAX_TOKENS = 10**15  # tokens: more than any dataset a run reads
COUNT = Range(0, MAX_COUNT, why="a count no run reaches")
POSITIVE_COUNT = Range(1, MAX_COUNT, why="a count no run reaches")
TOKENS = Range(1, MAX_TOKENS, why="more tokens than any dataset")
FRACTION = Range(0, 1)
MOMENTUM = Range(0, 1, high_open=True)
POSITIVE = Range(0, None, low_open=True)
NON_NEGATIVE = Range(0, None)


def check_range(value: Any, rng: Range | None, key: str) -> None:
    """UsageError naming the setting when a number lies outside its range (None: unset, allowed). An interval
    (a momentum, a fraction) is said whole; a bound that only guards against a mistyped count is said alone."""
    if rng is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if rng.holds(value):
        return
    got = f"{value:g}" if isinstance(value, float) else str(value)
    if rng.low is not None and rng.high is not None and not rng.why:
        raise UsageError(f"{key} must be in {rng}, got {got}")
    if rng.low is not None and (value < rng.low or (rng.low_open and value == rng.low)):
        raise UsageError(f"{key} must be {'>' if rng.low_open else '>='} {rng.low:g}, got {got}")
    why = f" ({rng.why})" if rng.why else ""
    raise UsageError(f"{key} must be {'<' if rng.high_open else '<='} {rng.high:g}{why}, got {got}")


def setting(default: Any = MISSING, help: str = "", *, flag: str | None = None, hashed: bool = True,
            factory: Any = MISSING, hashed_as: Any = MISSING, allow_inf: bool = False,
            range: Range | None = None) -> Any:  # noqa: A002 - the setting's range, as the help says it
    """A dataclass field with its description, flat flag name and whether it can change a number.
    `hashed_as`: a setting that changes no number but was hashed in earlier releases is hashed at this
    fixed value whatever it is set to, so the hashes recorded before it left the hash still match.
    A float setting is finite unless `allow_inf` (NaN never: it compares unequal to itself); a number
    with a `range` is refused outside it where it is set."""
    metadata = {"help": help, "flag": flag, "hashed": hashed}
    if range is not None:
        metadata["range"] = range
    if allow_inf:
        metadata["allow_inf"] = True
    if hashed_as is not MISSING:
        metadata["hashed_as"] = hashed_as
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def option(default: Any, help: str, range: Range | None = None) -> Any:  # noqa: A002 - as setting's
    """A field of a method's own frozen dataclass (a pre-polar conditioner, a plug-in model variant's
    config) with its description, and the interval a number is checked against where it is set (command
    line, arm, file) and where the method is made from its values. Every field of such a dataclass is a
    run-config setting (a plain `p: float = 0.5` too, its help then its docstring); `option` only adds the
    description and the range in place."""
    return dataclasses.field(default=default, metadata={"help": help, **({"range": range} if range else {})})


def fixed(default: Any, why: str) -> Any:
    """A field of a method's dataclass that is NOT a setting: set in Python only, or by the machinery
    (`why` says by what). The one way to keep a field off the command line."""
    return dataclasses.field(default=default, metadata={"fixed": why})


def option_fields(cls) -> list[dataclasses.Field]:
    """The settings of a method's dataclass: every field not declared `fixed`."""
    return [f for f in dataclasses.fields(cls) if "fixed" not in f.metadata]


@functools.cache
def field_docstrings(cls) -> dict[str, str]:
    """{field: its docstring} of a dataclass: the string literal right below a field in the class body
    (the convention Sphinx reads); {} where the source cannot be read."""
    import ast  # noqa: PLC0415
    import inspect  # noqa: PLC0415
    import textwrap  # noqa: PLC0415

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, after in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def field_help(cls, f: dataclasses.Field) -> str:
    """A method field's description: its `option` help, else its docstring, else what to write."""
    return (f.metadata.get("help") or field_docstrings(cls).get(f.name)
            or f"{f.name} (no description: give the field a docstring or declare it with option(default, help))")


def option_settings(cls, label: str, flag_prefix: str) -> list[tuple[str, Any, Any]]:
    """A method dataclass's settings as (name, type, setting) specs (see _option_settings)."""
    return list(_option_settings(cls, label, flag_prefix))


@functools.cache
def _option_settings(cls, label: str, flag_prefix: str) -> tuple[tuple[str, Any, Any], ...]:
    """The settings an OpenSection takes from a method's dataclass: the help prefixed by `label`, the flag
    `<flag_prefix>-<field>`. A field whose type no flag can carry (a list, a tensor) is refused in one line:
    declare it `fixed`. Made once per class (a field's name is set where it is listed: setting_fields)."""
    hints = typing.get_type_hints(cls)
    specs = []
    for f in option_fields(cls):
        scalar, _ = base_type(hints[f.name])
        if scalar not in (int, float, bool, str):
            raise TypeError(f"{cls.__name__}.{f.name}: a setting is an int, float, bool, str or a Literal of them "
                            f"(possibly | None), got {hints[f.name]!r}; declare it with settings.fixed(default, why) "
                            f"to keep it off the command line")
        if f.default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a setting needs a default")
        made = setting(f.default, f"{label}: {field_help(cls, f)}", flag=f"{flag_prefix}-{f.name}".replace("_", "-"),
                       range=f.metadata.get("range"))
        made.name = f.name
        specs.append((f.name, hints[f.name], made))
    return tuple(specs)


class Section:
    """Base of every config section: a dataclass, mutable, or frozen where the section is also the
    configuration a method's implementation reads (set_dotted replaces it by an updated copy)."""

    HASHED: typing.ClassVar[bool] = True

    def inactive(self) -> dict[str, str]:
        """{field: why it does not act} in the current state; default: every field acts."""
        return {}

    def validate(self) -> None:
        """Raise UsageError naming the first impossible setting (sub-sections validate themselves)."""


class MethodSection(Section):
    """A method's section of a model or optimizer config: the hooks its family calls, each a no-op by
    default. The protocol is these five methods and nothing found by name: a family walks its config's
    MethodSections (`method_sections`) and calls each hook, so a type checker and grep see every caller."""

    def variant_configs(self, cfg) -> tuple:
        """The model variant configs this section turns on for run config `cfg` (in any order)."""
        return ()

    def param_group_keys(self, optim) -> dict[str, dict]:
        """{optimizer group name: keys to add to it}; `optim` is the run's optimizer section."""
        return {}

    def needs_param_names(self) -> bool:
        """Whether the method reads the parameters' names (the groups then carry `param_names`)."""
        return False

    def step_hooks(self, model) -> list:
        """What the method does around each training step of `model` (objects with the step-hook calls)."""
        return []

    def check_with(self, cfg) -> None:
        """Raise UsageError when the method needs another setting of run config `cfg` that is not on."""


class OpenSection(Section):
    """A section whose settings are declared by registered classes as well as by its own fields: a method's
    own frozen dataclass (a pre-polar conditioner's options in `optim.prepolar`, a plug-in variant's config in
    `model.plugin_variants`) adds its fields when it is registered, so a plug-in's fields are settings like a
    built-in's. `opened()` lists them as (name, type, field) from the registry now; their values are held in
    the `values` field by name and read and set as attributes. No class is made at run time: the machinery
    walks `setting_fields`, which is `dataclasses.fields` for every other section. Never frozen (the
    registry's fields are set in place)."""

    def opened(self) -> list[tuple[str, Any, dataclasses.Field]]:
        """(name, type, field made by `setting`) of each registered setting, in registration order."""
        return []

    def __post_init__(self) -> None:
        given = self.__dict__.setdefault("values", {})
        for name, _, f in self.opened():
            if name not in given:
                given[name] = _default(f)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values")  # absent while copy or pickle rebuilds the object
        if values is None or name.startswith("_"):
            raise AttributeError(name)
        if name in values:
            return values[name]
        for opened, _, f in self.opened():  # a method registered after this section was made: its default
            if opened == name:
                values[name] = _default(f)
                return values[name]
        raise AttributeError(f"{type(self).__name__} has no setting {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        declared = name in type(self).__dataclass_fields__  # set by __init__ before `opened()` can be read
        if not declared and "values" in self.__dict__ and name in {opened for opened, _, _ in self.opened()}:
            self.values[name] = value
        else:
            object.__setattr__(self, name, value)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def opened_values() -> Any:
    """The `values` field of an OpenSection subclass (its registered settings by name; not itself a setting)."""
    return dataclasses.field(default_factory=dict, metadata={"opened_values": True})


def setting_fields(obj) -> tuple[dataclasses.Field, ...]:
    """The settings of a section class or instance: its dataclass fields, and an OpenSection's registered ones."""
    own = _own_setting_fields(obj if isinstance(obj, type) else type(obj))
    if not _is_open(obj):
        return own
    return own + tuple(f for _, _, f in _opened(obj))


@functools.cache  # a class's fields are fixed once it is made (no section class is made at run time)
def _own_setting_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(cls) if not f.metadata.get("opened_values"))


def setting_hints(obj) -> dict[str, Any]:
    """{setting: its type} of a section class or instance (setting_fields' types)."""
    hints = type_hints(obj if isinstance(obj, type) else type(obj))
    if not _is_open(obj):
        return hints
    return {**hints, **{name: tp for name, tp, _ in _opened(obj)}}


def _is_open(obj) -> bool:
    return isinstance(obj, OpenSection) or isinstance(obj, type) and issubclass(obj, OpenSection)


def _opened(obj) -> list[tuple[str, Any, dataclasses.Field]]:
    return (obj() if isinstance(obj, type) else obj).opened()


@dataclass(eq=True)
class MethodOptions(OpenSection):
    """The settings of one method's own dataclass (a plug-in variant's config): every field not `fixed`, each
    with the flag `<flag_prefix>-<field>` and its help prefixed by `label` (option_settings)."""

    values: dict = opened_values()
    method: Any = dataclasses.field(default=None, metadata={"opened_values": True})
    label: str = dataclasses.field(default="", metadata={"opened_values": True})
    flag_prefix: str = dataclasses.field(default="", metadata={"opened_values": True})

    def opened(self) -> list[tuple[str, Any, dataclasses.Field]]:
        return [] if self.method is None else option_settings(self.method, self.label, self.flag_prefix)

    def made(self) -> Any:
        """The method's config with these settings (its fixed fields at their defaults)."""
        return self.method(**{name: getattr(self, name) for name, _, _ in self.opened()})


# ----------------------------------------------------------------------------- types
@functools.cache
def type_hints(cls) -> dict[str, Any]:
    """A section's field types, resolved once per class: the annotations are strings (postponed
    evaluation), and resolving them compiles each one, thousands of times per config otherwise."""
    return typing.get_type_hints(cls)


def _is_section_type(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, Section)


def field_choices(tp) -> tuple | None:
    """The allowed values of a Literal[...] (possibly `| None`) annotation, else None."""
    if get_origin(tp) is Literal:
        return get_args(tp)
    if get_origin(tp) in (typing.Union, types.UnionType):
        choices = []
        for arg in get_args(tp):
            if arg is type(None):
                choices.append(None)
            elif get_origin(arg) is Literal:
                choices.extend(get_args(arg))
            else:
                return None
        return tuple(choices)
    return None


def base_type(tp) -> tuple[type, bool]:
    """(scalar type, optional) of an annotation such as `int | None` or `Literal['a', 'b']`."""
    if get_origin(tp) is Literal:
        args = [a for a in get_args(tp) if a is not None]
        return type(args[0]), len(args) < len(get_args(tp))
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        inner, _ = base_type(args[0])
        return inner, len(args) < len(get_args(tp))
    return tp, False


def coerce(value: Any, tp, name: str, allow_inf: bool = False) -> Any:
    """Check (and gently convert: int -> float, str -> number from the command line) a value. A float
    must be finite (NaN never; infinity only where the setting allows it)."""
    choices = field_choices(tp)
    scalar, optional = base_type(tp)
    if value is None:
        if optional or (choices is not None and None in choices):
            return None
        raise UsageError(f"{name} cannot be none")
    if value == "none" and (optional or (choices and None in choices)) and "none" not in (choices or ()):
        return None  # how the command line and the TOML `muonlab config` prints write none
    if isinstance(value, str) and scalar is not str:
        text = value.strip().lower()
        if (optional or (choices and None in choices)) and text in ("none", "null", ""):
            return None
        try:
            if scalar is bool:
                if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                    raise ValueError
                value = text in ("1", "true", "yes", "on")
            else:
                value = scalar(text) if scalar is not float else float(text)
        except ValueError:
            raise UsageError(f"{name} expects {scalar.__name__}, got {value!r}") from None
    if scalar is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if scalar in (int, float, bool, str) and not isinstance(value, scalar) or (
            scalar is int and isinstance(value, bool)):
        raise UsageError(f"{name} expects {scalar.__name__}, got {value!r}")
    if choices is not None and value not in choices:
        shown = ", ".join("none" if c is None else str(c) for c in choices)
        raise UsageError(f"{name} must be one of {shown}, got {value!r}")
    if scalar is float and not math.isfinite(value) and (math.isnan(value) or not allow_inf):
        raise UsageError(f"{name} must be a finite number, got {value}")
    return value


def comma_items(text: str, name: str, kind: type = str, empty_ok: bool = True) -> list:
    """The elements of a comma-separated list ("" is the empty list where `empty_ok`, else an empty
    element). An empty element (`1,,2`, a trailing comma) is refused in one line, as is an element that
    is not of `kind` (int: >= 0)."""
    if not text.strip() and empty_ok:
        return []
    items = [v.strip() for v in text.split(",")]
    if not all(items):
        raise UsageError(f"{name} {text!r} has an empty element")
    if kind is not int:
        return items
    try:
        values = [int(v) for v in items]
    except ValueError:
        raise UsageError(f"{name} must be comma-separated integers, got {text!r}") from None
    if min(values) < 0:
        raise UsageError(f"{name} must be integers >= 0, got {text!r}")
    return values


# ----------------------------------------------------------------------------- traversal
@dataclass(frozen=True)
class Leaf:
    key: str  # dotted key from the root
    flag: str  # flat flag name, without the leading dashes
    help: str
    type: Any
    allow_inf: bool = False  # a float setting that takes inf (AF-Muon's cap)
    range: Range | None = None  # the interval a number is checked against where it is set


def leaves(obj, prefix: str = "", classes: dict[str, type] | None = None) -> Iterator[Leaf]:
    """Every leaf setting of a section class or instance (sub-sections expanded), in declaration
    order, without building a config from a class. A field annotated with the abstract `Section`
    (a family's model or optimizer) is expanded from the instance's value, or from a class:
    `classes[field]` where given, else the class its default factory makes. An OpenSection's registered
    settings are those of the registry now."""
    if isinstance(obj, type) and issubclass(obj, OpenSection):
        obj = obj()  # its settings are the registry's now: read from a default section
    hints = setting_hints(obj)
    for f in setting_fields(obj):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if _is_section_type(tp):
            if not isinstance(obj, type):
                below = getattr(obj, f.name)
            elif tp is not Section:
                below = tp
            else:  # an abstract field of a class: the family's, or what its factory makes
                below = (classes or {}).get(f.name) or _factory_class(f)
            yield from leaves(below, key + ".")
            continue
        yield Leaf(key, f.metadata.get("flag") or f.name.replace("_", "-"), f.metadata.get("help", ""), tp,
                   bool(f.metadata.get("allow_inf")), f.metadata.get("range"))


def _factory_class(f: dataclasses.Field) -> type:
    return type(f.default_factory())


def sections(obj: Section, prefix: str = "") -> Iterator[tuple[str, Section]]:
    """(dotted prefix, section) for obj and every sub-section below it."""
    yield prefix, obj
    for f in setting_fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Section):
            yield from sections(value, f"{prefix}{f.name}.")


def method_sections(obj: Section) -> Iterator[MethodSection]:
    """obj and every section below it that offers the method hooks, in field order."""
    return (section for _, section in sections(obj) if isinstance(section, MethodSection))


def get_dotted(obj: Section, key: str) -> Any:
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def set_dotted(obj: Section, key: str, value: Any, where: str = "", named: str | None = None) -> None:
    """Set a leaf by dotted key, type-checked; UsageError when no such setting exists here. A refused value is
    said under `named` (the flag the user typed, say), else the key. A frozen section (a method's own config,
    which its implementation reads) is replaced by a copy with the new value in the section that holds it; the
    root is never frozen."""
    parts = key.split(".")
    chain = [obj]  # the sections from the root down to the leaf's
    for i, part in enumerate(parts):
        target = chain[-1]
        fields = {f.name: f for f in setting_fields(target)}
        if part not in fields:
            raise UsageError(f"{key} is not a setting{where}")
        if i == len(parts) - 1:
            tp = setting_hints(target)[part]
            if _is_section_type(tp):
                raise UsageError(f"{key} is a group of settings, not a setting")
            meta = fields[part].metadata
            value = coerce(value, tp, named or key, bool(meta.get("allow_inf")))
            check_range(value, meta.get("range"), named or key)
            _assign(chain, parts, value)
            return
        below = getattr(target, part)
        if not isinstance(below, Section):
            raise UsageError(f"{key} is not a setting{where}")
        chain.append(below)


def is_frozen(section: Section) -> bool:
    return type(section).__dataclass_params__.frozen


def _assign(chain: list[Section], parts: list[str], value: Any) -> None:
    """chain[-1].<parts[-1]> = value, replacing frozen sections on the way up by updated copies."""
    for section, name in zip(reversed(chain), reversed(parts)):
        if not is_frozen(section):
            setattr(section, name, value)
            return
        value = dataclasses.replace(section, **{name: value})
    raise TypeError("the root of a configuration cannot be a frozen section")


def to_dict(obj: Section) -> dict[str, Any]:
    out = {}
    for f in setting_fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = to_dict(value) if isinstance(value, Section) else value
    return out


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def hashed_values(obj: Section, prefix: str = "", skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The flat {dotted key: value} of every setting that can change a number: hashed sections
    and fields only, and only the settings that act in the current state (a section's inactive()
    may name a field of a sub-section, or a whole sub-section, by its relative dotted key)."""
    if not type(obj).HASHED:
        return {}
    inactive = set(obj.inactive()) | skip
    out = {}
    for f in setting_fields(obj):
        value = getattr(obj, f.name)
        if f.name in inactive or not f.metadata.get("hashed", True):
            continue
        if isinstance(value, Section):
            below = frozenset(k.removeprefix(f.name + ".") for k in inactive if k.startswith(f.name + "."))
            out.update(hashed_values(value, f"{prefix}{f.name}.", below))
        else:
            out[f"{prefix}{f.name}"] = f.metadata.get("hashed_as", value)
    return out


def inactive_keys(obj: Section) -> dict[str, str]:
    """{dotted key (or prefix of a whole sub-section): why} over the whole tree."""
    out = {}
    for prefix, section in sections(obj):
        for name, why in section.inactive().items():
            out[f"{prefix}{name}"] = why
    return out


def check_ranges(section: Section, name=lambda f: f.name) -> None:
    """Every ranged field of `section` (not its sub-sections) inside its range, named by `name(field)`: a
    section made in code or read back from an optimizer group is held to what `set_dotted` checks."""
    for f in setting_fields(section):
        check_range(getattr(section, f.name), f.metadata.get("range"), name(f))


def validate_tree(obj: Section) -> None:
    """Every range of the tree first (a section's `validate` may read a sub-section's numbers), then each
    section's own checks."""
    for prefix, section in sections(obj):
        check_ranges(section, lambda f, prefix=prefix: f"{prefix}{f.name}")
    for _, section in sections(obj):
        section.validate()


@dataclass(frozen=True)
class MethodInfo:
    """A method's one record: its name, the paper section it reproduces, where its code and tests live.
    Every method has exactly one, and `muonlab methods` lists them: a section's `METHOD` (or a field's, in
    `FIELD_METHODS`), a built-in model variant's config's `METHOD`, and the record `register_prepolar` or
    `register_variant` makes for a conditioner or a variant that has none (a plug-in's)."""

    name: str
    paper: str
    module: str
    tests: tuple[str, ...] = ()
    selector: str | None = None  # the field that switches it on (its other fields act only then)
    off: Any = None  # the selector's value when the method is off
    summary: str = ""  # one line: what it does


METHOD_OFF = "the method is off"  # why a method's own settings do not act while it is off


# A verb's own numeric options (not settings of the run config) as argparse types: checked where parsed.
SEED_LIMIT = 2**63  # torch.manual_seed's range: seeds are in [0, SEED_LIMIT)


def integer_at_least(minimum: int, maximum: int | None = None):
    """An argparse `type`: an integer in [minimum, maximum), refused in one line where parsed (a verb's
    own options; a config flag is checked by its setting). A count has a bound even where none is given:
    MAX_COUNT, beyond what any run takes (a mistyped count would otherwise run until killed)."""
    given, maximum = maximum, MAX_COUNT + 1 if maximum is None else maximum

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if given is not None and not minimum <= value < maximum:
            raise argparse.ArgumentTypeError(f"must be between {minimum} and {maximum - 1}, got {value}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if value >= maximum:
            why = " (a count no run reaches)" if maximum == MAX_COUNT + 1 else ""
            raise argparse.ArgumentTypeError(f"must be <= {maximum - 1}{why}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    parse.integer, parse.minimum, parse.maximum, parse.above = True, minimum, maximum, False  # the range, for tests
    return parse


seed_value = integer_at_least(0, SEED_LIMIT)  # a verb's --seed


def finite_number(minimum: float, above: bool = False, maximum: float | None = None):
    """An argparse `type`: a finite number >= minimum (> with `above`), and <= maximum if given."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        low_ok = value > minimum if above else value >= minimum
        if not (math.isfinite(value) and low_ok and (maximum is None or value <= maximum)):
            bound = ((f"in ({minimum:g}, {maximum:g}]" if above else f"in [{minimum:g}, {maximum:g}]")
                     if maximum is not None else f"{'>' if above else '>='} {minimum:g}")
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value

    parse.__name__ = "finite number"
    parse.integer, parse.minimum, parse.maximum, parse.above = False, minimum, maximum, above
    return parse


def token_count(text: str) -> int:
    """An argparse `type`: a token count >= 1, as 458752000, 458.752M or 2.62B."""
    scale = {"k": 10**3, "m": 10**6, "b": 10**9}.get(text.strip()[-1:].lower(), 1)
    try:
        value = float(text.strip()[:-1] if scale > 1 else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a token count such as 458752000 or 458.8M, got {text!r}") from None
    if not math.isfinite(value) or round(value * scale) < 1:
        raise argparse.ArgumentTypeError(f"must be a finite token count >= 1, got {text!r}")
    return int(round(value * scale))


token_count.integer, token_count.minimum, token_count.maximum, token_count.above = False, 1, None, False
