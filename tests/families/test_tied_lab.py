"""Seed 004 in the lab: tied-GPT arms through the CLI, validation, gradient source, Hugging Face families."""

import json

import pytest
import torch

from muonlab.arms import ARMS, default_seeds, resolve_config
from muonlab.cli import main
from muonlab.errors import UsageError
from muonlab.families.tied.model import build_tied_model

SEED004 = sorted(a.name for a in ARMS.values() if a.paper == "seed 004")


def test_seed004_arms_and_seeds():
    assert {"t1_hybrid", "t1_sign", "t1_afmuon", "k1_lmo_rms", "k1_adamw_adamw", "k7_cinf_s0p5", "k8_lookup"} <= set(SEED004)
    assert default_seeds(["t1_hybrid", "t1_sign", "t1_afmuon"]) == [43, 44, 45]
    assert ARMS["k3_s0p25"].seeds == (43,) and ARMS["k3_s0p25"].overrides["optim.scale"] == 0.25
    assert len([a for a in SEED004 if a.startswith("k7_")]) == 14


@pytest.mark.parametrize("arm", ["t1_hybrid", "t1_sign", "t1_afmuon", "k1_lmo_adamw", "k1_adamw_rms", "k3_s0p125",
                                 "k7_c1_s0p5", "k7_cinf_s1p0", "k8_lookup", "k8_softmax"])
def test_tied_arm_trains_on_the_cpu_preset(arm, capsys):
    # K.3's 50k BPE cannot be trained on the CPU corpus: the command line's vocabulary overrides the arm's
    vocab = ["--vocab-size", "300"] if arm.startswith("k3_") else []
    assert main(["train", "--preset", "tied-cpu", "--arm", arm, "--num-steps", "3", "--json", *vocab]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "ok" and 0 < out["summary"]["val_bpb"] < 20


def test_partition_tells_an_mlp_from_an_untied_head():
    """tied-tiny's MLP up-projection is (4d, d) = (256, 64) = (V, d): still a matrix, not a head."""
    from muonlab.optim.af_muon import partition_by_role
    roles = partition_by_role(build_tied_model("tied-tiny"))
    assert "blocks.0.mlp.fc.weight" in [n for n, _ in roles["matrix"]] and len(roles["tied"]) == 1


def test_tied_settings_are_validated():
    with pytest.raises(UsageError, match="does not act on model family autoresearch"):
        resolve_config("baseline", "cpu-tiny", {"optimizer": "afmuon"})
    with pytest.raises(UsageError, match=r"\(optim.kind\) must be one of"):
        resolve_config("baseline", "tied-cpu", {"optimizer": "muon_adamw"})
    with pytest.raises(UsageError, match=r"\(optim\.cap\) must be >= 1, got 0\.5"):
        resolve_config("t1_afmuon", "tied-cpu", {"af_cap": 0.5})
    with pytest.raises(UsageError, match=r"grad_source\) must be one of"):
        resolve_config("t1_afmuon", "tied-cpu", {"tied_grad_source": "x"})
    assert resolve_config("t1_afmuon", "nanogpt-124m").model.preset == "nanogpt-124m"


def test_gradient_source_intervention_splits_the_merged_gradient():
    """K.8: lookup-only + softmax-only gradients of the tied table add up to the merged one."""
    grads = {}
    for source in ("both", "lookup", "softmax"):
        torch.manual_seed(0)
        model = build_tied_model("tied-tiny", grad_source=source).double()
        idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
        model(idx, idx.roll(-1, 1)).backward()
        grads[source] = model.wte.weight.grad
    torch.testing.assert_close(grads["lookup"] + grads["softmax"], grads["both"], rtol=1e-10, atol=1e-12)
    used = torch.zeros(256, dtype=torch.bool)
    used[idx.flatten()] = True
    assert torch.all(grads["lookup"][~used] == 0) and torch.any(grads["lookup"][used] != 0)


# ---------------------------------------------------------------- Hugging Face families

@pytest.fixture
def transformers():
    """The Hugging Face tests skip without transformers (a worker imports it at its start where it is installed:
    tests/conftest.py), with the Llama classes the families build."""
    module = pytest.importorskip("transformers")
    pytest.importorskip("transformers.models.llama.modeling_llama")
    return module


@pytest.mark.parametrize("name,total", [("smollm2-135m", 134_515_008), ("llama-3.2-1b", 1_235_814_400)])
def test_hf_family_parameter_counts(name, total, transformers):
    from muonlab.families.tied.hf.model import build_hf_model, unique_parameter_count
    model = build_hf_model(name, device="meta")
    assert unique_parameter_count(model) == total  # seed 004 §3 (the public configs)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_afmuon_trains_a_tiny_random_init_llama_with_tied_embeddings(transformers):
    from muonlab.optim import build_optimizer
    from muonlab.families.tied.hf.model import build_hf_model
    torch.manual_seed(0)
    model = build_hf_model("tiny-llama", max_positions=64)
    opt = build_optimizer(model, "afmuon")
    assert set(opt.roles) == {"matrix", "tied", "vector"} and opt.roles["tied"] == ["model.embed_tokens.weight"]
    idx = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(2))
    losses = []
    for _ in range(6):
        loss = model(input_ids=idx, labels=idx).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert losses[-1] < losses[0] - 0.1, losses
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_afmuon_diagnostics_endpoints_and_cli(tmp_path, capsys):
    from muonlab.papers.seed004.diagnostics.afmuon import tied_diagnostics
    g = torch.Generator().manual_seed(0)
    B = torch.randn(40, 16, generator=g) * torch.rand(40, 1, generator=g)
    B[3] = 0  # an inactive row
    B[5, :8] = 0  # a sparse row
    sign = tied_diagnostics(B, 1.0)
    assert sign["coord_capped"] == 1.0 and sign["objective_ratio"] == pytest.approx(1.0)
    assert sign["cos_sign"] == pytest.approx(1.0) and sign["active_rows"] == 39
    rms = tied_diagnostics(B, float("inf"))
    assert rms["coord_capped"] == 0.0 and rms["rows_clipped"] == 0.0 and rms["tail_energy"] == 0.0
    mid = tied_diagnostics(B, 2.0)
    assert 1.0 <= mid["objective_ratio"] <= rms["objective_ratio"] + 1e-9  # <B, L_c(B)> grows with c
    assert 0 < mid["rows_clipped"] < 1 and sign["tail_energy"] > mid["tail_energy"] > 0  # tail shrinks as c grows
    assert main(["train", "--preset", "tied-cpu", "--arm", "t1_afmuon", "--num-steps", "3", "--json"]) == 0
    run_dir = json.loads(capsys.readouterr().out)["run_dir"]
    assert main(["diagnose", "afmuon", "--run", run_dir, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["cap"] == 3.0 and 0 < res["cos_sign"] <= 1
