"""The arms registry: named, documented config overrides on top of a protocol preset.

An arm says what it changes (`overrides`: dotted keys of the run config, muonlab.config; they may
be written with the flat flag names, and are stored dotted) and where it comes from (`paper`, `experiment`). Later families register their
arms here, next to the module where their variant acts. Arms never carry a preset: the sweep's
`--preset` chooses the protocol, so one arm runs under `cpu-tiny` and `gpu-d8` alike.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from muonlab.config import RunConfig, all_presets, build_config, canonical_overrides, family_leaves
from muonlab.errors import UsageError
from muonlab.families import get_family
from muonlab.families.tied.afmuon import TABLE1_FAMILIES
from muonlab.model.variants.over_encoding import DEFAULT_M as OE_PAPER_M
from muonlab.record.ledger import read_records_tolerant
from muonlab.record.protocol import recorded_arm_overrides
from muonlab.settings import coerce


@dataclass(frozen=True)
class Arm:
    name: str
    description: str
    overrides: dict[str, Any] = field(default_factory=dict)
    paper: str | None = None  # e.g. "seed 002" (docs/papers.md)
    experiment: str | None = None  # the paper's id for the run, e.g. "arm 01"
    group: str = "baseline"  # the paper's label for the arm's set (prepolar, seed002, ...), not a model family
    seeds: tuple[int, ...] = ()  # the paper's seeds: the sweep's default when --seeds is omitted
    # the model families whose presets the arm runs under when it sets none itself (seed 004's Table-1
    # arms act on every tied family); its overrides are checked against each at registration
    model_families: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ARMS: dict[str, Arm] = {}


def register(arm: Arm) -> Arm:
    """Register an arm, its overrides stored as dotted keys (an override that names no setting
    fails here). Whether each acts is checked when the arm is resolved (resolve_config) and, for
    every registered arm, by tests/test_arms.py (check_arm): importing the registry builds no config."""
    if arm.name in ARMS:
        raise ValueError(f"arm {arm.name!r} is already registered")
    arm = Arm(**{**arm.to_dict(), "overrides": canonical_overrides(arm.overrides)})
    ARMS[arm.name] = arm
    return arm


ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # a name that is also a file name (run dirs, job files)
METHOD_SECTIONS = ("model.", "optim.")  # the settings an arm given on the command line takes (define_arm)


def define_arm(name: str, overrides: dict[str, Any], base: str = "baseline", description: str = "",
               ledger: str | Path | None = None) -> Arm:
    """An arm defined outside the registry (an experiment file, `muonlab train --arm-name`): the
    registered arm `base`'s overrides plus `overrides`, registered for this process. Values are
    checked against their settings' types, so "25" and 25 are one arm. A name already taken by
    an arm with other overrides, here or in `ledger`'s lines, is refused (UsageError) before
    anything is registered."""
    if not isinstance(name, str) or not ARM_NAME.fullmatch(name):
        raise UsageError(f"arm name {name!r} must be letters, digits and _.+- (it names files)")
    parent = get_arm(base)
    merged = normalized_overrides({**parent.overrides, **canonical_overrides(overrides)})
    if name in ARMS:
        if normalized_overrides(ARMS[name].overrides) != merged:
            raise UsageError(f"arm {name!r} is already defined with other overrides "
                             f"({_show_overrides(ARMS[name].overrides)}); choose another name")
        return ARMS[name]
    if ledger is not None:
        _check_recorded(name, merged, ledger)
    arm = Arm(name=name, description=description or f"{base} + {_show_overrides(canonical_overrides(overrides))}",
              overrides=merged, group="user", seeds=parent.seeds, model_families=parent.model_families)
    ARMS[name] = arm
    return arm


def normalized_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Dotted-key overrides with each value checked and converted to its setting's type (under
    the model family they set, or the default one)."""
    family = overrides.get("family", "autoresearch")
    leaves = {leaf.key: leaf for leaf in family_leaves(family)}
    out = {}
    for key, value in overrides.items():
        out[key] = value if key not in leaves else coerce(value, leaves[key].type, key, leaves[key].allow_inf)
    return out


def check_against_ledger(arm_names, ledger) -> None:
    """Refuse (UsageError) an arm whose name the ledger's lines already record with other overrides:
    one name, one arm, across every process that writes the ledger."""
    for name in arm_names:
        _check_recorded(name, normalized_overrides(get_arm(name).overrides), ledger)


