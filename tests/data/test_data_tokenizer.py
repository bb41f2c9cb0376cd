"""Tokenizer: training, special tokens, token byte lengths, plain-JSON storage."""

import hashlib
import json
import random

import pytest
import torch

from muonlab.data.tokenizer import BOS_TOKEN, SPECIAL_TOKENS, Tokenizer
from muonlab.errors import MuonlabError, UsageError

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()


def sample_texts(n_docs: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        words = [rng.choice(WORDS) for _ in range(rng.randint(20, 60))]
        docs.append(" ".join(words) + f". Numbers {rng.randint(0, 9999)}; caf\u00e9 \u4f60\u597d!\n")
    return docs


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(sample_texts(), vocab_size=320, training={"note": "test"})


def test_vocab_layout_and_bos(tok):
    assert tok.vocab_size == 320
    assert len(tok.ranks) == 316
    assert tok.bos_token_id == len(tok.ranks)  # first special after the mergeable ranks
    assert tok.special_tokens == {name: 316 + i for i, name in enumerate(SPECIAL_TOKENS)}
    assert tok.enc.encode_single_token(BOS_TOKEN) == tok.bos_token_id
    assert tok.ranks[:256] == [bytes([b]) for b in range(256)]


ROUND_TRIP = ["", "hello world", "The quick brown fox.\n\n  indented", "caf\u00e9 \u4f60\u597d \U0001f600 123456"]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < len(tok.ranks) for i in ids)
    assert tok.decode(ids) == text


def test_encode_batch_prepends_bos(tok):
    texts = ["the fox", "a lazy dog"]
    rows = tok.encode_batch(texts)
    assert [r[0] for r in rows] == [tok.bos_token_id] * 2
    assert [r[1:] for r in rows] == [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, prepend_bos=False, num_threads=1) == [tok.encode(t) for t in texts]


def test_threaded_encode_keeps_order_and_equals_tiktoken(tok, monkeypatch):
    """Enough texts for several threads: the slices come back in order, token for token tiktoken's."""
    import muonlab.data.tokenizer as tokenizer_module

    monkeypatch.setattr(tokenizer_module, "usable_cpus", lambda: 4)
    texts = [f"doc {i}: " + "the quick fox " * (i % 7) for i in range(4 * tokenizer_module._TEXTS_PER_THREAD + 3)]
    expected = [[tok.bos_token_id, *row] for row in tok.enc.encode_ordinary_batch(texts)]
    assert tok.encode_batch(texts, num_threads=4) == expected
    assert tok.encode_batch(texts, num_threads=1) == expected


def test_special_token_text_is_ordinary(tok):
    assert tok.bos_token_id not in tok.encode(BOS_TOKEN)
    assert tok.decode(tok.encode(BOS_TOKEN)) == BOS_TOKEN


def test_token_bytes(tok):
    tb = tok.token_bytes()
    assert tb.dtype == torch.int32 and tb.shape == (320,)
    assert tb[ord("a")] == 1
    assert tb[0xE4] == 3  # a lone UTF-8 lead byte decodes to U+FFFD, 3 bytes (as upstream)
    merged = [i for i in range(256, 316) if tok.ranks[i].isascii()]
    assert merged and all(tb[i] == len(tok.ranks[i]) for i in merged)
    assert tb[316:].tolist() == [0, 0, 0, 0]
    text = "the quick brown fox"
    assert int(tb[tok.encode(text)].sum()) == len(text.encode())


def test_save_load_round_trip_without_pickle(tok, tmp_path):
    path = tok.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["muonlab-bpe.json"]  # never Hugging Face's file name
    raw = path.read_bytes()
    obj = json.loads(raw)  # plain JSON, no pickle opcodes
    assert obj["format"] == "muonlab-bpe-v1" and len(obj["ranks"]) == 316
    assert obj["token_bytes"] == tok.token_bytes().tolist()
    loaded = Tokenizer.load(tmp_path)
    texts = sample_texts(20, seed=1)
    assert loaded.encode_batch(texts) == tok.encode_batch(texts)
    assert torch.equal(loaded.token_bytes(), tok.token_bytes())
    assert loaded.training == {"note": "test"}
    assert loaded.fingerprint == tok.fingerprint == hashlib.sha256(raw).hexdigest()


def test_a_cache_of_an_earlier_release_is_read_under_its_old_name(tok, tmp_path):
    path = tok.save(tmp_path)
    path.rename(tmp_path / "tokenizer.json")  # how caches written before the rename hold it
    loaded = Tokenizer.load(tmp_path)
    assert loaded.fingerprint == tok.fingerprint and loaded.encode("a b") == tok.encode("a b")
    assert Tokenizer.stored(tmp_path).name == "tokenizer.json"


def test_fingerprint_is_deterministic(tok, tmp_path):
    again = Tokenizer.train(sample_texts(), vocab_size=320, training={"note": "test"})
    assert again.fingerprint == tok.fingerprint
    other = Tokenizer.train(sample_texts(), vocab_size=300, training={"note": "test"})
    assert other.fingerprint != tok.fingerprint


def test_corpus_too_small_for_vocab():
    with pytest.raises(UsageError, match="too small for vocab_size 4096"):
        Tokenizer.train(["hello world"] * 3, vocab_size=4096)


def test_load_errors(tok, tmp_path):
    with pytest.raises(UsageError, match="no tokenizer"):
        Tokenizer.load(tmp_path / "missing")
    tok.save(tmp_path)
    (tmp_path / "muonlab-bpe.json").write_text('{"format": "muonlab-bpe-v1", "ranks": ["!!"]}')
    with pytest.raises(MuonlabError, match="corrupted tokenizer"):
        Tokenizer.load(tmp_path)
