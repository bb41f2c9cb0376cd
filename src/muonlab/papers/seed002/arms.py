"""Seed 002's arms: the dense and Over-Encoding arms (§2.2, Table 1) and the step-0 controls (§4.5), registered
through muonlab.arms.register as a plug-in's are."""

from __future__ import annotations

from muonlab.arms import Arm, register
from muonlab.model.variants.over_encoding import DEFAULT_M as OE_PAPER_M


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
