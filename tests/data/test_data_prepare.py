"""prepare_data end to end on small corpora: cache layout, reuse, splits, eval rows."""

import hashlib
import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from muonlab.data import DataConfig, PreparedData, compress_bits_per_byte, prepare_data
from muonlab.data.synthetic import MarkovText
from muonlab.errors import UsageError

SYNTH = dict(source="synthetic", synthetic_bytes=150_000, synthetic_words=128, synthetic_branching=4,
             synthetic_doc_words=64, vocab_size=400)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MUONLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def synth(cache) -> PreparedData:
    return prepare_data(DataConfig(**SYNTH), log=lambda s: None)


def all_docs(data: PreparedData, split: str) -> list[str]:
    return [d for batch in data.documents(split, one_pass=True) for d in batch.docs]


def stacked_rows(batches) -> list[list[int]]:
    return [row for x, y in batches for row in torch.cat([x, y[:, -1:]], dim=1).tolist()]


def test_layout_manifest_and_reuse(cache, synth):
    assert synth.corpus_dir.parent == cache / "corpora" and synth.corpus_dir.name.startswith("synthetic-")
    m = synth.manifest
    assert json.loads((synth.corpus_dir / "manifest.json").read_text()) == m
    assert m["source"] == "synthetic" and m["corpus_hash"] == synth.corpus_hash
    splits = {s: all_docs(synth, s) for s in ("train", "val", "holdout")}
    for s, docs in splits.items():
        assert m["splits"][s]["docs"] == len(docs) > 0
        assert m["splits"][s]["bytes"] == sum(len(d.encode()) for d in docs)
    assert not set(splits["train"]) & set(splits["val"]) and not set(splits["val"]) & set(splits["holdout"])
    n = sum(len(v) for v in splits.values())
    assert len(splits["val"]) == round(0.05 * n) == len(splits["holdout"])

    chain = MarkovText.random(128, 4, seed=0)
    assert synth.entropy_bits_per_byte == pytest.approx(chain.entropy_bits_per_byte())
    assert m["source_meta"]["doc_entropy_bits_per_byte"] == pytest.approx(chain.doc_entropy_bits_per_byte(64))

    tok_file = synth.corpus_dir / "tokenizer-v400" / "muonlab-bpe.json"
    assert synth.tokenizer_hash == hashlib.sha256(tok_file.read_bytes()).hexdigest()
    assert synth.tokenizer.training["split"] == "train"
    assert synth.tokenizer.training["corpus_hash"] == synth.corpus_hash

    summary = synth.describe()
    assert summary["corpus_hash"] == synth.corpus_hash and summary["vocab_size"] == 400
    assert summary["holdout_docs"] == m["splits"]["holdout"]["docs"] and "entropy_bits_per_byte" in summary
    json.dumps(summary)

    logs: list[str] = []
    again = prepare_data(DataConfig(**SYNTH), log=logs.append)
    assert [line.split(" at ")[0] for line in logs] == ["data: reusing synthetic corpus", "data: reusing tokenizer"]
    assert (again.corpus_hash, again.tokenizer_hash) == (synth.corpus_hash, synth.tokenizer_hash)

    other = prepare_data(DataConfig(**{**SYNTH, "synthetic_seed": 1}), log=lambda s: None)
    assert other.corpus_dir != synth.corpus_dir and other.corpus_hash != synth.corpus_hash