def _check_recorded(name: str, overrides: dict[str, Any], ledger) -> None:
    if not Path(ledger).is_file():
        return
    recorded = recorded_arm_overrides(read_records_tolerant(ledger)[0])
    if name in recorded and normalized_overrides(recorded[name]) != overrides:
        raise UsageError(f"arm {name!r} is recorded in {ledger} with other overrides "
                         f"({_show_overrides(recorded[name])}); choose another name")


def _show_overrides(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in overrides.items()) or "none"


def check_arm(arm: Arm) -> None:
    """Resolve the arm's overrides under each model family it runs in (that family's first preset;
    the defaults when it names none): UsageError if one does not act or cannot hold."""
    for family in arm.model_families or (None,):  # under the family's first preset: its data are the family's
        preset = {"family": family, **next(iter(get_family(family).presets.values()), {})} if family else None
        build_config(([("preset", preset)] if preset else []) + [("arm", arm.overrides)])


def get_arm(name: str) -> Arm:
    if name not in ARMS:
        raise UsageError(f"unknown arm {name!r}; known arms: {', '.join(sorted(ARMS))}")
    return ARMS[name]


def resolve_config(arm_name: str, preset_name: str, extra: dict[str, Any] | None = None,
                   implied: dict[str, Any] | None = None) -> RunConfig:
    """preset -> arm overrides -> extra overrides (e.g. CLI flags), with cfg.arm set. `implied`
    holds settings that follow from the extra ones (e.g. num_steps none when a time budget is given)."""
    arm = get_arm(arm_name)
    presets = all_presets()
    if preset_name not in presets:
        raise UsageError(f"unknown preset {preset_name!r}; choose from {', '.join(presets)}")
    cfg = build_config([("preset", presets[preset_name]), ("arm", arm.overrides), ("implied", implied or {}),
                        ("command line", extra or {})])
    cfg.arm = arm.name
    return cfg


register(Arm(
    name="baseline",
    description="upstream autoresearch: MuonAdamW (Muon on block matrices, AdamW elsewhere)",
    paper="autoresearch 228791f", experiment="train.py",
))
register(Arm(
    name="adamw_only",
    description="control: every block matrix on AdamW (lr adamw_matrix_lr=3e-3, no weight decay) instead of Muon",
    overrides={"matrix_optimizer": "adamw"},
    group="control",
))


def default_seeds(arm_names: list[str]) -> list[int]:
    """The seeds the arms' papers used; the arms must agree."""
    seeds = {get_arm(name).seeds for name in arm_names}
    if len(seeds) != 1 or not next(iter(seeds)):
        raise UsageError("these arms list no common default seeds; pass --seeds")
    return list(next(iter(seeds)))


