"""The baseline against the upstream reference bundles (teacher-forced, shared/reference/README.md).

Every check runs on the small bundles shipped in tests/golden and, where ../shared is present,
on the shared ones too (fixtures in conftest.py).
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import muonlab.model.gpt as gpt_module
import muonlab.optim.muon_adamw as muon_module
import muonlab.optim.steps as steps_module
import muonlab.optim.polar as polar_module
from muonlab.cli import main
from muonlab.reference import verify_bundle
from muonlab.reference.record import record_bundle

from support.bundles import SHIPPED_BUNDLES

_RECORDER = Path(__file__).parents[1] / "golden" / "record_upstream_bundles.py"
_spec = importlib.util.spec_from_file_location("record_upstream_bundles", _RECORDER)
recorder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recorder)


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_bundles_pass_via_cli(reference_bundle, capsys):
    bundle = _load(reference_bundle)
    assert main(["verify-reference", str(reference_bundle), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and all(report["checks"].values())
    assert reference_bundle.stem.endswith("_" + report["precision"])
    # every per-tensor figure is in the JSON: every recorded step x every upstream parameter
    names = set(bundle["init_state_dict"])
    assert len(report["steps"]) == len(bundle["steps"]) == bundle["batches_x"].shape[0]
    assert all(set(s["grad_errors"]) == set(s["update_errors"]) == names for s in report["steps"])
    last = bundle["model_config"]["n_layer"] - 1  # the last layer always has a value embedding
    assert f"transformer.h.{last}.attn.ve_gate.weight" in names


def test_table_output(fp32_reference_bundle, capsys):
    assert main(["verify-reference", str(fp32_reference_bundle)]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "update err" in out


def test_shipped_bundles_say_where_they_come_from():
    for precision, path in SHIPPED_BUNDLES.items():
        source = _load(path)["source"]
        assert len(source["upstream_commit"]) == 40 and not source["upstream_train_py_modified"]
        assert source["recorder"] == "tests/golden/record_upstream_bundles.py"
        assert _load(path)["precision"] == precision


def _max_update_error(report):
    return max(s.worst("update")[1] for s in report.steps)


def test_wrong_frobenius_safety_is_caught(fp32_reference_bundle, monkeypatch):
    monkeypatch.setattr(polar_module, "FROBENIUS_SAFETY", 1.0)
    report = verify_bundle(fp32_reference_bundle)
    assert not report.passed and _max_update_error(report) > 0.08


def test_four_polar_steps_is_caught(fp32_reference_bundle, monkeypatch):
    real = steps_module.polar_express
    monkeypatch.setattr(steps_module, "polar_express", lambda g, steps: real(g, 4))
    report = verify_bundle(fp32_reference_bundle)
    assert not report.checks()["update"]


def test_missing_shape_factor_is_caught(fp32_reference_bundle, monkeypatch):
    real = muon_module.muon_step

    def no_shape_factor(grads, params, mbuf, vbuf, mom, lr_t, wd_t, beta2_t, ns, red):
        rows, cols = params.shape[-2:]
        real(grads, params, mbuf, vbuf, mom, lr_t / max(1.0, rows / cols) ** 0.5, wd_t, beta2_t, ns, red)

    monkeypatch.setattr(muon_module, "muon_step", no_shape_factor)
    report = verify_bundle(fp32_reference_bundle)
    assert not report.checks()["update"]


def test_wrong_rope_base_is_caught_by_forward_checks(fp32_reference_bundle, monkeypatch):
    real = gpt_module.rotary_tables
    monkeypatch.setattr(gpt_module, "rotary_tables", lambda *a, **k: real(*a, **k, base=500.0))
    report = verify_bundle(fp32_reference_bundle)
    checks = report.checks()
    assert not checks["loss"] and not checks["grad"] and not checks["eval"]


def test_full_attention_instead_of_window_is_caught(fp32_reference_bundle, monkeypatch):
    # only a layer whose window is shorter than the sequence ("S": half of it) can tell
    cfg = _load(fp32_reference_bundle)["model_config"]
    pattern = cfg["window_pattern"].upper()
    assert any(pattern[i % len(pattern)] == "S" for i in range(cfg["n_layer"] - 1))
    monkeypatch.setattr(gpt_module.GPT, "_compute_window_sizes",
                        staticmethod(lambda c: [(c.sequence_len, 0)] * c.n_layer))
    report = verify_bundle(fp32_reference_bundle)
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


def test_recorder_loads_only_upstream_definitions(tmp_path):
    # a stand-in for upstream's train.py: its script part must not run, torch.compile must be off
    train_py = tmp_path / "train.py"
    train_py.write_text(
        "import torch\nfrom kernels import get_kernel\nfa3 = get_kernel('x').flash_attn_interface\n"
        "from prepare import MAX_SEQ_LEN\nSCALE = 2.0\n"
        "@torch.compile(dynamic=False)\ndef scaled(x):\n    return SCALE * x\n"
        "raise SystemExit('the training loop ran')\n")
    module = recorder.load_upstream(train_py)
    assert module.scaled(torch.ones(2)).tolist() == [2.0, 2.0]
    assert module.scaled.__code__.co_filename == str(train_py)  # not a torch.compile wrapper
    assert module.fa3.flash_attn_func is recorder.sdpa_window_attention
    with pytest.raises(SystemExit, match="GPT"):
        recorder.check_upstream(module)


@pytest.mark.parametrize("left", [0, 3, 9])
def test_recorder_attention_sees_the_left_window(left):
    # query i attends to keys i - left .. i (shared/reference/README.md), with GQA
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 9, h, 4, generator=g, dtype=torch.float64) for h in (2, 1, 1))
    y = recorder.sdpa_window_attention(q, k, v, causal=True, window_size=(left, 0))
    for i in range(9):
        keys = slice(max(0, i - left), i + 1)
        w = torch.softmax(q[0, i] @ k[0, keys, 0].T / 2.0, dim=-1)  # 1/sqrt(head_dim 4)
        assert torch.allclose(y[0, i], w @ v[0, keys, 0])