def test_documents_cycle_and_resume_by_batch_index(synth):
    train = list(itertools.islice(synth.documents("train"), 40))
    per_pass = -(-synth.manifest["splits"]["train"]["docs"] // 128)
    assert [b.epoch for b in train] == [1 + i // per_pass for i in range(40)]
    assert train[per_pass].docs == train[0].docs
    assert list(itertools.islice(synth.documents("train", start=7), 5)) == train[7:12]
    val = list(synth.documents("val"))
    assert sum(len(b.docs) for b in val) == synth.manifest["splits"]["val"]["docs"]
    with pytest.raises(UsageError, match="split 'test'"):
        synth.documents("test")


def test_eval_rows_one_pass_independent_of_B(synth):
    T = 64
    everything = stacked_rows(synth.eval_rows("holdout", B=5, T=T, max_tokens=10**9))
    split_tokens = sum(len(r) for r in synth.tokenizer.encode_batch(all_docs(synth, "holdout")))
    assert 0 < len(everything) * (T + 1) <= split_tokens  # one pass, never cycled
    assert stacked_rows(synth.eval_rows("holdout", B=3, T=T, max_tokens=10**9)) == everything
    capped = list(synth.eval_rows("holdout", B=4, T=T, max_tokens=10 * T))
    assert [x.shape[0] for x, _ in capped] == [4, 4, 2]
    assert stacked_rows(capped) == everything[:10]
    assert all(row[0] == synth.tokenizer.bos_token_id for row in everything)


def test_eval_rows_tokenized_in_worker_processes_are_the_same_and_leave_none_running(synth, monkeypatch):
    """gpu-d8 scores 2 x 20,971,520 tokens: they are tokenized as the training rows are (data.encode_processes)."""
    import multiprocessing

    from muonlab.data import packing
    from muonlab.data.encoding_processes import encoding_pool

    pools = []  # the processes each pool was started with
    monkeypatch.setattr(packing, "encoding_pool", lambda spec, n: pools.append(n) or encoding_pool(spec, n))

    T = 64
    synth.config.encoded_store_mb = 0  # every batch tokenized, none read from the store
    own = stacked_rows(synth.eval_rows("val", B=4, T=T, max_tokens=10**9))
    synth.config.encode_processes = 2
    workers = stacked_rows(synth.eval_rows("val", B=4, T=T, max_tokens=10**9))
    assert pools == [2] and workers == own and len(own) > 4
    assert multiprocessing.active_children() == []  # the pass over, its workers ended


def test_eval_rows_small_split_gives_a_smaller_batch_or_a_clear_error(synth):
    n_rows = len(stacked_rows(synth.eval_rows("val", B=1000, T=256, max_tokens=10**9)))
    batches = list(synth.eval_rows("val", B=1000, T=256, max_tokens=10**9))
    assert len(batches) == 1 and batches[0][0].shape == (n_rows, 256)
    with pytest.raises(UsageError, match="too small to evaluate"):
        list(synth.eval_rows("val", B=2, T=10**6, max_tokens=10**7))
    with pytest.raises(UsageError, match="at least T"):
        list(synth.eval_rows("val", B=2, T=64, max_tokens=10))


def test_eval_bytes_match_the_bpb_denominator(synth):
    T, max_tokens = 64, 40 * 64
    raw = synth.eval_bytes("holdout", T, max_tokens)
    token_bytes = synth.tokenizer.token_bytes()
    denominator = sum(int(token_bytes[y].sum()) for _, y in synth.eval_rows("holdout", 8, T, max_tokens))
    assert len(raw) == denominator  # ASCII text: exact
    assert compress_bits_per_byte(raw) > synth.entropy_bits_per_byte  # xz cannot beat the source


def test_compress_bits_per_byte():
    assert compress_bits_per_byte("a" * 100_000) < 0.05
    assert 7.9 < compress_bits_per_byte(os.urandom(50_000)) < 8.2
    with pytest.raises(UsageError):
        compress_bits_per_byte("")


def test_loader_resume_through_prepared_data(synth):
    loader = synth.loader(B=2, T=32)
    for _ in range(5):
        next(loader)
    state = loader.state_dict()
    expected = [next(loader) for _ in range(4)]
    fresh = synth.loader(B=2, T=32)
    fresh.load_state_dict(state)
    for (x0, y0, e0), (x1, y1, e1) in zip(expected, (next(fresh) for _ in range(4))):
        assert torch.equal(x0, x1) and torch.equal(y0, y1) and e0 == e1


def write_texts(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    chain = MarkovText.random(64, 3, seed=5)
    for i in range(n):
        (folder / f"doc{i:03d}.txt").write_text(chain.render(chain.sample(1, 300, np.random.default_rng(i))[0]))


def test_local_corpus_and_chunking(cache, tmp_path):
    write_texts(tmp_path / "texts", 40)
    cfg = DataConfig(source="local", path=str(tmp_path / "texts"), vocab_size=300, max_doc_chars=200)
    data = prepare_data(cfg, log=lambda s: None)
    m = data.manifest["splits"]
    assert [m[s]["source_docs"] for s in ("train", "val", "holdout")] == [36, 2, 2]
    for s in ("train", "val", "holdout"):
        docs = all_docs(data, s)
        assert len(docs) == m[s]["docs"] > m[s]["source_docs"] and all(len(d) <= 200 for d in docs)
    originals = {p.read_text() for p in (tmp_path / "texts").iterdir()}
    holdout_text = "".join(all_docs(data, "holdout"))  # pieces of a file stay adjacent
    assert sum(o in holdout_text for o in originals) == 2  # whole files stay in one split
    assert data.split_text("holdout") == "\n".join(all_docs(data, "holdout"))

    (tmp_path / "texts" / "doc000.txt").write_text("changed " * 50)
    assert prepare_data(cfg, log=lambda s: None).corpus_dir != data.corpus_dir


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(source="local", path="{tmp}/missing"), "does not exist"),
        (dict(source="local", path="{tmp}/empty"), "no .txt"),
        (dict(source="local", path="{tmp}/few"), "only 2 document"),
        (dict(source="local", path="{tmp}/tiny", vocab_size=2048), "too small for vocab_size 2048"),
        (dict(source="nope"), "not one of"),
        (dict(source="local"), "needs --path"),
        (dict(val_fraction=0.6, holdout_fraction=0.5), "must be < 1"),
        (dict(vocab_size=100), "vocab_size"),
        (dict(num_shards=0), "num_shards"),
    ],
)
def test_usage_errors(cache, tmp_path, kw, match):
    (tmp_path / "empty").mkdir()
    (tmp_path / "few").mkdir()
    for i in range(2):
        (tmp_path / "few" / f"{i}.txt").write_text("hello")
    write_texts(tmp_path / "tiny", 5)
    if "path" in kw:
        kw = {**kw, "path": kw["path"].format(tmp=tmp_path)}
    with pytest.raises(UsageError, match=match):
        prepare_data(DataConfig(**kw), log=lambda s: None)


def test_stdlib_corpus_end_to_end(cache):
    data = prepare_data(DataConfig(source="stdlib", vocab_size=512, tokenizer_max_chars=500_000), log=lambda s: None)
    m = data.manifest["splits"]
    total = sum(m[s]["bytes"] for s in ("train", "val", "holdout"))
    assert 5e6 < total < 20e6 and m["train"]["docs"] > 500
    assert data.tokenizer.vocab_size == 512
    holdout = data.split_text("holdout", max_bytes=100_000)
    assert 0 < len(holdout.encode()) <= 100_000
    assert 1.0 < compress_bits_per_byte(holdout) < 3.0