# Seed 000 (docs/papers.md), §4.1–4.4 (Tables 1–4): seeds 42, 47, 137 for the Table-3
# families, 47 alone for the single-run ladder (Tables 2, 4A), 42/47 at depth 6. Learning rates
# are multiples of scalar_lr (0.5): "0.04" = 0.02, exp07's "sub_lr 0.05" = 0.025 and exp03's
# "qk_lr 0.10" = 0.05 (our reading; seed 000 Table 2 leaves the unit unstated; the absolute values are the alternative).
_SEED000, _S47 = (42, 47, 137), (47,)
_GAINS = dict(presub_gains="weight_fused")  # linear gains, lr 0.04 x scalar_lr
_EXP17 = dict(_GAINS, qk_scale="pair_tied_stopexp")  # "natural_grad_geodesic": gains + pair-tied stop-exp QK
_EXP05 = dict(_GAINS, presub_lr_mult=0.05, qk_scale="pair_tied_linear", qk_lr_mult=0.10)
for _name, _exp, _seeds, _overrides, _what in [
    ("exp00_baseline", "reference_seed42/baseline_seed47/137", _SEED000, {},
     "the baseline MuonAdamW run at seed 000's seeds (Table 3's Baseline rows)"),
    ("exp07_gains_linear", "exp07", _S47, dict(_GAINS, presub_lr_mult=0.05), "weight-fused linear gains only"),
    ("exp03_qk_pair_tied_linear", "exp03", _S47, dict(qk_scale="pair_tied_linear", qk_lr_mult=0.10),
     "pair-tied linear QK scaling only"),
    ("exp05_gains_qk_linear", "exp05", _S47, _EXP05, "gains (0.05) + pair-tied linear QK (0.10)"),
    ("exp64_qk_pair_tied_stopexp", "exp64", _S47, dict(qk_scale="pair_tied_stopexp"), "pair-tied stop-exp QK only"),
    ("exp17_pair_tied_stopexp", "exp18/17/22", _SEED000, _EXP17, "gains + pair-tied stop-exp QK"),
    ("exp41_untied_stopexp", "exp43/41/46", _SEED000, dict(_GAINS, qk_scale="untied_stopexp"),
     "gains + untied (nGPT) stop-exp QK"),
    ("exp19_head_temp", "exp19", _S47, dict(_GAINS, qk_scale="head_temp"), "gains + per-head temperature"),
    ("exp31_lerope_shared64", "exp31", _S47, dict(_GAINS, rope="lerope_shared"), "gains + LeRoPE shared-64 (fp32 trig)"),
    ("exp21_lerope_adapted", "exp21", _S47, dict(_GAINS, rope="lerope_adapted"),
     "gains + LeRoPE adapted per layer and head (bf16 trig)"),
    # Tables 3-4A: exp17 + the pre-polar / precision change
    ("exp44_hbieq_bf16", "exp48/44/49", _SEED000, dict(_EXP17, prepolar="hbieq"), "exp17 + 2-pass homotopy BiEq"),
    ("exp27_hbieq_fp32", "exp26/27/32", _SEED000, dict(_EXP17, prepolar="hbieq", post_polar_dtype="fp32"),
     "exp17 + homotopy BiEq, fp32 post-polar"),
    ("exp50_bieq_undamped_bf16", "exp56/50/57", _SEED000, dict(_EXP17, prepolar="hbieq", prepolar_tau=0.0),
     "exp17 + undamped BiEq"),
    ("exp51_rowrms1_bf16", "exp51", _S47, dict(_EXP17, prepolar="hbieq", prepolar_passes=1, prepolar_sides="row"),
     "exp17 + 1-pass one-sided row-RMS (homotopy)"),
    ("exp47_hbieq_square_only_bf16", "exp47", _S47, dict(_EXP17, prepolar="hbieq", prepolar_scope="square_only"),
     "exp17 + homotopy BiEq on the square (attention) matrices only"),
    ("exp58_zeta_bf16", "exp59/58/60", _SEED000, dict(_EXP17, prepolar="zeta"), "exp17 + Zeta whitening"),
    ("exp52_turbo_aol_bf16", "exp62/52/63", _SEED000, dict(_EXP17, prepolar="turbo_aol"), "exp17 + Turbo-Muon AOL"),
    ("exp53_muon2f_bf16", "exp53", _S47, dict(_EXP17, prepolar="muon2f"), "exp17 + Muon^2-F"),
    ("exp40_postpolar_fp32", "exp42/40/45", _SEED000, dict(_EXP17, post_polar_dtype="fp32"), "exp17 + fp32 post-polar"),
    ("exp33_hbieq_fp32_no_metric", "exp33", _S47, dict(prepolar="hbieq", post_polar_dtype="fp32"),
     "homotopy BiEq, fp32 post-polar, no gains or QK scaling"),
    # depth 6 (the exp05 recipe there, inferred from the run name exp11_exp05_depth6_seed47 in seed 000 Table 1); post-polar dtype of exp54/55 unstated: bf16
    ("exp11_weight_fused_d6", "exp24/exp11", (42, 47), dict(_EXP05, depth=6), "depth 6, the exp05 recipe, weight-fused"),
    ("exp28_unfused_slice_d6", "exp28", _S47, dict(_EXP05, depth=6, presub_gains="unfused_slice"),
     "depth 6, the exp05 recipe, exact unfused gains (slice-view gate input)"),
    ("exp54_weight_fused_hbieq_d6", "exp54/exp55", (42, 47), dict(_EXP05, depth=6, prepolar="hbieq"),
     "depth 6, the exp05 recipe + homotopy BiEq"),
]:
    register(Arm(name=_name, description=f"seed 000 {_exp}: {_what}", overrides=_overrides, paper="seed 000",
                 experiment=_exp, group="prepolar" if "prepolar" in _overrides or "post_polar_dtype" in _overrides
                 else "forward", seeds=_seeds))


