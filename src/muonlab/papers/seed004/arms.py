"""Seed 004's arms: AF-Muon's Table 1 and the ablations of App. K, Tables 14, 15, 25, registered through
muonlab.arms.register as a plug-in's are."""

from __future__ import annotations

from muonlab.arms import Arm, register
from muonlab.families.tied.afmuon import TABLE1_FAMILIES


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
