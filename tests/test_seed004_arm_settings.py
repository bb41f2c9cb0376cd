"""Every seed-004 arm's optimizer as built, against the paper's values (spec-004 §3 and App. K,
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


def expected(name: str) -> dict:
    """tied: ("lmo", c, s) or ("adamw", lr, wd); vector: ("rms" | "adamw", lr, wd); seeds; train."""
    out = {"seeds": (43, 44, 45), "train": {}, "grad_source": "both"}
    parts = name.split("_")
    if name.startswith("t1_") or name.startswith(("k5_", "k6_")):
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
    elif name.startswith("k1_"):  # K.1: zero auxiliary weight decay in all four arms
        tied, vec = parts[1], parts[2]
        out["tied"] = ("lmo", *AF) if tied == "lmo" else ("adamw", AUX_LR, 0.0)
        out["vector"] = ("rms", AUX_LR, 0.0) if vec == "rms" else ("adamw", AUX_LR, 0.0)
    elif name.startswith("k3_"):
        out.update(tied=("lmo", 3.0, float(parts[1][1:].replace("p", "."))), vector=("rms", AUX_LR, 0.0),
                   seeds=(43,))
    elif name.startswith("k7_"):
        c = math.inf if parts[1] == "cinf" else float(parts[1][1:])
        out.update(tied=("lmo", c, float(parts[2][1:].replace("p", "."))), vector=("rms", AUX_LR, 0.0))
    elif name.startswith("k8_"):
        out.update(tied=("lmo", *AF), vector=("rms", AUX_LR, 0.0), seeds=(43,), grad_source=parts[1])
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
    cfg = resolve_config(name, "tied-cpu", {})
    assert ARMS[name].seeds == want["seeds"]
    for key, value in want["train"].items():
        assert getattr(cfg.train, key) == value, key
    assert cfg.model.grad_source == want["grad_source"]
    model = build_model(cfg, 300, Runtime(torch.device("cpu"), "fp32"))
    groups = {g["part"]: g for g in build_optimizer(model, cfg, compile_step=False).param_groups}
    assert groups["matrix"]["role"] == "matrix"
    assert (groups["matrix"]["lr"], groups["matrix"]["weight_decay"]) == (MUON_LR, 0.1)
    tied, vector = groups["tied"], groups["vector"]
    if want["tied"][0] == "lmo":
        assert tied["role"] == "tied" and (tied["cap"], tied["scale"]) == want["tied"][1:]
        assert (tied["rho"], tied["lr"], tied["weight_decay"]) == (RHO, MUON_LR, 0.0)
    else:
        assert tied["role"] == "adamw"
        assert tied["lr"] == pytest.approx(want["tied"][1], rel=1e-12) and tied["weight_decay"] == want["tied"][2]
    rule, lr, wd = want["vector"]
    assert vector["role"] == ("vector" if rule == "rms" else "adamw")
    assert vector["lr"] == pytest.approx(lr, rel=1e-12) and vector["weight_decay"] == wd
