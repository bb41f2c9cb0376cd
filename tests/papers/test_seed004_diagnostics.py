"""Seed 004's diagnostics from the command line: Table 3's tied-table and matrix RMS in every tied run's
record, Table 19's router statistics per evaluation, and `muonlab diagnose tied` (Table 3, K.8's
lookup / softmax row coverage and cosine) on a run's next optimizer step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from muonlab.cli import main
from muonlab.families.tied.model import build_tied_model
from muonlab.families.tied.moe import RouterCounts, TopKMoE
from muonlab.families.tied.reuse.model import SharedMLPConfig, SharedMLPLM
from muonlab.families.tied.afmuon import table_stats


def _random_tied(preset="tied-tiny", seed=0):
    torch.manual_seed(seed)
    model = build_tied_model(preset)
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(torch.rand_like(p) * 3)  # unequal scales, so the pooling of matrices shows
    return model


def test_table3_statistics_match_a_numpy_transcription():
    model = _random_tied()
    named = {n: p.detach().numpy().astype(np.float64) for n, p in model.named_parameters()}
    table = named.pop("wte.weight")
    matrices = [v for v in named.values() if v.ndim >= 2]
    want = {"tied_rms": np.sqrt(np.mean(table ** 2)), "tied_max": np.abs(table).max(),
            "matrix_rms": np.sqrt(sum((m ** 2).sum() for m in matrices) / sum(m.size for m in matrices))}
    got = table_stats(model)
    assert got.keys() == want.keys()
    for key in want:
        assert math.isclose(got[key], want[key], rel_tol=1e-12), key


def test_an_untied_model_has_no_table3():
    assert table_stats(SharedMLPLM(SharedMLPConfig(vocab_size=32, n_embd=16, ff_hidden=32, sequence_len=8))) == {}


def test_router_statistics_over_a_pass_match_an_independent_count():
    model = _random_tied("tied-tiny-moe", seed=3)
    layers = [m for m in model.modules() if isinstance(m, TopKMoE)]
    seen = {i: [] for i in range(len(layers))}
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: seen[i].append(a[0].detach()))
             for i, layer in enumerate(layers)]
    batches = [torch.randint(0, 256, (2, 32)) for _ in range(3)]
    with torch.no_grad(), RouterCounts(model) as router:
        for x in batches:
            model(x, x)
    for h in hooks:
        h.remove()
    per_layer = []
    for i, layer in enumerate(layers):  # top-1 = argmax of the router logits, counted over every pass
        logits = torch.cat([layer.router(x.reshape(-1, x.size(-1))) for x in seen[i]])
        counts = np.bincount(logits.argmax(dim=-1).numpy(), minlength=layer.n_experts).astype(np.float64)
        frac = counts / counts.sum()
        p = frac[frac > 0]
        per_layer.append((-(p * np.log(p)).sum() / np.log(len(counts)), frac.max(), frac.std() / frac.mean(),
                          (counts == 0).sum()))
    got = router.stats()
    assert math.isclose(got["router_entropy"], np.mean([s[0] for s in per_layer]), rel_tol=1e-6)
    assert math.isclose(got["router_max_frac"], np.mean([s[1] for s in per_layer]), rel_tol=1e-6)
    assert math.isclose(got["router_cv"], np.mean([s[2] for s in per_layer]), rel_tol=1e-5)
    assert got["router_unused_experts"] == sum(s[3] for s in per_layer)
    assert sum(float(c.sum()) for c in router.counts) == len(layers) * sum(x.numel() for x in batches)


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    runs = tmp / "runs"
    assert main(["train", "--preset", "tied-cpu", "--tied-preset", "tied-tiny-moe", "--arm", "t1_afmuon",
                 "--num-steps", "4", "--eval-every", "2", "--cache-dir", str(tmp / "cache"), "--runs-dir",
                 str(runs), "--quiet"]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return run_dir


def test_a_tied_run_records_table3_and_router_statistics_per_evaluation(moe_run):
    rows = [json.loads(line) for line in open(moe_run / "metrics.jsonl")]
    evals = [r for r in rows if "val_ce" in r]
    assert [r["step"] for r in evals] == [1, 3] and all(0 < r["val_router_entropy"] <= 1 for r in evals)
    (record,) = [json.loads(line) for line in open(moe_run.parent / "ledger.jsonl")]
    m = record["metrics"]
    assert m["val_router_entropy"] == evals[-1]["val_router_entropy"]  # the last eval is the final one
    model = build_tied_model("tied-tiny-moe", vocab_size=m["param_counts"]["tied_table"] // 64, sequence_len=64)
    model.load_state_dict(torch.load(moe_run / "model.pt", weights_only=True))
    want = table_stats(model)
    summary = json.loads((moe_run / "summary.json").read_text())
    assert {k: m[k] for k in want} == want and {k: summary[k] for k in want} == want


def test_diagnose_tied_measures_a_full_step_of_the_run(moe_run, capsys):
    from muonlab.diagnostics.runs import capture_batches
    from muonlab.diagnostics.runs import load_run

    assert main(["diagnose", "tied", "--run", str(moe_run), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    loaded = load_run(moe_run)
    batches = capture_batches(loaded)
    V = loaded.model.wte.weight.shape[0]
    ids = torch.cat([x.flatten() for x, _ in batches]).unique()
    assert res["micro_batches"] == len(batches) == loaded.cfg.train.accum_steps_per_rank(1)
    assert math.isclose(res["lookup_rows"], ids.numel() / V, rel_tol=1e-6)  # K.8: the rows the step's inputs read
    assert res["softmax_rows"] == 1.0 and -1 <= res["cosine"] <= 1  # every row is a softmax class
    assert {k: res[k] for k in ("tied_rms", "tied_max", "matrix_rms")} == table_stats(loaded.model)
    assert 0 < res["router_entropy"] <= 1 and res["paper"]["tied_rms"] == pytest.approx(0.3855, abs=1e-4)


def test_diagnose_tied_refuses_an_untied_run(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["train", "--preset", "reuse-cpu", "--num-steps", "2", "--cache-dir", str(tmp_path / "cache"),
                 "--runs-dir", str(runs), "--quiet"]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    assert main(["diagnose", "tied", "--run", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "reads a tied token table" in err and "is a reuse run" in err and "\n" not in err


# --- Table 27: optimizer state and step time ------------------------------------------------------
def test_overhead_state_is_one_fp32_buffer_per_tensor_plus_adamws_second_moment(capsys):
    """Analytic (meta) state = the state real steps create = 4 bytes per trained element, and Hybrid
    4 more per element of its AdamW tensors (the tied table and the vectors)."""
    from muonlab.papers.seed004.diagnostics.overhead import ArmStepper, default_vocab

    assert main(["diagnose", "overhead", "--preset", "tied-cpu", "--steps", "1", "--warmup", "0", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    model = ArmStepper("t1_afmuon", "tied-cpu", default_vocab("tied-cpu"), torch.device("cpu")).model
    elements = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    adamw = model.wte.weight.numel() + sum(p.numel() for p in model.parameters() if p.ndim <= 1)
    want = {"t1_afmuon": 4 * elements, "t1_sign": 4 * elements, "t1_hybrid": 4 * (elements + adamw)}
    for arm, row in res["arms"].items():
        assert row["state_bytes"] == row["measured_state_bytes"] == want[arm], arm
        assert row["step_s"] > 0 and row["peak_gib"] is None  # peak memory is measured on CUDA only
    assert res["state_ratio"] == pytest.approx(want["t1_afmuon"] / want["t1_hybrid"], rel=1e-12)


def test_overhead_at_the_paper_shapes_beside_table27():
    """Qwen2.5-0.5B and Llama-3.2-1B: the saving the paper prints follows from the shapes (our
    check); NanoGPT's printed sizes do not, and the table names the difference."""
    from muonlab.papers.seed004.diagnostics.overhead import format_table, measure

    for preset in ("qwen2.5-0.5b", "llama-3.2-1b"):
        res = measure(preset, steps=0)
        assert abs(res["state_saved"] - res["paper"]["state_saved"]) < 0.002, preset
    res = measure("nanogpt-124m", steps=0)
    assert res["arms"]["t1_afmuon"]["state_bytes"] == 4 * 123_587_328  # 123,587,328 parameters, derived from seed 004 App. J.1 shapes
    assert "+1.6 points" in format_table(res)


