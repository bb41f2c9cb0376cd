"""Seed 004's T5Gemma2-style setting (Table 1 row 6, App. J.5, Table 16): the google/t5gemma-2-270m-270m
configuration at random init with its encoder lookup, decoder lookup and head one table, in the t5 family."""

from __future__ import annotations

import contextlib
import importlib
import json
import math

import pytest
import torch

from muonlab.arms import resolve_config
from muonlab.cli import main
from muonlab.optim.af_muon import GradientSources, build_optimizer, partition_by_role
from muonlab.families.tied.t5.t5gemma2 import PAPER_NUM_PARAMETERS, PAPER_VOCAB, T5GEMMA2_MODELS, build_t5gemma2, num_parameters


@pytest.fixture(scope="module", autouse=True)
def _model_classes_imported():
    """transformers' T5Gemma2 classes imported before the tests' calls: a worker's first import of them (~2 CPU s)
    is this module's setup, not the budgeted call of whichever test happens to come first."""
    with contextlib.suppress(ImportError):
        importlib.import_module("transformers.models.t5gemma2.modeling_t5gemma2")


def _trainable_count(text: dict) -> int:
    """The text stacks' parameters from the configuration numbers (Gemma 3 layers: q/k/v/o, q/k norms,
    four layer norms, gated MLP; a final norm per stack; the shared table and eoi embedding once)."""
    d, h, kv, hd, ff, L = (text[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                             "intermediate_size", "num_hidden_layers"))
    layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 2 * hd + 4 * d + 3 * d * ff
    return 2 * L * layer + 2 * d + d + text["vocab_size"] * d


def test_paper_shape_has_the_papers_parameter_count():
    with torch.device("meta"):
        model = build_t5gemma2("t5gemma2-270m")
    assert num_parameters(model) == PAPER_NUM_PARAMETERS  # afmoun README (not printed in seed 004): 786,029,296
    text = T5GEMMA2_MODELS["t5gemma2-270m"][0]
    assert text["vocab_size"] == PAPER_VOCAB and num_parameters(model, trainable=True) == _trainable_count(text)
    assert model.get_input_embeddings().weight.shape == (PAPER_VOCAB, 640)


def _tiny(vocab=96):
    torch.manual_seed(0)
    return build_t5gemma2("t5gemma2-tiny", vocab_size=vocab)


def test_one_table_serves_encoder_decoder_and_head_and_afmuon_sees_it_once():
    model = _tiny()
    table = model.get_input_embeddings().weight
    assert model.model.decoder.embed_tokens.weight is table and model.get_output_embeddings().weight is table
    assert num_parameters(model, trainable=True) == _trainable_count({**T5GEMMA2_MODELS["t5gemma2-tiny"][0],
                                                                      "vocab_size": 96})
    roles = partition_by_role(model)
    assert [n for n, _ in roles["tied"]] == ["model.encoder.text_model.embed_tokens.weight"]
    named = [n for r in roles.values() for n, _ in r]
    assert not any("vision_tower" in n or "multi_modal" in n for n in named)  # frozen: no role, no state
    assert len(named) == len({id(p) for p in model.parameters() if p.requires_grad})