# Seed 003 (docs/papers.md), Tables 1–2: backward branch-credit rules at every
# residual addition (seeds 46 exploratory, 146 and 246 replications) and forward radius gates
# (seed 246), the gate arms on the paper's memory-safe path (block checkpointing, 4096-token loss chunks).
_GATE = dict(checkpoint_blocks=True, loss_chunk_tokens=4096)
for _name, _seeds, _overrides, _what in [
    ("p003_ordinary", (46, 146, 246), {}, "ordinary backward (the control)"),
    ("p003_branch_tangent", (46, 146, 246), dict(residual_rule="branch_tangent"),
     "branch cotangent projected off the residual state y"),
    ("p003_whole_state_tangent", (46,), dict(residual_rule="whole_state_tangent"), "both cotangents projected"),
    ("p003_grad_mag_control", (46,), dict(residual_rule="grad_mag_control"),
     "matched projected-gradient-magnitude control"),
    ("p003_state_gate", (246,), dict(_GATE, radius_gate="state"), "forward radius gate on the incoming state"),
    ("p003_branch_gate", (246,), dict(_GATE, radius_gate="branch"), "forward radius gate on the branch output"),
    ("p003_neutral_gate", (246,), dict(_GATE, radius_gate="neutral"), "the gate code with its scalars frozen at 0"),
]:
    register(Arm(name=_name, description=f"seed 003: {_what}", overrides=_overrides, paper="seed 003",
                 experiment=_name.removeprefix("p003_"), group="seed003", seeds=_seeds))


# Seed 002 (docs/papers.md) dense arms, seeds 41, 42, 47 (§2.2, Table 1). The
# fixed-step progress of seed 002 §2.1 is the preset's; 01_dense_opt follows when Neumann whitening and
# master32 land.
_SEED002 = (41, 42, 47)
register(Arm(name="00_dense_native", description="seed 002 00_dense_native: the baseline under the paper's protocol",
             paper="seed 002", experiment="00_dense_native", group="seed002", seeds=_SEED002))
register(Arm(name="00_dense_native_lr141",
             description="seed 002 LR141: every LR x sqrt(2), Muon weight decay x 1/sqrt(2) (§4.4, Table 7)",
             overrides={"lr_scale": 2 ** 0.5}, paper="seed 002", experiment="00_dense_native_lr141",
             group="seed002", seeds=_SEED002))

# 01_dense_opt: the six OPT sub-components of seed 002 §2.1 (Family B, Tier 1), all on (the "0-trainable-parameter
# backward optimizer"): 2-pass homotopy BiEq with tau 25, Polar Express and post-polar in fp32,
# warmdown momentum cooldown, Neumann-Gram vocabulary whitening (tau 80), fp32 master state for
# wte and value embeddings, cosine Muon weight decay.
_OPT = dict(prepolar="hbieq", prepolar_tau=25.0, polar_dtype="fp32", post_polar_dtype="fp32",
            muon_momentum_cooldown=True, whiten="neumann", whiten_tau=80.0, embedding_state="master32",
            muon_wd_schedule="cosine")
register(Arm(name="01_dense_opt", description="seed 002 01_dense_opt: BiEq(tau 25) + PE32 + momentum cooldown + "
             "Neumann whitening + master32 + cosine WD", overrides=_OPT, paper="seed 002",
             experiment="01_dense_opt", group="seed002", seeds=_SEED002))
register(Arm(name="01_dense_opt_lr141", description="seed 002 01_dense_opt with LR x sqrt(2), Muon WD x 1/sqrt(2)",
             overrides={**_OPT, "lr_scale": 2 ** 0.5}, paper="seed 002", experiment="01_dense_opt_lr141",
             group="seed002", seeds=_SEED002))