def test_overhead_refuses_negative_steps(capsys):
    assert main(["diagnose", "overhead", "--preset", "tied-cpu", "--steps", "-1"]) == 2
    assert "argument --steps: must be >= 0, got -1" in capsys.readouterr().err


# --- records that tell the truth -----------------------------------------------------------------
def test_the_record_gives_the_optimizer_as_built(moe_run):
    (record,) = [json.loads(line) for line in open(moe_run.parent / "ledger.jsonl")]
    groups = {g["part"]: g for g in record["optimizer_groups"]}
    summary = json.loads((moe_run / "summary.json").read_text())
    assert summary["optimizer_groups"] == record["optimizer_groups"]
    d = 64  # tied-tiny-moe's width
    lr = 0.02 * (512 / 524_288) ** 0.5  # the CPU preset's Muon lr: the paper's, scaled to its 512-token batch
    assert groups["tied"]["effective_lr"] == pytest.approx(lr * 60 * 0.5 / d, rel=1e-12)  # eq. 6
    assert (groups["tied"]["cap"], groups["tied"]["scale"], groups["tied"]["rho"]) == (3.0, 0.5, 60.0)
    assert groups["matrix"]["lr"] == pytest.approx(lr, rel=1e-12)
    assert (groups["matrix"]["momentum"], groups["matrix"]["weight_decay"]) == (0.95, 0.1)
    assert "cap" not in groups["matrix"] and "weight_decay" not in groups["tied"]  # what the role does not read
    assert (groups["vector"]["lr"], groups["vector"]["eps"]) == (3e-4, 1e-8)
    assert sum(g["elements"] for g in record["optimizer_groups"]) == record["metrics"]["param_counts"]["total"]


