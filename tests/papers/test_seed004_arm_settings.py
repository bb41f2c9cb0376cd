"""Every seed-004 arm's optimizer as built, against the paper's values (seed 004 §3.1, App. J and App. K,
typed here from the tables, not read from the arms): the tied table's rule, cap c, scale s, rho
and lr, the vectors' rule and lr, the auxiliary weight decay, and K.5/K.6's batch, steps, seeds."""

from __future__ import annotations

import math

import pytest
import torch

from muonlab.arms import ARMS, resolve_config
from muonlab.device import Runtime
from muonlab.train.build import build_model, build_optimizer

MUON_LR, AUX_LR, RHO = 0.02, 3e-4, 60.0  # Table 1 / §3: Muon lr 0.02, vector (aux) lr 3e-4, rho 60
AF, SIGN = (3.0, 0.5), (1.0, 1.0)  # (c, s)
K6_LRS = {0.25: 7.5e-5, 0.5: 1.5e-4, 1: 3e-4, 2: 6e-4, 4: 1.2e-3, 8: 2.4e-3, 32: 9.6e-3}  # K.6, 16x absent
K5_STEPS = {32: 14000, 64: 7000, 128: 3500, 256: 1750, 512: 875}  # K.5 at 458.8M tokens
K24_STEPS = 953  # K.2, K.4: 500M tokens at 524,288 a step
K2_VOCAB = {"v50k": 50_000, "v100k": 100_000, "v150k": 150_000}
# parameters (millions) the paper gives: K.2 per vocabulary at d 768, K.4 per width with the 50k BPE
K2_PARAMS_M = {50_000: 123.4, 100_000: 161.8, 150_000: 200.2}
K4_PARAMS_M = {768: 123.4, 1024: 202.2, 1536: 416.6}