# Seed 002 Over-Encoding family (§2.2, Table 1; seeds 41, 42, 47 unless noted). Arms are
# preset-agnostic: the paper ran each at depth 6 (gpu-d6) and/or depth 8 (gpu-d8), as each
# description says. QTAU = pair-tied q-only exp scaling (its optimizer is unstated in seed 002 §2.1 Tier 2:
# muonlab's variant group, lr 0.04 x scalar_lr); QMASK freezes layer 0 and planes 0-15.
_OE = dict(oe_m=OE_PAPER_M)
_QTAU = dict(qk_scale="pair_tied_exp")
_QMASK = dict(_QTAU, qk_freeze_layers="0", qk_freeze_planes=16)
_JOINT = dict(_OE, **_OPT, **_QTAU)
_BF16STATE = dict(embedding_state="native")
for _name, _overrides, _what, _seeds in [
    ("02_dense_joint", dict(_OPT, **_QTAU), "+OPT +QTAU (d6, d8)", _SEED002),
    ("02m_dense_masked_qk", dict(_OPT, **_QMASK), "02 with QMASK (d6)", _SEED002),
    ("02_dense_joint_lr141", dict(_OPT, **_QTAU, lr_scale=2 ** 0.5), "02 with LR x sqrt(2), Muon WD x 1/sqrt(2) (d6)",
     _SEED002),
    ("10_oe_native", _OE, "Over-Encoding + moment-free table update (d6, d8)", _SEED002),
    ("11_oe_opt", dict(_OE, **_OPT), "10 +OPT (d6, d8)", _SEED002),
    ("12_oe_joint", _JOINT, "10 +OPT +QTAU (d6, d8)", _SEED002),
    ("12m_oe_masked_qk", dict(_JOINT, **_QMASK), "12 with QMASK (d6, d8)", _SEED002),
    ("3a_oe_table_neumann_native", dict(_OE, table_whiten="neumann"), "10 + table-Neumann (d6)", _SEED002),
    ("3b_oe_table_neumann_joint", dict(_JOINT, table_whiten="neumann"), "12 + table-Neumann (d6, seed 42 only)", (42,)),
    ("3c_oe_table_neumann_native_d8", dict(_OE, table_whiten="neumann"), "10 + table-Neumann (d8, seed 42 only)", (42,)),
    ("4a_12_oe_joint_bf16state", dict(_JOINT, **_BF16STATE), "12 without MASTER32 (d8)", _SEED002),
    ("12d_oe_decoupled_x0", dict(_JOINT, routing="sepden"), "12 + wte_lambdas, separate denominator (d6)", _SEED002),
    ("12do_oe_decoupled_x0_out", dict(_JOINT, routing="sepden", routing_out=True), "12d + out_lambdas (d6)",
     _SEED002),
    ("12d_oe_decoupled_x0_bf16state", dict(_JOINT, **_BF16STATE, routing="sepden"), "12d without MASTER32 (d8)",
     _SEED002),
    ("12do_oe_decoupled_x0_out_bf16state", dict(_JOINT, **_BF16STATE, routing="sepden", routing_out=True),
     "12do without MASTER32 (d8)", _SEED002),
    ("12do_shared_denom", dict(_JOINT, routing="shden", routing_out=True, routing_eps=1e-6),
     "12 + shared-denominator routing (eps 1e-6) + out_lambdas (d6)", _SEED002),
    ("12do_shared_denom_f32eps", dict(_JOINT, routing="shden", routing_out=True, routing_eps=2.0 ** -23),
     "12 + shared-denominator routing (eps 2^-23, matched to F.rms_norm) + out_lambdas (d6)", _SEED002),
    ("12d_bf16_shared_denom", dict(_JOINT, **_BF16STATE, routing="shden", routing_eps=1e-6),
     "12 + shared-denominator routing (eps 1e-6), no out_lambdas, without MASTER32 (d8)", _SEED002),
]:
    register(Arm(name=_name, description=f"seed 002 {_name}: {_what}", overrides=_overrides, paper="seed 002",
                 experiment=_name, group="seed002", seeds=_seeds))
for _mode in ("nostep0", "mom_only_nodisp", "disp_only_nomom", "disp_stepcount_nomom", "nostep0_all"):
    register(Arm(name=f"12do_{_mode}", description=f"seed 002 12do step-0 control {_mode} (§4.5 item 2; d6)",
                 overrides=dict(_JOINT, routing="sepden", routing_out=True, step0_mode=_mode), paper="seed 002",
                 experiment=f"12do_{_mode}", group="seed002", seeds=_SEED002))


# Seed 004 (AF-Muon, docs/papers.md; §3.1, App. J.1): the tied-GPT arms, seeds 43, 44, 45
# (K.3 and K.8 ran seed 43 only). Run them under a tied preset: `--preset tied-cpu` (CPU) or
# `nanogpt-124m` (GPU). Table 1: Hybrid Muon / Sign / AF-Muon; K.1 the 2x2 factorial (tied rule x
# vector rule, zero aux weight decay); K.2 vocabulary; K.3 the tied scale s; K.4 width; K.5 batch;
# K.6 aux lr; K.7 cap x scale; K.8 the gradient source.
_SEED004, _S43 = (43, 44, 45), (43,)
_K5_TOKENS = 875 * 512 * 1024  # 458,752,000 tokens: K.5 and K.6 compare there
_K24_STEPS = 500_000_000 // (512 * 1024)  # K.2 and K.4: 500M tokens at 524,288 a step, 953 steps
_TIED = dict(model_family="tied")


