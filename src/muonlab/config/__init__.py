"""The run configuration: component sections composed, resolved once, hashed over what acts.

A run is a `RunConfig`: its model family, seed and arm, and one section per component, each
owned by the code it configures: `model` and `optim` (the family's, muonlab.families), `schedule`,
`train` and `runtime` (the run's own: muonlab.config.run), `data` (muonlab.data.config), `record` (bookkeeping,
muonlab.record.config). It is resolved once from layers of dotted-key overrides: the preset, the
arm, the command line. Every leaf also answers to its flat flag name (`prepolar_tau` or
`prepolar-tau` for `optim.prepolar.tau`), the names the command line has always used.

A setting that does not exist for the chosen family, or that does not act in the resolved
configuration (its method is off), is a usage error when an arm or the user sets it; a preset may
carry settings that some arms switch off. The hash covers exactly the settings that act and can
change a number; bookkeeping is left out by construction (see muonlab.settings).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from muonlab.data.config import DataConfig
from muonlab.errors import UsageError
from muonlab.data.config import TEXT_SOURCES
from muonlab.families import all_families, get_family
from muonlab.plugins import load_plugins
from muonlab.record.config import RecordConfig
from muonlab.record.protocol import PROTOCOL_KEY, protocol_hash
from muonlab.settings import (SEED_LIMIT, Section, flatten, hashed_values, inactive_keys, leaves, set_dotted, setting, to_dict,
                              validate_tree)
from muonlab.config.run import RuntimeConfig, ScheduleConfig, TrainingConfig

CONFIG_FORMAT = 2  # 1: the flat TrainConfig of muonlab <= 0.1 (see from_legacy)
_FORMAT2_SECTIONS = ("model", "optim", "schedule", "train", "runtime", "record")  # format 1 nested only data
_FORMAT1_BOOKKEEPING = frozenset({"format"})
CHECKED_ORIGINS = ("arm", "command line", "override")  # whose settings must act
ARM_ORIGIN = "arm"  # the layer a run's protocol leaves out (see protocol_values), but for its defining settings
# What defines a protocol even when an arm sets it (the model's size, the training budget, the data): an arm
# that sets one runs under the protocol of its values (seed 000's depth-6 arms under gpu-d8 are a depth-6
# study, beside the baseline run at depth 6, not a change of the depth-8 baseline)
PROTOCOL_KEYS = ("data.source", "train.num_steps", "train.time_budget", "train.total_batch_size",
                 "train.sequence_len", "train.eval_tokens", "data.vocab_size", "model.depth")
DEFINING_KEYS = (*PROTOCOL_KEYS, "model.aspect_ratio", "model.n_embd", "model.head_dim", "model.n_kv_head",
                 "model.preset", "data.path", "data.tokenizer_json")
LAYERS_KEY = "layers"  # a saved config's resolution layers (beside `format` and `protocol`)
CODE_KEY = "plugin_code"  # a saved config's {plug-in: digest of its source} (plugins.source_digests)
_RECORD_KEYS = ("format", PROTOCOL_KEY, LAYERS_KEY, CODE_KEY)  # a saved config's own keys, not settings


DEFAULT_FAMILY = "autoresearch"


def _default_model() -> Section:
    return get_family(DEFAULT_FAMILY).model_config()


def _default_optim() -> Section:
    return get_family(DEFAULT_FAMILY).optim_config()


@dataclass
class RunConfig(Section):
    """A run: its family (whose registry entry owns `model` and `optim`), seed, arm and the run's sections."""

    family: str = setting(DEFAULT_FAMILY, "model family: autoresearch, or a tied-token family: tied | t5 | "
                                          "imagegpt | hf | reuse", flag="model-family")
    seed: int = setting(42, "the run's seed")
    arm: str = setting("baseline", "the registered arm this run belongs to", hashed=False)
    model: Section = setting(factory=_default_model)  # the family's sections, from the registry
    optim: Section = setting(factory=_default_optim)
    schedule: ScheduleConfig = setting(factory=ScheduleConfig)
    train: TrainingConfig = setting(factory=TrainingConfig)
    runtime: RuntimeConfig = setting(factory=RuntimeConfig)
    data: DataConfig = setting(factory=DataConfig)
    record: RecordConfig = setting(factory=RecordConfig)

    @classmethod
    def for_family(cls, name: str) -> "RunConfig":
        family = get_family(name)
        return cls(family=name, model=family.model_config(), optim=family.optim_config())

    def inactive(self) -> dict[str, str]:
        """The sections' settings that the model family decides: its trajectory records (seed 000 Table 4B)."""
        from muonlab.families import no_trajectory

        if get_family(self.family).trajectory is no_trajectory:
            return {"record.trajectory_steps": f"model family {self.family} records no trajectory (the "
                                               f"autoresearch GPT's residual scalars)"}
        return {}

    def validate(self) -> "RunConfig":
        if not 0 <= self.seed < SEED_LIMIT:  # torch.manual_seed's range; a run name carries it (baseline-s42)
            raise UsageError(f"seed must be between 0 and 2**63 - 1, got {self.seed}")
        for f in dataclasses.fields(self):  # each section validates its own tree
            value = getattr(self, f.name)
            if isinstance(value, Section):
                validate_tree(value)
        family = get_family(self.family)
        sources = family.data_sources if family.data_sources is not None else TEXT_SOURCES
        if self.data.source not in sources:
            raise UsageError(f"model family {self.family} does not read data source {self.data.source!r}; "
                             f"choose from {', '.join(sources)}")
        family.validate(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The config as saved: its format, its protocol id and the layers it was resolved from
        (where known: a record holds what its protocol is a function of), then every setting."""
        resolution = self.resolution()
        protocol = None if resolution is None else resolution.id(self)
        layers = None if resolution is None or resolution.layers is None else resolution.saved_layers()
        code = self.plugin_code()
        return {"format": CONFIG_FORMAT, **({PROTOCOL_KEY: protocol} if protocol else {}),
                **({LAYERS_KEY: layers} if layers else {}), **({CODE_KEY: code} if code else {}), **to_dict(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        if is_legacy(values):
            return from_legacy(values)
        cfg = build_config([("saved", {k: v for k, v in values.items() if k not in _RECORD_KEYS})])
        known = values.get(PROTOCOL_KEY) if isinstance(values.get(PROTOCOL_KEY), str) else None
        layers = Resolution.read_layers(values.get(LAYERS_KEY))
        if known or layers:  # a sweep job's or a resumed run's: as resolved
            cfg.resolved_from = Resolution(_guard(cfg), layers, known)
        code = values.get(CODE_KEY)
        if isinstance(code, dict) and all(isinstance(v, str) for v in code.values()):
            cfg.saved_code = (cfg.record.plugins, dict(code))  # the code the run ran, not today's files
        return cfg

    def plugin_code(self) -> dict[str, str]:
        """{plug-in: sha256 of its source} for the plug-ins of record.plugins that act on this run
        (config.plugin_code): as recorded where this config was read from a run that recorded it, else read
        from the files now. Part of the config hash: an edited plug-in makes another arm version ({} without
        plug-ins: the hashes of built-in runs stay)."""
        saved = self.__dict__.get("saved_code")
        if saved is not None and saved[0] == self.record.plugins:
            return dict(saved[1])
        from muonlab.config.plugin_code import plugin_code  # noqa: PLC0415

        return plugin_code(self)

    def check_plugin_code(self, doing: str) -> None:
        """Refuse (UsageError) to go on with a config that recorded its plug-ins' source when a file changed
        since: `doing` (a resume, a re-evaluation) would run other code under the run's name and hash."""
        saved = self.__dict__.get("saved_code")
        if saved is None or saved[0] != self.record.plugins:
            return
        from muonlab.plugins import changed_sources  # noqa: PLC0415

        changed = changed_sources(saved[1], self.record.plugins)
        if changed:
            raise UsageError(f"plug-in {changed[0]} changed since this run was configured: {doing} would run other "
                             "code than the run's; restore that source, or start a new run (a sweep runs the "
                             "edited plug-in as a new arm version)")

    def resolution(self) -> "Resolution | None":
        """How this config was resolved (its layers, its protocol), or None where that is not known:
        a config read from a file that recorded neither, or changed in place since."""
        source: Resolution | None = self.__dict__.get("resolved_from")
        return source if source is not None and source.guard == _guard(self) else None

    def protocol_id(self) -> str | None:
        """The id of the protocol this run belongs to (protocol_values), or None where it is not known."""
        resolution = self.resolution()
        return None if resolution is None else resolution.id(self)

    def hashed_values(self) -> dict[str, Any]:
        return hashed_values(self)

    def config_hash(self) -> str:
        """sha256 (first 16 hex digits) of every setting that acts and can change a number."""
        code = self.plugin_code()
        blob = json.dumps({"format": CONFIG_FORMAT, **self.hashed_values(), **({CODE_KEY: code} if code else {})},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe_model(self) -> str:
        return get_family(self.family).describe(self)


# ----------------------------------------------------------------------------- flat flags
def _flags() -> tuple[dict[str, str], dict[str, frozenset[str]], dict[tuple[str, str], str]]:
    """(flag -> dotted key, flag -> the families that have it, (family, key) -> flag), for the
    methods registered now: a plug-in's conditioner adds its options to optim.prepolar, a plug-in
    variant its section to model.plugin_variants."""
    from muonlab.model.extensions import plugin_state  # noqa: PLC0415
    from muonlab.optim.prepolar import registry_state  # noqa: PLC0415

    return _flags_for((registry_state(), plugin_state()))


@lru_cache(maxsize=4)
def _flags_for(_registry_state) -> tuple[dict[str, str], dict[str, frozenset[str]], dict[tuple[str, str], str]]:
    table: dict[str, str] = {}
    owners: dict[str, set[str]] = {}
    by_key: dict[tuple[str, str], str] = {}
    for name in all_families():
        for leaf in family_leaves(name):
            if table.setdefault(leaf.flag, leaf.key) != leaf.key:
                raise RuntimeError(f"flag --{leaf.flag} names both {table[leaf.flag]} and {leaf.key}")
            owners.setdefault(leaf.flag, set()).add(name)
            by_key[(name, leaf.key)] = leaf.flag
    return table, {k: frozenset(v) for k, v in owners.items()}, by_key


def family_leaves(name: str) -> list:
    """Every setting of a run of model family `name`, from the section classes (no config is built)."""
    family = get_family(name)
    return list(leaves(RunConfig, classes={"model": family.model_config, "optim": family.optim_config}))


def flag_table() -> dict[str, str]:
    """flag name -> dotted key (within a family, a flag names one setting and a setting has one flag)."""
    return _flags()[0]


def families_with(key: str) -> list[str]:
    return sorted({name for name, dotted in _flags()[2] if dotted == key})


# the run's own settings (family, seed, arm) are named by their field, like a dotted key
TOP_LEVEL = tuple(f.name for f in dataclasses.fields(RunConfig) if f.default_factory is dataclasses.MISSING)


def canonical_key(key: str) -> str:
    """A dotted key, or the dotted key of a flat flag name (underscores or dashes)."""
    if "." in key or key in TOP_LEVEL:
        return key
    table = flag_table()
    flag = key.replace("_", "-")
    if flag in table:
        return table[flag]
    raise UsageError(f"unknown setting {key!r}")


def flag_of(key: str, family: str | None = None) -> str:
    """The flag of a dotted key (in `family`, or in the first family that has it)."""
    by_key = _flags()[2]
    for name in [family] if family else all_families():
        if (name, key) in by_key:
            return by_key[(name, key)]
    return key


def canonical_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Canonical dotted keys; nested dicts ({'data': {...}}) are flattened first."""
    return {key: value for key, (value, _) in _with_flags(overrides).items()}


def _with_flags(overrides: dict[str, Any]) -> dict[str, tuple[Any, str | None]]:
    """{dotted key: (value, the flat name it was given by, or None)}."""
    out = {}
    for key, value in flatten(overrides).items():
        out[canonical_key(key)] = (value, None if "." in key or key in TOP_LEVEL else key.replace("_", "-"))
    return out


# ----------------------------------------------------------------------------- resolution
def build_config(layers: list[tuple[str, dict[str, Any]]]) -> RunConfig:
    """Resolve layers of overrides [(origin, {key: value})], later layers winning, then validate.

    Settings set by an arm, the command line or an explicit override must exist for the family
    and act in the result; a preset's or a saved config's may be inert (they are not hashed)."""
    flat_layers = [(origin, _with_flags(values)) for origin, values in layers]
    family = "autoresearch"
    for _, values in flat_layers:
        family = values.get("family", (family, None))[0]
    if not isinstance(family, str):
        raise UsageError(f"model family must be a name, got {family!r}")
    cfg = RunConfig.for_family(family)
    owners = _flags()[1]
    explicit: dict[str, str] = {}
    for origin, values in flat_layers:
        for key, (value, flag) in values.items():
            if key == "family":
                continue
            if flag is not None and family not in owners.get(flag, ()):
                raise UsageError(f"--{flag} ({key}) does not act on model family {family}: it is a setting of "
                                 f"{', '.join(sorted(owners[flag]))}")
            typed = f"--{flag_of(key, family)} ({key})" if origin == "command line" else None  # as the user typed it
            try:
                set_dotted(cfg, key, value, named=typed)
            except UsageError:
                others = families_with(key)
                if others and family not in others:
                    raise UsageError(f"--{flag_of(key, others[0])} ({key}) does not act on model family {family}: it is a "
                                     f"setting of {', '.join(others)}") from None
                raise
            if origin in CHECKED_ORIGINS:
                explicit[key] = origin
    cfg.validate()
    inactive = inactive_keys(cfg)
    for key, origin in explicit.items():
        for inert, why in inactive.items():
            if key == inert or key.startswith(inert + "."):
                raise UsageError(f"--{flag_of(key, family)} ({key}) does not act: {why} (set by the {origin})")
    if all(origin != "saved" for origin, _ in flat_layers):  # a saved config's arm is baked in
        cfg.resolved_from = Resolution(_guard(cfg), [(o, {k: v for k, (v, _) in vals.items()})
                                                     for o, vals in flat_layers])
    return cfg


# ----------------------------------------------------------------------------- protocol
@dataclass
class Resolution:
    """How a config was resolved: its layers [(origin, {dotted key: value})] in order ("preset",
    "arm", "implied", "command line", "override"), and its protocol id, computed from them on first
    use (protocol_of) or as a record saved it. `guard` is the config's settings (seed aside) when it
    was resolved: a config changed in place since has no known resolution. A run's config.json and
    ledger line hold the layers, so its protocol is a function of the record itself."""

    guard: str
    layers: list[tuple[str, dict[str, Any]]] | None = None
    known: str | None = None

    def id(self, cfg: RunConfig) -> str | None:
        if self.known is None and self.layers is not None:
            values = protocol_values(self.layers, cfg)
            self.known = "" if values is None else protocol_hash(values)
        return self.known or None

    def layer(self, origin: str) -> dict[str, Any]:
        """The settings one layer gave (merged where several layers share the origin)."""
        out: dict[str, Any] = {}
        for o, values in self.layers or ():
            if o == origin:
                out.update(values)
        return out

    def saved_layers(self) -> list[dict[str, Any]]:
        return [{"origin": origin, "values": dict(values)} for origin, values in self.layers or ()]

    @staticmethod
    def read_layers(saved: Any) -> list[tuple[str, dict[str, Any]]] | None:
        if not isinstance(saved, list) or not all(isinstance(x, dict) and isinstance(x.get("origin"), str)
                                                  and isinstance(x.get("values"), dict) for x in saved):
            return None
        return [(x["origin"], dict(x["values"])) for x in saved]


def _guard(cfg: RunConfig) -> str:
    values = {k: v for k, v in cfg.hashed_values().items() if k != "seed"}
    return json.dumps(values, sort_keys=True, default=str)


def protocol_of(saved: dict[str, Any]) -> str | None:
    """The protocol id of a saved config (a run's config.json "config", a ledger line's "config"),
    from the layers it records alone: None where it records none or they no longer resolve."""
    layers = Resolution.read_layers(saved.get(LAYERS_KEY))
    if layers is None:
        return None
    try:
        resolved = build_config(layers)
    except UsageError:
        return None
    values = protocol_values(layers, resolved)
    return None if values is None else protocol_hash(values)


def protocol_values(layers: list[tuple[str, dict[str, Any]]], resolved: RunConfig) -> dict[str, Any] | None:
    """The settings a run shares with every arm of its study: its layers resolved without the
    arm's (but for the defining settings an arm sets, DEFINING_KEYS), the seed left out. A setting
    the command line gives that acts only under the arm still tells two protocols apart, so it is
    kept at its resolved value. None when the layers do not resolve without the arm."""
    kept = [("protocol", {k: v for k, v in values.items() if k != "seed" and (origin != ARM_ORIGIN or
                                                                            k in DEFINING_KEYS)})
            for origin, values in layers]
    try:
        shared = build_config(kept)
    except UsageError:
        return None
    values = shared.hashed_values()
    full = resolved.hashed_values()
    for origin, layer in layers:
        if origin in CHECKED_ORIGINS and origin != ARM_ORIGIN:
            values.update({k: full[k] for k in layer if k not in values and k in full})
    values.pop("seed", None)
    code = shared.plugin_code()
    if code:  # a plug-in the study shares (not an arm's): two versions of it are two studies, never pooled
        values[CODE_KEY] = code
    return values


def preset_of(saved: dict[str, Any]) -> str | None:
    """The name of the preset a saved config was resolved from: the preset whose settings its
    "preset" layer holds (None without layers, or when no preset holds exactly those)."""
    layers = Resolution.read_layers(saved.get(LAYERS_KEY)) or []
    values = next((v for origin, v in layers if origin == "preset"), None)
    if values is None:
        return None
    return next((name for name, preset in all_presets().items() if canonical_overrides(preset) == values), None)


def all_presets() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for family in all_families().values():
        for name, values in family.presets.items():
            out[name] = {"family": family.name, **values}
    return out


def preset(name: str) -> RunConfig:
    presets = all_presets()
    if name not in presets:
        raise UsageError(f"unknown preset {name!r}; choose from {', '.join(presets)}")
    return build_config([("preset", presets[name])])


def apply_overrides(cfg: RunConfig, overrides: dict[str, Any], origin: str = "override") -> RunConfig:
    """A new, validated config: cfg with `overrides` (dotted keys or flag names) applied on top."""
    flat = canonical_overrides(overrides)
    base = flatten(to_dict(cfg))
    if flat.get("family", cfg.family) != cfg.family:  # another family: keep only what it shares
        keys = {l.key for l in family_leaves(flat["family"])}
        base = {k: v for k, v in base.items() if k in keys}
    base.pop("family", None)
    out = build_config([("saved", {"family": cfg.family, **base}), (origin, flat)])
    source = cfg.resolution()
    if source is not None:  # the protocol follows the overrides
        # from layers: recomputed with these on top; only an id: kept while no setting changed
        out.resolved_from = (Resolution(_guard(out), source.layers + [(origin, flat)]) if source.layers is not None
                             else Resolution(source.guard, known=source.known))
    return out


def read_config_values(path) -> dict[str, Any]:
    """The saved config dict of a file: a run's config.json ({"config": {...}}), a bare JSON one, or the TOML
    `muonlab config` prints (a .toml file; its "none" strings read back as none)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise UsageError(f"config file not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} cannot be read ({exc.__class__.__name__})") from exc
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        try:
            payload = tomllib.loads(text)
        except tomllib.TOMLDecodeError as toml_exc:
            kind = "TOML" if path.suffix == ".toml" else "JSON"
            raise UsageError(f"{path} is not a {kind} config ({toml_exc if kind == 'TOML' else exc})") from exc
    values = payload.get("config", payload) if isinstance(payload, dict) else None
    if not isinstance(values, dict):
        raise UsageError(f"{path} does not hold a config object")
    return values


def load_config_file(path, values: dict[str, Any] | None = None, whole: bool = False) -> RunConfig:
    """A RunConfig from a JSON file (read_config_values; `values`: already read from it),
    resolved and validated, the plug-ins it names (record.plugins) imported first. A file the user
    hands in (`whole`) must hold every section or name the preset it extends; unknown keys and
    sections, empty or not, are refused."""
    values = read_config_values(path) if values is None else values
    record = values.get("record")
    load_plugins(record.get("plugins", "") if isinstance(record, dict) else "")  # they register its methods
    try:
        if is_legacy(values):
            return from_legacy(values, strict=True)
        sections = [f.name for f in dataclasses.fields(RunConfig)
                    if isinstance(f.default_factory, type) or f.name in ("model", "optim")]
        known = {f.name for f in dataclasses.fields(RunConfig)} | set(_RECORD_KEYS) | {"preset"}
        unknown = [k for k in values if k not in known]
        if unknown:  # an empty unknown section too: the file says something this config cannot hold
            raise UsageError(f"{unknown[0]!r} is not a setting or a section of a config (sections: "
                             f"{', '.join(sections)})")
        if "preset" in values:  # a config that extends a preset: the preset, then the file's settings
            name = values["preset"]
            if name not in all_presets():
                raise UsageError(f"\"preset\": {name!r} is not a preset ({', '.join(all_presets())})")
            rest = {k: v for k, v in values.items() if k not in ("preset", *_RECORD_KEYS)}
            return build_config([("preset", all_presets()[name]), ("command line", canonical_overrides(rest))])
        cfg = RunConfig.from_dict({"family": "autoresearch", **values})  # keeps a recorded protocol id
        missing = [name for name in sections if not isinstance(values.get(name), dict)]
        if missing and whole:
            raise UsageError(f"lacks the section(s) {', '.join(missing)}: a config holds every section (a run's "
                             f"config.json does) or names the preset it extends (\"preset\": \"cpu-tiny\")")
        return cfg
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from exc


# ----------------------------------------------------------------------------- the older format
def is_legacy(values: dict[str, Any]) -> bool:
    """A format-1 config: flat names, no family and no section other than `data` (format 1 nested
    only the data settings). A hand-written config of today's sections may leave family out."""
    return (isinstance(values, dict) and "family" not in values and "preset" not in values
            and not any(isinstance(values.get(name), dict) for name in _FORMAT2_SECTIONS))


def from_legacy(values: dict[str, Any], strict: bool = False) -> RunConfig:
    """A format-1 (flat TrainConfig) dict as a RunConfig. Its field names are today's flags;
    settings that could not act on its family are dropped (they never changed a number). With
    `strict` (a file the user hands in), a name that is no setting of any family is refused."""
    values = copy.deepcopy(values)
    family = values.pop("model_family", "autoresearch")
    data = values.pop("data", {}) or {}
    keys = {l.key for l in family_leaves(family)}
    table = flag_table()
    layer: dict[str, Any] = {"family": family}
    for name, value in [*values.items(), *((f"data.{k}", v) for k, v in data.items())]:
        key = name if "." in name else table.get(name.replace("_", "-"))
        if key in keys:
            layer[key] = value
        elif strict and key is None and name not in _FORMAT1_BOOKKEEPING:
            raise UsageError(f"{name!r} is not a setting")
    if family == "tied":
        kind = layer.get("optim.kind", "afmuon")
        if kind == "sign":  # format 1 fixed c = s = 1 for Sign whatever af_cap / af_scale said
            layer["optim.cap"] = layer["optim.scale"] = None
        if kind == "adamw":  # format 1 trained AdamW at af_matrix_lr
            layer["optim.adamw_lr"] = layer.get("optim.matrix_lr", 0.02)
    return build_config([("saved", layer)])