def expected(name: str) -> dict:
    """tied: ("lmo", c, s) or ("adamw", lr, wd); vector: ("rms" | "adamw", lr, wd); seeds; train."""
    out = {"seeds": (43, 44, 45), "train": {}, "grad_source": "both"}
    parts = name.split("_")
    if name == "t1_adamw":  # the protein baseline: torch AdamW everywhere, lr 6e-4, betas (0.9, 0.95)
        out.update(adamw=(6e-4, 0.1, 1e-8, (0.9, 0.95)))
    elif name.startswith("t1_") or name.startswith(("k5_", "k6_")):
        opt = parts[1]
        vec_lr = K6_LRS[float(parts[2][1:].replace("p", ".")) if "p" in parts[2] else int(parts[2][1:])] \
            if name.startswith("k6_") else AUX_LR
        if opt == "hybrid":  # tied table and vectors on AdamW, aux weight decay 0.01
            out.update(tied=("adamw", vec_lr, 0.01), vector=("adamw", vec_lr, 0.01))
        else:
            out.update(tied=("lmo", *(SIGN if opt == "sign" else AF)), vector=("rms", vec_lr, 0.0))
        if name.startswith("k5_"):
            b = int(parts[2][1:])
            out["train"] = {"total_batch_size": b * 1024, "num_steps": K5_STEPS[b], "sequence_len": 1024,
                            "device_batch_size": 16}
        if name.startswith("k6_"):
            out["train"] = {"num_steps": 875}
        if name[:2] in ("k5", "k6"):
            out["seeds"] = (43,)
    elif name.startswith(("k2_", "k4_")):  # Sign (1, 1) against AF (3, 0.5); batch 512 x 1024, 500M tokens
        out.update(tied=("lmo", *(SIGN if parts[1] == "sign" else AF)), vector=("rms", AUX_LR, 0.0))
        out["train"] = {"num_steps": K24_STEPS}
        if name.startswith("k2_"):
            v = K2_VOCAB[parts[2]]
            out["train"].update(total_batch_size=512 * 1024, sequence_len=1024, device_batch_size=16 if v == 50_000 else 8)
            out["data"] = {"vocab_size": v}
        else:
            out["model"] = {"n_embd": int(parts[2][1:])}
    elif name.startswith("k1_"):  # K.1: zero auxiliary weight decay in all four arms; 2,000 steps (1.05B tokens)
        tied, vec = parts[1], parts[2]
        out["tied"] = ("lmo", *AF) if tied == "lmo" else ("adamw", AUX_LR, 0.0)
        out["vector"] = ("rms", AUX_LR, 0.0) if vec == "rms" else ("adamw", AUX_LR, 0.0)
        out["train"] = {"num_steps": 2000}
    elif name.startswith("k3_"):  # K.3: seed 43, the 50k BPE, 500M tokens
        out.update(tied=("lmo", 3.0, float(parts[1][1:].replace("p", "."))), vector=("rms", AUX_LR, 0.0),
                   seeds=(43,), data={"vocab_size": 50_000})
        out["train"] = {"num_steps": K24_STEPS, "device_batch_size": 16}
    elif name.startswith("k7_"):  # K.7: 750 steps (393.2M tokens), eval every 125
        c = math.inf if parts[1] == "cinf" else float(parts[1][1:])
        out.update(tied=("lmo", c, float(parts[2][1:].replace("p", "."))), vector=("rms", AUX_LR, 0.0))
        out["train"] = {"num_steps": 750, "eval_every": 125}
    elif name.startswith("k8_"):  # K.8: seed 43, compared at 458.8M tokens (875 steps)
        out.update(tied=("lmo", *AF), vector=("rms", AUX_LR, 0.0), seeds=(43,), grad_source=parts[1])
        out["train"] = {"num_steps": 875}
    elif name.startswith("t14_"):  # Table 14: the small T5, one seed, 110M target tokens of 4,096 a step
        if parts[1] == "hybrid":
            out.update(tied=("adamw", AUX_LR, 0.01), vector=("adamw", AUX_LR, 0.01))
        else:
            out.update(tied=("lmo", *AF), vector=("rms", AUX_LR, 0.0), rho=float(parts[2][3:]))
        out.update(seeds=(43,), train={"num_steps": 110_000_000 // 4096})
    elif name.startswith("t25_"):  # Table 25: AdamW lr pilot, seed 43, 500 steps / 32.77M tokens
        lr = float(parts[2][2:].replace("m", "-"))
        out.update(adamw=(lr, 0.1, 1e-8, (0.9, 0.95)), seeds=(43,),
                   train={"num_steps": 500, "total_batch_size": 65_536, "sequence_len": 512, "device_batch_size": 32})
    elif name == "t15_untied_hybrid":  # Table 15: three tables and the vectors on Hybrid's AdamW
        out.update(untied=("adamw", AUX_LR, 0.01))
    elif name == "k9_reuse_hybrid":  # K.9: Muon 0.02 / aux 3e-4, wd 0.1 / 0.01; input, positional and head tables
        out.update(untied=("adamw", AUX_LR, 0.01), seeds=(43,))
    else:
        raise AssertionError(f"no paper values typed for {name}")
    return out


SEED004 = sorted(a.name for a in ARMS.values() if a.paper == "seed 004")


def test_the_papers_ablations_are_all_registered():
    names = set(SEED004)
    assert {f"k5_{o}_b{b}" for o in ("hybrid", "sign", "afmuon") for b in K5_STEPS} <= names
    assert len([n for n in names if n.startswith("k6_")]) == 3 * len(K6_LRS)
    assert all(b * 1024 * K5_STEPS[b] == 458_752_000 for b in K5_STEPS)  # "compared at 458.8M tokens"


@pytest.mark.parametrize("name", SEED004)
def test_arm_builds_the_papers_optimizer(name):
    want = expected(name)
    # K.2's vocabularies and K.4's widths are checked at the paper's preset (the CPU one's head dim is 32)
    preset = ("reuse-cpu" if name.startswith("k9_") else "t5-cpu" if "untied" in want or name.startswith("t14_")
              else "protein-cpu" if name.startswith("t25_") else "nanogpt-124m" if name[:2] in ("k2", "k3", "k4")
              else "tied-cpu")
    # the CPU presets scale the Muon lr to their batch (cpu_matrix_lr); the arm is checked at the paper's
    cfg = resolve_config(name, preset, {"optim.matrix_lr": MUON_LR} if preset.endswith("-cpu") and "adamw" not in want else {})
    assert ARMS[name].seeds == want["seeds"]
    for key, value in want["train"].items():
        assert getattr(cfg.train, key) == value, key
    assert getattr(cfg.model, "grad_source", "both") == want["grad_source"]
    for section in ("data", "model"):
        for key, value in want.get(section, {}).items():
            assert getattr(getattr(cfg, section), key) == value, key
    if name[:2] in ("k2", "k3", "k4"):  # shape only: the paper's widths and tables are large for a CPU test
        model = build_model(cfg, 300, Runtime(torch.device("meta"), "fp32"))
    else:
        model = build_model(cfg, 300, Runtime(torch.device("cpu"), "fp32"))
    optimizer = build_optimizer(model, cfg, compile_step=False)
    if "adamw" in want:
        lr, wd, eps, betas = want["adamw"]
        assert isinstance(optimizer, torch.optim.AdamW)
        d = optimizer.defaults
        assert (d["lr"], d["weight_decay"], d["eps"], d["betas"]) == (lr, wd, eps, betas)
        return
    groups = {g["part"]: g for g in optimizer.param_groups}
    assert groups["matrix"]["role"] == "matrix"
    assert (groups["matrix"]["lr"], groups["matrix"]["weight_decay"]) == (MUON_LR, 0.1)
    if "untied" in want:
        rule, lr, wd = want["untied"]
        for part in ("tables", "vector"):
            assert (groups[part]["role"], groups[part]["lr"], groups[part]["weight_decay"]) == (rule, lr, wd)
        assert len(groups["tables"]["params"]) == 3  # encoder, decoder and head tables
        return
    tied, vector = groups["tied"], groups["vector"]
    if want["tied"][0] == "lmo":
        assert tied["role"] == "tied" and (tied["cap"], tied["scale"]) == want["tied"][1:]
        assert (tied["rho"], tied["lr"], tied["weight_decay"]) == (want.get("rho", RHO), MUON_LR, 0.0)
    else:
        assert tied["role"] == "adamw"
        assert tied["lr"] == pytest.approx(want["tied"][1], rel=1e-12) and tied["weight_decay"] == want["tied"][2]
    rule, lr, wd = want["vector"]
    assert vector["role"] == ("vector" if rule == "rms" else "adamw")
    assert vector["lr"] == pytest.approx(lr, rel=1e-12) and vector["weight_decay"] == wd


@pytest.mark.parametrize("preset, rho", [("t5-cpu", 1.0), ("t5-small", 1.0), ("imagegpt-cpu", RHO), ("hf-cpu", RHO)])
def test_table1_arms_run_under_every_family_with_its_rho(preset, rho):
    """Seed 004 Table 14: the small T5 runs rho_out / rho_hid = 1; every other setting 60."""
    cfg = resolve_config("t1_afmuon", preset, {})
    assert cfg.optim.kind == "afmuon" and cfg.optim.rho == rho


@pytest.mark.parametrize("name", [n for n in SEED004 if n[:2] in ("k2", "k4")])
def test_k2_k4_models_have_the_papers_parameter_counts(name):
    """K.2: 123.4M / 161.8M / 200.2M at 50k / 100k / 150k tokens (d 768); K.4: 123.4M / 202.2M / 416.6M at
    d 768 / 1024 / 1536 with the 50k vocabulary (12 layers, MLP 4d, head dim 128)."""
    cfg = resolve_config(name, "nanogpt-124m", {})
    vocab = cfg.data.vocab_size if name.startswith("k2_") else 50_000
    model = build_model(cfg, vocab, Runtime(torch.device("meta"), "fp32"))
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    want = K2_PARAMS_M[vocab] if name.startswith("k2_") else K4_PARAMS_M[cfg.model.n_embd]
    assert round(params / 1e6, 1) == want
    assert model.config.n_embd // model.config.n_head == 128 and model.config.n_layer == 12  # K.4's head dim
