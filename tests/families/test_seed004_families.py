"""Seed 004's other Table-1 settings as model families (t5, imagegpt, hf): each CPU preset trains
from the command line's config, scores the family's metric (validation loss, perplexity, bits per
dimension, completion loss) on its token files, and its data come from local files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from muonlab.arms import resolve_config
from muonlab.cli import main
from muonlab.data.memmap_format import TokenMemmap, write_token_memmap
from muonlab.errors import UsageError
from muonlab.eval.loss import evaluate_loss, image_metrics
from muonlab.record.ledger import read_records
from muonlab.train import run_training


# --- the metrics ------------------------------------------------------------------------------
def test_loss_is_the_target_weighted_mean_and_completion_the_tail_mean():
    torch.manual_seed(0)
    batches = [torch.rand(3, 8) * 5, torch.rand(1, 8) * 5]  # the last batch short (drop_last off)
    r = evaluate_loss(lambda b: b, batches, completion_from=5)
    flat = torch.cat([b.flatten() for b in batches]).double()
    assert r.tokens == 32 and math.isclose(r.ce, float(flat.mean()), rel_tol=1e-12)
    tail = torch.cat([b[:, 5:].flatten() for b in batches]).double()
    assert math.isclose(r.extra["completion_nll"], float(tail.mean()), rel_tol=1e-12)
    assert math.isclose(r.ppl, math.exp(r.ce))


def test_image_metrics_are_seed004_formulas():
    r = evaluate_loss(lambda b: b, [torch.full((2, 4), 2.0)], completion_from=2)
    image_metrics(r)
    assert math.isclose(r.extra["bpd"], 2.0 / (3 * math.log(2)))  # App. J.7: loss / (3 ln 2)
    assert math.isclose(r.extra["bits_per_token"], 2.0 / math.log(2))
    assert math.isclose(r.extra["completion_bpd"], 2.0 / (3 * math.log(2)))


# --- every CPU preset trains and records its family's metric -------------------------------------
def _train(tmp_path, preset, arm="t1_afmuon", **settings):
    cfg = resolve_config(arm, preset, {"quiet": True, "runs_dir": str(tmp_path / "runs"), "num_steps": 6,
                                       "cache_dir": str(tmp_path / "cache"), **settings})
    result = run_training(cfg, log=lambda _: None)
    rows = [json.loads(line) for line in open(result.run_dir / "metrics.jsonl")]
    (record,) = read_records(tmp_path / "runs" / "ledger.jsonl")
    return cfg, result, rows, record


@pytest.mark.parametrize("preset", ["t5-cpu", "imagegpt-cpu", "hf-cpu", "protein-cpu"])
def test_cpu_preset_trains_and_records_the_family_metric(tmp_path, preset):
    cfg, result, rows, record = _train(tmp_path, preset, eval_every=3)
    m = record["metrics"]
    assert record["status"] == "ok" and record["config"]["family"] == cfg.family
    assert math.isfinite(m["val_ce"]) and math.isclose(m["val_ppl"], math.exp(m["val_ce"]))
    assert result.summary["val_ce"] == m["val_ce"] and "val_bpb" not in m  # no bytes: no bits per byte
    scored = [(r["step"], r["val_ce"]) for r in rows if "val_ce" in r]
    assert [s for s, _ in scored] == [2, 5] and scored[-1][1] == m["val_ce"]  # the same weights, same tokens
    assert scored[-1][1] < scored[0][1]  # it trains
    if cfg.family == "imagegpt":
        assert math.isclose(m["val_bpd"], m["val_ce"] / (3 * math.log(2)))
        assert math.isfinite(m["val_completion_nll"]) and "holdout_ce" not in m  # images: one eval split
    else:
        assert math.isfinite(m["holdout_ce"])


def test_hf_val_loss_equals_an_independent_pass_over_the_val_file(tmp_path):
    cfg, result, _, record = _train(tmp_path, "hf-cpu")
    from muonlab.families import get_family
    from muonlab.device import Runtime

    data = get_family("hf").prepare_data(cfg, log=lambda _: None)
    model = get_family("hf").build_model(cfg, data.vocab_size, Runtime(torch.device("cpu"), "fp32"))
    model.load_state_dict(torch.load(result.run_dir / "model.pt", weights_only=True))
    T, n = cfg.train.sequence_len, math.ceil(cfg.train.eval_tokens / cfg.train.sequence_len)
    val = np.fromfile(data.files["val"].path, dtype=np.uint16).astype(np.int64)
    blocks = torch.tensor(np.stack([val[i * T: i * T + T + 1] for i in range(n)]))
    with torch.no_grad():
        logits = model.model(input_ids=blocks[:, :-1]).logits.double()
    expected = F.cross_entropy(logits.flatten(0, 1), blocks[:, 1:].flatten()).item()
    assert math.isclose(record["metrics"]["val_ce"], expected, rel_tol=1e-6)


# --- Table 15: the untied T5 control --------------------------------------------------------------
def test_untied_t5_control_puts_every_table_on_adamw():
    from muonlab.families.tied.t5 import PackedT5
    from muonlab.optim.af_muon import build_optimizer
    from muonlab.families.tied.t5.model import T5_SHAPES

    model = PackedT5(T5_SHAPES["t5-tiny-untied"])
    opt = build_optimizer(model, "hybrid_untied")
    assert sorted(opt.roles["tables"]) == ["dec_wte.weight", "lm_head.weight", "wte.weight"]
    groups = {g["part"]: g for g in opt.param_groups}
    assert groups["tables"]["role"] == "adamw" and groups["tables"]["weight_decay"] == 0.01  # Hybrid's aux decay
    assert groups["matrix"]["role"] == "matrix" and all(n.endswith(("in_proj_weight", "weight")) for n in opt.roles["matrix"])
    assert not any("wte" in n or "lm_head" in n for n in opt.roles["matrix"])


def test_untied_t5_refuses_an_optimizer_that_needs_a_tie(tmp_path, capsys):
    assert main(["train", "--preset", "t5-cpu", "--t5-tied", "false", "--optimizer", "afmuon",
                 "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "untied T5 control" in err and "\n" not in err


def test_untied_arm_trains_under_the_t5_preset(tmp_path):
    cfg, _, _, record = _train(tmp_path, "t5-cpu", arm="t15_untied_hybrid")
    assert cfg.model.tied is False and record["status"] == "ok"
    assert record["metrics"]["param_counts"]["tied_table"] == 0


# --- data from local files -------------------------------------------------------------------------
def test_a_family_refuses_data_it_cannot_read(tmp_path, capsys):
    assert main(["train", "--preset", "imagegpt-cpu", "--source", "stdlib", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not read data source 'stdlib'" in err and "\n" not in err


def test_memmap_source_trains_the_tied_gpt_on_the_users_token_files(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "cache_in"
    write_token_memmap(folder / "train.bin", rng.integers(0, 300, 20_000), vocab_size=300, tokenizer="mine")
    write_token_memmap(folder / "eval.bin", rng.integers(0, 300, 4_000), vocab_size=300, tokenizer="mine")
    cfg, _, _, record = _train(tmp_path, "tied-cpu", source="memmap", path=str(folder))
    assert record["status"] == "ok" and math.isfinite(record["metrics"]["val_ce"])
    assert "holdout_ce" not in record["metrics"]  # no holdout.bin: no holdout split


def test_packed_t5_loader_resumes_exactly(tmp_path):
    from muonlab.families.tied.t5 import PackedPrefixLoader

    mm = write_token_memmap(tmp_path / "t.bin", np.arange(5000) % 97, vocab_size=97)
    a = PackedPrefixLoader(mm, 4, 8, 6, seed=3, device="cpu")
    for _ in range(5):
        next(a)
    b = PackedPrefixLoader(mm, 4, 8, 6, seed=3, device="cpu")
    b.load_state_dict(a.state_dict())
    for _ in range(30):  # across epochs
        xa, ya, ea = next(a)
        xb, yb, eb = next(b)
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and ea == eb
    x, y, _ = next(PackedPrefixLoader(mm, 2, 8, 6, seed=0, device="cpu", shuffle=False))
    window = torch.arange(14)
    assert torch.equal(x[0], torch.cat([window[:6], torch.tensor([0]), window[6:13]]))  # [src | BOS, tgt[:-1]]
    assert torch.equal(y[0], window[6:])


def test_fasta_records_and_their_errors(tmp_path):
    from muonlab.data.fasta import AMINO_ACIDS, read_fasta, residue_tokens

    f = tmp_path / "p.fasta"
    f.write_text(">sp|P1 first\nMKV\nLA*\n\n>sp|P2\nacdx\n")
    records = list(read_fasta(f))
    assert [s for _, s in records] == ["MKVLA", "ACDX"]
    assert residue_tokens("AC") == [AMINO_ACIDS.index("A"), AMINO_ACIDS.index("C")]
    bad = tmp_path / "bad.fasta"
    bad.write_text(">x\nMK1\n")
    with pytest.raises(UsageError, match=r"bad.fasta:1: record 'x' has letters '1'"):
        list(read_fasta(bad))
    (tmp_path / "none.fasta").write_text("MKV\n")
    with pytest.raises(UsageError, match="before the first '>' header"):
        list(read_fasta(tmp_path / "none.fasta"))


def test_local_text_with_a_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from muonlab.config import preset, apply_overrides
    from muonlab.families.tied.token_family import token_data

    docs = [f"document {i}: the quick brown fox number {i % 7} jumps" for i in range(60)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, tokenizers.trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "</s>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    cfg = apply_overrides(preset("hf-cpu"), {"data.source": "local", "data.path": str(tmp_path / "corpus.jsonl"),
                                             "data.tokenizer_json": str(tmp_path / "tokenizer.json"),
                                             "data.cache_dir": str(tmp_path / "cache")})
    data = token_data(cfg, log=lambda _: None)
    assert data.vocab_size == tok.get_vocab_size()
    eos = tok.token_to_id("</s>")
    stream = np.asarray(data.files["train"].tokens, dtype=np.int64)
    assert stream[-1] == eos  # every document ends with the separator
    pieces = [p[:-1] for p in np.split(stream, np.flatnonzero(stream == eos) + 1) if len(p)]
    encoded = {tuple(tok.encode(d, add_special_tokens=False).ids) for d in docs}
    assert all(tuple(p) in encoded for p in pieces) and 40 < len(pieces) < 60  # train's share of the documents
    assert {s for s in data.files} == {"train", "val", "holdout"}


def test_a_setting_the_tokenizer_json_path_does_not_read_is_refused(tmp_path, capsys):
    """Local text with a tokenizer.json is tokenized document by document: --max-doc-chars would not act."""
    (tmp_path / "corpus.txt").write_text("some text\n")
    assert main(["train", "--preset", "hf-cpu", "--source", "local", "--path", str(tmp_path / "corpus.txt"),
                 "--tokenizer-json", str(tmp_path / "tokenizer.json"), "--max-doc-chars", "100",
                 "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "--max-doc-chars (data.max_doc_chars) does not act" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
