"""Seed 000's arms: arms, by the paper's experiment ids (§4.1-4.4, Tables 1-4), registered through
muonlab.arms.register as a plug-in's are."""

from __future__ import annotations

from muonlab.arms import Arm, register


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