def _OWN_BPE(vocab: int) -> dict:  # noqa: N802
    """K.2-K.4's own ByteLevel BPE: a table of exactly its rows, not NanoGPT's 50,304 (123.4M parameters at d 768)."""
    return dict(vocab_size=vocab, tied_vocab_rows=None)
_T14_STEPS = 110_000_000 // (16 * 256)  # Table 14: 110M target tokens at 16 x 256 a step
_T25_BATCH = 32_768_000 // 500 // 512 * 512  # Table 25: 500 steps, 32.77M tokens: 65,536 tokens a step
_AF_ARMS = [
    # Table 1's arms run under any seed-004 family's preset (tied-cpu, t5-cpu, imagegpt-cpu, hf-cpu, ...)
    ("t1_hybrid", dict(optimizer="hybrid"), "Hybrid Muon (tied table and vectors on AdamW)", _SEED004),
    ("t1_sign", dict(optimizer="sign"), "SCION-style Sign (c = 1, s = 1)", _SEED004),
    ("t1_afmuon", dict(optimizer="afmuon"), "AF-Muon (c = 3, s = 0.5, rho 60)", _SEED004),
    ("t1_adamw", dict(optimizer="adamw"), "pure AdamW (lr 6e-4; the protein setting's baseline)", _SEED004),
    # K.9: the shared-MLP boundary control (one MLP reused at four depths, untied), Hybrid Muon, one seed
    ("k9_reuse_hybrid", dict(model_family="reuse", optimizer="hybrid"), "K.9 homogeneous reuse, Hybrid Muon", _S43),
    # Table 15: the small T5's untied control (three tables, all on Hybrid's AdamW); under a t5 preset
    ("t15_untied_hybrid", dict(optimizer="hybrid", t5_tied=False), "Table 15 untied T5 control, Hybrid", _SEED004),
    # Table 14: the small T5's single-seed rho sweep at 110M target tokens (26,855 updates of 4,096; the seed is not
    # printed: 43, the pilots' seed), AF-Muon at rho_out / rho_hid = 1, 5, 10, 60 against Hybrid; under t5-small
    *[(f"t14_afmuon_rho{r}", dict(model_family="t5", optimizer="afmuon", af_rho=float(r), num_steps=_T14_STEPS),
       f"Table 14 rho sweep: AF-Muon, rho {r}", _S43) for r in (1, 5, 10, 60)],
    ("t14_hybrid", dict(model_family="t5", optimizer="hybrid", num_steps=_T14_STEPS), "Table 14 rho sweep: Hybrid",
     _S43),
    # Table 25: the protein setting's AdamW lr pilot, seed 43, 500 steps of 32.77M tokens in all (65,536 a step: the
    # paper's batch is not printed, this is what the two numbers imply: micro 32 x 512, 4 micro-steps); under
    # protein-llama
    *[(f"t25_adamw_lr{tag}", dict(model_family="hf", optimizer="adamw", af_adamw_lr=lr, num_steps=500,
                                  sequence_len=512, device_batch_size=32, total_batch_size=_T25_BATCH),
       f"Table 25 AdamW lr pilot: lr {lr:g}", _S43)
      for tag, lr in (("1em4", 1e-4), ("3em4", 3e-4), ("6em4", 6e-4), ("1em3", 1e-3))],
    # K.1: 2,000 steps (1.05B tokens)
    *[(f"k1_{t}_{v}", dict(_TIED, optimizer=f"factorial_{t}_{v}", num_steps=2000),
       f"K.1 factorial: tied {t}, vectors {v}", _SEED004) for t in ("lmo", "adamw") for v in ("rms", "adamw")],
    # K.3: K.2's 50k BPE at 500M tokens, seed 43 (on a CPU corpus too small for it: --vocab-size)
    *[(f"k3_s{str(s).replace('.', 'p')}", dict(_TIED, optimizer="afmuon", af_scale=s, **_OWN_BPE(50_000),
                                               num_steps=_K24_STEPS),
       f"K.3 tied scale s = {s}", _S43) for s in (0.5, 0.43, 0.375, 0.25, 0.1875, 0.125)],
    # K.7: 750 steps (393.2M tokens), eval every 125
    *[(f"k7_c{c if c != float('inf') else 'inf'}_s{str(s).replace('.', 'p')}",
       dict(_TIED, optimizer="sign" if c == 1 and s == 1.0 else "afmuon", af_cap=c, af_scale=s, num_steps=750,
            eval_every=125), f"K.7 cap c = {c}, scale s = {s}", _SEED004)
      for c in (1, 2, 3, 4, 6, 10, float("inf")) for s in (0.5, 1.0)],
    # K.8: compared at 458.8M tokens (875 steps of 512 x 1024), seed 43; K.5, K.6 and K.8 evaluate every 125 steps
    # (the authors' launchers), so each run's curve is there to read
    *[(f"k8_{src}", dict(_TIED, optimizer="afmuon", tied_grad_source=src, num_steps=875, eval_every=125),
       f"K.8 gradient source: {src}", _S43) for src in ("lookup", "softmax", "both")],
    # K.5: global batch b sequences of 1,024 tokens (micro-batch 16 fixed), compared at the same
    # 458.8M tokens: 875 x 512 / b steps (14,000 at b = 32 ... 875 at b = 512), seed 43
    *[(f"k5_{opt}_b{b}", dict(_TIED, optimizer=opt, sequence_len=1024, device_batch_size=16,
                              total_batch_size=b * 1024, num_steps=_K5_TOKENS // (b * 1024), eval_every=125),
       f"K.5 batch {b} x 1024 tokens, {_K5_TOKENS // (b * 1024):,} steps, {opt}", _S43)
      for opt in ("hybrid", "sign", "afmuon") for b in (32, 64, 128, 256, 512)],
    # K.2: ByteLevel BPE vocabularies of 50k / 100k / 150k tokens (a BPE trained on the run's corpus at that
    # size; with your own token files use t1_sign / t1_afmuon with each --path), micro-batch 16 / 8 / 8, batch 512
    # x 1024 tokens, 500M tokens (953 steps), d 768; Sign against AF-Muon, seeds 43-45
    *[(f"k2_{opt}_v{v // 1000}k", dict(_TIED, optimizer=opt, **_OWN_BPE(v), sequence_len=1024,
                                       device_batch_size=16 if v == 50_000 else 8, total_batch_size=512 * 1024,
                                       num_steps=_K24_STEPS),
       f"K.2 vocabulary {v:,}, {opt}", _SEED004)
      for opt in ("sign", "afmuon") for v in (50_000, 100_000, 150_000)],
    # K.4: width d 768 / 1024 / 1536 (12 layers, MLP 4d, head dim 128: 6 / 8 / 12 heads), K.2's 50k BPE (123.4M /
    # 202.2M / 416.6M parameters, App. K.4), 500M tokens, seeds 43-45
    *[(f"k4_{opt}_d{d}", dict(_TIED, optimizer=opt, tied_n_embd=d, **_OWN_BPE(50_000), num_steps=_K24_STEPS),
       f"K.4 width {d}, {opt}",
       _SEED004) for opt in ("sign", "afmuon") for d in (768, 1024, 1536)],
    # K.6: the auxiliary lr at 0.25x..32x of 3e-4 (16x absent), batch 512 at 458.8M tokens (875 steps), seed 43;
    # Hybrid's covers the tied table and 1-D AdamW, the AdamW-free arms' only the vectors (the tied lr is eq. 6's)
    *[(f"k6_{opt}_x{str(m).replace('.', 'p')}", dict(_TIED, optimizer=opt, af_vector_lr=3e-4 * m, num_steps=875,
                                                    eval_every=125),
       f"K.6 aux lr {3e-4 * m:g} ({m}x), {opt}", _S43)
      for opt in ("hybrid", "sign", "afmuon") for m in (0.25, 0.5, 1, 2, 4, 8, 32)],
]
for _name, _overrides, _what, _seeds in _AF_ARMS:
    _families = () if "model_family" in _overrides else ("t5",) if _name.startswith("t15") else TABLE1_FAMILIES
    register(Arm(name=_name, description=f"seed 004 {_name}: {_what}", overrides=_overrides, paper="seed 004",
                 experiment=_name, group="seed004", seeds=_seeds, model_families=_families))
