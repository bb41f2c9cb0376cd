"""A small corpus's document batches' ids, stored by the first loader that tokenizes them and read back by the
next (muonlab.data.encoded_store): the same rows, a resume to the same rows, nothing tokenized once stored."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muonlab.data import DataConfig, prepare_data
from muonlab.data.encoded_store import EncodedStore
from muonlab.data.tokenizer import Tokenizer

SYNTH = dict(source="synthetic", synthetic_bytes=60_000, synthetic_words=128, synthetic_branching=4,
             synthetic_doc_words=64, vocab_size=400)
B, T, BATCHES = 4, 32, 120  # a few passes over the train split: its batches come back each epoch


def _data(**settings):
    return prepare_data(DataConfig(**SYNTH, **settings), log=lambda s: None)


def _train_rows(data, batches=BATCHES, state=None):
    loader = data.loader(B, T)
    if state is not None:
        loader.load_state_dict(state)
    it = iter(loader)
    return torch.cat([next(it)[0] for _ in range(batches)]), loader


def _eval_rows(data):
    return torch.cat([x for x, _ in data.eval_rows("val", B, T, 10**9)])


def _entries(data) -> list:
    store = data.tokenizer_dir / "encoded"
    return sorted(store.glob("*.npy")) if store.is_dir() else []


@pytest.fixture
def tokenized():
    """The rows with every batch tokenized, no store (each test's own cache: conftest's MUONLAB_CACHE)."""
    plain = _data(encoded_store_mb=0)
    return _train_rows(plain)[0], _eval_rows(plain)


def _no_tokenizing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a stored batch was tokenized again")
    monkeypatch.setattr(Tokenizer, "encode_batch", refuse)


def test_stored_ids_give_the_tokenized_rows_and_are_read_back_without_tokenizing(tokenized, monkeypatch):
    train, val = tokenized
    data = _data()
    assert _entries(data) == []  # nothing stored by the loaders that had no store
    assert torch.equal(_train_rows(data)[0], train) and torch.equal(_eval_rows(data), val)  # stored as they came
    stored = _entries(data)
    assert stored
    _no_tokenizing(monkeypatch)
    again = _data()
    assert torch.equal(_train_rows(again)[0], train) and torch.equal(_eval_rows(again), val)
    assert _entries(again) == stored


def test_a_loader_resumed_from_its_state_reads_on_to_the_same_rows(tokenized, monkeypatch):
    train, _ = tokenized
    data = _data()
    _train_rows(data)  # fills the store
    _no_tokenizing(monkeypatch)
    half, loader = _train_rows(data, BATCHES // 2)
    rest, _ = _train_rows(_data(), BATCHES - BATCHES // 2, state=loader.state_dict())
    assert torch.equal(torch.cat([half, rest]), train)


def test_a_damaged_entry_is_tokenized_again_and_replaced(tokenized):
    train, _ = tokenized
    data = _data()
    _train_rows(data)
    first, second, *_ = _entries(data)
    first.write_bytes(first.read_bytes()[:-7])  # truncated
    entry = np.load(second)
    entry[1] += 1  # the count of another batch's documents
    np.save(second, entry)
    assert torch.equal(_train_rows(_data())[0], train)
    for path in (first, second):
        assert np.load(path)[0] == 1 and path.stat().st_size > 0  # whole again, in the current format
    assert torch.equal(_train_rows(_data())[0], train)


def test_a_store_that_cannot_be_written_leaves_the_run_its_rows(tokenized):
    train, _ = tokenized
    data = _data()
    (data.tokenizer_dir / "encoded").write_text("a file where the store's folder would be")  # unwritable, even as root
    assert torch.equal(_train_rows(data)[0], train) and _entries(data) == []


def test_only_splits_within_the_setting_are_stored():
    data = _data()
    size = data.manifest["splits"]["train"]["bytes"]
    assert data.encoded_store("train") is not None
    assert _data(encoded_store_mb=0).encoded_store("train") is None
    assert size < 2**20  # so a 1 MB bound stores it, and none stores a split larger than its bound
    data.config.encoded_store_mb = 1
    assert data.encoded_store("train") is not None
    data.manifest["splits"]["train"]["bytes"] = 2**20 + 1
    assert data.encoded_store("train") is None


def test_an_entry_belongs_to_its_tokenizer_and_its_documents(tmp_path):
    rows = [[0, 5, 6], [0, 7]]
    one = EncodedStore(tmp_path, "tokenizer-a")
    path, found = one.read(["ab", "c"])
    assert found is None
    one.write(path, rows)
    assert [r.tolist() for r in one.read(["ab", "c"])[1]] == rows
    assert EncodedStore(tmp_path, "tokenizer-b").read(["ab", "c"])[1] is None
    assert one.read(["a", "bc"])[1] is None  # the same text cut into other documents