def test_the_tables_gradient_is_the_sum_of_its_three_uses():
    """App. I: autograd merges encoder lookup + decoder lookup + head on the one table; the lookup part
    lives only on the rows of ids the encoder or the decoder read. In float64 (the capture keeps the table's
    dtype), where the parts and the head-only backward sum the same terms in other orders: each of the
    table's elements is a sum of at most a few dozen terms (32 looked-up positions, the head's 16 rows), so
    they agree to well within 1e-12 of the gradient's largest element (u = 1.1e-16 per rounding)."""
    model = _tiny().double()
    src, tgt_in, tgt = (torch.randint(0, 40, (2, 8)) for _ in range(3))

    def loss_fn(m):
        logits = m(input_ids=src, decoder_input_ids=tgt_in, use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())

    with GradientSources(model) as cap:
        assert len(cap._mods) == 2  # the encoder's and the decoder's lookups
        loss_fn(model).backward()
        parts = cap.sources()
    rows = (parts["lookup"] != 0).any(dim=1).nonzero().flatten().tolist()
    assert set(rows) <= set(src.flatten().tolist()) | set(tgt_in.flatten().tolist()) and rows
    # the head part alone: the same loss with both lookups reading a detached copy of the table
    table = model.get_input_embeddings().weight
    head_only = table.detach().clone().requires_grad_(False)
    for emb in (model.model.encoder.text_model.embed_tokens, model.model.decoder.embed_tokens):
        emb.forward = (lambda e: lambda ids: torch.nn.functional.embedding(ids, head_only) * e.embed_scale)(emb)
    model.zero_grad(set_to_none=True)
    loss_fn(model).backward()
    assert parts["softmax"].dtype == table.grad.dtype == torch.float64
    torch.testing.assert_close(parts["softmax"], table.grad, rtol=0, atol=1e-12 * table.grad.abs().max().item())


def test_presets_train_it_tied_at_rho_60(tmp_path):
    for preset in ("t5gemma2-cpu", "t5gemma2"):
        cfg = resolve_config("t1_afmuon", preset, {"cache_dir": str(tmp_path)})
        assert cfg.family == "t5" and cfg.model.tied and cfg.optim.rho == 60.0  # Table 16: the main ratio
    cfg = resolve_config("t1_afmuon", "t5gemma2", {"cache_dir": str(tmp_path)})
    # App. J.5: 256 + 256 tokens, micro 16 x 128 = 524,288 target tokens per update, 1,431 updates
    assert (cfg.train.sequence_len, cfg.train.device_batch_size, cfg.train.total_batch_size) == (256, 16, 524_288)
    assert (cfg.train.num_steps, cfg.train.eval_every, cfg.train.eval_tokens) == (1431, 250, 2**20)
    assert cfg.model.preset == "t5gemma2-270m" and cfg.data.source == "memmap" and cfg.train.grad_clip == 1.0
    opt = build_optimizer(_tiny(), "afmuon", rho=cfg.optim.rho)
    (tied,) = [g for g in opt.param_groups if g["role"] == "tied"]
    assert tied["rho"] == 60.0 and tied["cap"] == 3.0 and tied["scale"] == 0.5


def test_untied_t5gemma2_is_refused(tmp_path, capsys):
    assert main(["train", "--preset", "t5gemma2-cpu", "--t5-tied", "false", "--optimizer", "hybrid",
                 "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "T5Gemma2 is trained tied only" in err and "\n" not in err


def test_cpu_preset_trains_from_the_command_line_and_a_diagnostic_reads_it(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["train", "--preset", "t5gemma2-cpu", "--arm", "t1_afmuon", "--num-steps", "6", "--eval-every", "3",
                 "--cache-dir", str(tmp_path / "cache"), "--runs-dir", str(runs), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    summary = out["summary"]
    assert math.isfinite(summary["val_ce"]) and math.isclose(summary["val_ppl"], math.exp(summary["val_ce"]))
    assert summary["depth"] == 4 and summary["num_steps"] == 6
    (record,) = [json.loads(line) for line in open(runs / "ledger.jsonl")]
    counts = record["metrics"]["param_counts"]
    assert counts["frozen"] > 0 and counts["total"] == counts["tied_table"] + counts["matrices"] + counts["vectors"] \
        + counts["frozen"]
    # the run's checkpoint is read back through the family's table key (`diagnose afmuon`)
    assert main(["diagnose", "afmuon", "--run", out["run_dir"], "--json"]) == 0
    diag = json.loads(capsys.readouterr().out)
    assert diag["cap"] == 3.0 and diag["rows"] == record["metrics"]["param_counts"]["tied_table"] // 64
