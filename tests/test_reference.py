"""The baseline against the upstream reference bundles (teacher-forced, shared/reference/README.md)."""

import json

import pytest
import torch

import muonlab.model.gpt as gpt_module
import muonlab.optim.muon_adamw as muon_module
import muonlab.optim.polar as polar_module
from muonlab.cli import main
from muonlab.reference import verify_bundle
from muonlab.reference.record import record_bundle

from conftest import reference_bundle


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_shared_bundles_pass_via_cli(precision, capsys):
    path = reference_bundle(precision)
    assert main(["verify-reference", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and all(report["checks"].values())
    assert report["precision"] == precision
    # every per-tensor figure is in the JSON: 4 steps x every parameter
    step = report["steps"][0]
    assert "transformer.h.1.attn.ve_gate.weight" in step["update_errors"]
    assert len(report["steps"]) == 4 and len(step["grad_errors"]) == 18


def test_table_output(capsys):
    assert main(["verify-reference", str(reference_bundle("fp32"))]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "update err" in out


def _max_update_error(report):
    return max(s.worst("update")[1] for s in report.steps)


def test_wrong_frobenius_safety_is_caught(monkeypatch):
    monkeypatch.setattr(polar_module, "FROBENIUS_SAFETY", 1.0)
    report = verify_bundle(reference_bundle("fp32"))
    assert not report.passed and _max_update_error(report) > 0.08


def test_four_polar_steps_is_caught(monkeypatch):
    real = muon_module.polar_express
    monkeypatch.setattr(muon_module, "polar_express", lambda g, steps: real(g, 4))
    report = verify_bundle(reference_bundle("fp32"))
    assert not report.checks()["update"]


def test_missing_shape_factor_is_caught(monkeypatch):
    real = muon_module.muon_step

    def no_shape_factor(grads, params, mbuf, vbuf, mom, lr_t, wd_t, beta2_t, ns, red):
        rows, cols = params.shape[-2:]
        real(grads, params, mbuf, vbuf, mom, lr_t / max(1.0, rows / cols) ** 0.5, wd_t, beta2_t, ns, red)

    monkeypatch.setattr(muon_module, "muon_step", no_shape_factor)
    report = verify_bundle(reference_bundle("fp32"))
    assert not report.checks()["update"]


def test_wrong_rope_base_is_caught_by_forward_checks(monkeypatch):
    real = gpt_module.rotary_tables
    monkeypatch.setattr(gpt_module, "rotary_tables", lambda *a, **k: real(*a, **k, base=500.0))
    report = verify_bundle(reference_bundle("fp32"))
    checks = report.checks()
    assert not checks["loss"] and not checks["grad"] and not checks["eval"]


def test_full_attention_instead_of_window_is_caught(monkeypatch):
    # the bundle's sequence is 32 and its S window 16: full attention changes the loss
    monkeypatch.setattr(gpt_module.GPT, "_compute_window_sizes",
                        staticmethod(lambda c: [(c.sequence_len, 0)] * c.n_layer))
    report = verify_bundle(reference_bundle("fp32"))
    assert not report.checks()["loss"]


@pytest.mark.parametrize("precision,shape", [
    ("fp32", dict(sequence_len=24, vocab_size=96, n_layer=3, n_head=2, n_kv_head=1, n_embd=64, window_pattern="SL")),
    ("bf16", dict(sequence_len=16, vocab_size=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=128, window_pattern="L")),
])
def test_other_shapes_and_a_tampered_bundle(tmp_path, precision, shape):
    bundle = record_bundle(shape, precision=precision, steps=3)
    path = tmp_path / "bundle.pt"
    torch.save(bundle, path)
    assert verify_bundle(path).passed
    # a bundle whose recorded update was perturbed must fail the update check
    name = "transformer.h.0.attn.c_q.weight"
    bundle["steps"][2]["params"][name] = bundle["steps"][2]["params"][name] * 1.01
    torch.save(bundle, path)
    report = verify_bundle(path)
    assert not report.checks()["update"]


def test_bad_bundles_exit_2(tmp_path, capsys):
    wrong = tmp_path / "wrong.pt"
    torch.save({"format": "something-else/1"}, wrong)
    assert main(["verify-reference", str(wrong)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "autoresearch-reference/1" in err and "\n" not in err
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    assert main(["verify-reference", str(garbage)]) == 2
    assert main(["verify-reference", str(tmp_path / "missing.pt")]) == 2