def _width_and_depth(model) -> tuple[int, int]:
    """The built model's width and depth, read off each model class."""
    cfg = getattr(model, "config", None)
    if hasattr(model, "model") and hasattr(model.model.config, "num_hidden_layers"):  # Hugging Face causal LM
        return model.model.config.hidden_size, model.model.config.num_hidden_layers
    if hasattr(model, "model"):  # T5Gemma2: encoder + decoder stacks
        text = model.model.config.decoder
        return text.hidden_size, len(model.model.model.encoder.text_model.layers) + len(model.model.model.decoder.layers)
    if hasattr(cfg, "n_encoder_layers"):
        return cfg.n_embd, cfg.n_encoder_layers + cfg.n_decoder_layers
    return model.get_input_embeddings().weight.shape[1], cfg.n_layer


@pytest.mark.parametrize("preset, extra", [("tied-cpu", {}), ("tied-cpu", {"tied_n_embd": 128}), ("t5-cpu", {}),
                                           ("t5gemma2-cpu", {}), ("imagegpt-cpu", {}), ("hf-cpu", {}),
                                           ("reuse-cpu", {})])
def test_the_logged_shape_is_the_built_models(preset, extra):
    import re

    from muonlab.arms import resolve_config
    from muonlab.device import Runtime
    from muonlab.families import get_family
    from muonlab.train.build import build_model

    cfg = resolve_config("t1_hybrid" if preset != "reuse-cpu" else "k9_reuse_hybrid", preset, extra)
    model = build_model(cfg, 300, Runtime(torch.device("meta"), "fp32"))
    width, depth = _width_and_depth(model)
    assert model.get_input_embeddings().weight.shape[1] == width
    assert f"width {width}" in cfg.describe_model()
    layers = [int(n) for n in re.findall(r"(\d+) (?:\+ (\d+) )?layers|depth (\d+)|at (\d+) depths",
                                         cfg.describe_model())[0] if n]
    assert sum(layers) == depth == get_family(cfg.family).depth(cfg)
