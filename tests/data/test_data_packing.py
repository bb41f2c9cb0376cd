"""Best-fit packing: upstream's rule, determinism, B-independence, resume, rank sharding."""

import itertools
import random

import numpy as np
import pytest
import torch

from muonlab.data.packing import BestFitLoader, RowPacker
from muonlab.data.store import DocBatch

BOS = 0


class CharTokenizer:
    """One token per character (its code point); BOS = 0 never occurs in text."""

    bos_token_id = BOS

    def encode_batch(self, texts, prepend_bos=True, num_threads=8):
        return [([BOS] if prepend_bos else []) + [ord(c) for c in t] for t in texts]


def random_docs(n: int, seed: int, max_len: int = 40) -> list[str]:
    rng = random.Random(seed)
    return ["".join(chr(rng.randint(97, 122)) for _ in range(rng.randint(1, max_len))) for _ in range(n)]


def cycling(docs: list[str], batch: int = 128):
    """A documents factory over `docs` that repeats forever, with epochs."""

    def factory(start: int = 0):
        def gen():
            for epoch in itertools.count(1):
                for i in range(0, len(docs), batch):
                    yield DocBatch(docs[i : i + batch], epoch)

        return itertools.islice(gen(), start, None)

    return factory


def one_pass(docs: list[str], batch: int = 128):
    return lambda start=0: itertools.islice((docs[i : i + batch] for i in range(0, len(docs), batch)), start, None)


def reference_rows(docs: list[str], T: int, buffer_size: int, n_rows: int, batch: int = 128) -> list[list[int]]:
    """Upstream's algorithm written plainly: linear scans over a list buffer."""
    tok = CharTokenizer()
    batches = (b.docs for b in cycling(docs, batch)())
    buf: list[list[int]] = []
    rows = []
    for _ in range(n_rows):
        row: list[int] = []
        while len(row) < T + 1:
            while len(buf) < buffer_size:
                buf.extend(tok.encode_batch(next(batches)))
            remaining = T + 1 - len(row)
            best, best_len = -1, 0
            for i, d in enumerate(buf):
                if best_len < len(d) <= remaining:
                    best, best_len = i, len(d)
            if best >= 0:
                row += buf.pop(best)
            else:
                shortest = min(range(len(buf)), key=lambda i: len(buf[i]))
                row += buf.pop(shortest)[:remaining]
        rows.append(row)
    return rows


def take_rows(packer: RowPacker, n: int) -> list[list[int]]:
    return [packer.next_row().tolist() for _ in range(n)]


@pytest.mark.parametrize("T,buffer_size,max_len", [(16, 5, 40), (31, 50, 30), (64, 1000, 200), (7, 3, 5)])
def test_matches_upstream_reference(T, buffer_size, max_len):
    docs = random_docs(300, seed=T, max_len=max_len)
    packer = RowPacker(cycling(docs), CharTokenizer(), T, buffer_size)
    assert take_rows(packer, 200) == reference_rows(docs, T, buffer_size, 200)


def test_best_fit_takes_largest_fitting_then_crops_shortest():
    # Token lengths with BOS: "aa"=3, "bbbbb"=6, "ccc"=4, "d"*11=12; rows of T+1 = 10.
    docs = ["aa", "bbbbb", "ccc", "d" * 11]
    packer = RowPacker(one_pass(docs), CharTokenizer(), T=9, buffer_size=100)
    row1 = packer.next_row().tolist()
    assert row1 == [BOS, *map(ord, "bbbbb"), BOS, *map(ord, "ccc")]  # 6 (largest <= 10), then 4
    row2 = packer.next_row().tolist()
    # 3 fits; then 7 slots remain and only the 12-token doc is left: cropped to fill exactly.
    assert row2 == [BOS, *map(ord, "aa"), BOS, *map(ord, "d" * 6)]
    assert packer.next_row() is None  # nothing left


def test_crop_picks_the_shortest_when_nothing_fits():
    docs = ["x" * 30, "y" * 20, "z" * 25]
    packer = RowPacker(one_pass(docs), CharTokenizer(), T=9, buffer_size=100)
    assert packer.next_row().tolist() == [BOS] + [ord("y")] * 9


def test_rows_start_with_bos_and_have_no_padding():
    docs = random_docs(500, seed=1)
    doc_set = set(docs)
    loader = BestFitLoader(cycling(docs), CharTokenizer(), B=8, T=32, buffer_size=50)
    for _ in range(10):
        x, y, _ = next(loader)
        rows = torch.cat([x, y[:, -1:]], dim=1)
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row in rows.tolist():
            assert row[0] == BOS
            segments = "".join(chr(t) if t else "|" for t in row).split("|")[1:]
            for seg in segments[:-1]:  # whole documents
                assert seg in doc_set
            assert any(d.startswith(segments[-1]) for d in docs)  # last one possibly cropped


def test_deterministic_and_independent_of_B():
    docs = random_docs(400, seed=2)

    def rows(B, n_batches):
        loader = BestFitLoader(cycling(docs), CharTokenizer(), B=B, T=24, buffer_size=40)
        out = []
        for _ in range(n_batches):
            x, y, _ = next(loader)
            out += torch.cat([x, y[:, -1:]], dim=1).tolist()
        return out

    assert rows(4, 6) == rows(4, 6)
    assert rows(1, 24) == rows(4, 6) == rows(3, 8) == rows(24, 1)


def test_shapes_dtypes_and_epochs():
    docs = random_docs(50, seed=3, max_len=10)
    loader = BestFitLoader(cycling(docs, batch=16), CharTokenizer(), B=4, T=32, buffer_size=20)
    epochs = []
    for _ in range(30):
        x, y, epoch = next(loader)
        assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
        epochs.append(epoch)
    assert epochs == sorted(epochs) and epochs[0] == 1 and epochs[-1] > 2


def test_the_epoch_shown_is_the_pass_the_trained_rows_reach_not_the_buffers_read_ahead():
    """A buffer of 1000 documents holds many passes of a 50-document corpus: the epoch the loader
    yields counts the tokens of the rows produced, in units of one pass's tokens."""
    docs = random_docs(50, seed=3, max_len=10)
    per_epoch = sum(len(d) + 1 for d in docs)  # BOS + characters
    loader = BestFitLoader(cycling(docs, batch=16), CharTokenizer(), B=4, T=32, buffer_size=1000)
    x, y, epoch = next(loader)
    assert loader.packer.epoch > 10 and epoch == 1  # the buffer read far ahead; 4 rows trained
    seen = [epoch]
    for _ in range(20):
        seen.append(next(loader)[2])
    rows_tokens = [4 * 33 * (i + 1) for i in range(21)]
    assert seen == [1 + t // per_epoch for t in rows_tokens]


@pytest.mark.parametrize("k,m", [(0, 5), (3, 7), (11, 4)])
@pytest.mark.parametrize("takes_start", [True, False])
def test_resume_is_exact(k, m, takes_start, tmp_path):
    docs = random_docs(300, seed=4, max_len=60)
    base = cycling(docs, batch=16)
    factory = base if takes_start else (lambda: base(0))

    def make():
        return BestFitLoader(factory, CharTokenizer(), B=3, T=20, buffer_size=30)

    loader = make()
    for _ in range(k):
        next(loader)
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    expected = [next(loader) for _ in range(m)]
    fresh = make()
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    for (x0, y0, e0), (x1, y1, e1) in zip(expected, (next(fresh) for _ in range(m))):
        assert torch.equal(x0, x1) and torch.equal(y0, y1) and e0 == e1


def test_resume_state_is_small():
    docs = random_docs(2000, seed=5)
    loader = BestFitLoader(cycling(docs), CharTokenizer(), B=2, T=16, buffer_size=100)
    for _ in range(50):
        next(loader)
    state = loader.state_dict()
    assert len(state["buffer_lengths"]) <= 100 + 128  # the buffer, not the corpus
    assert state["buffer_tokens"].numel() == int(state["buffer_lengths"].sum())


def test_rank_sharding_partitions_rows():
    docs = random_docs(300, seed=6)
    W, B, T = 3, 2, 16

    def rows(rank, world_size, n_batches):
        loader = BestFitLoader(
            cycling(docs), CharTokenizer(), B=B, T=T, buffer_size=30, rank=rank, world_size=world_size
        )
        out = []
        for _ in range(n_batches):
            x, y, _ = next(loader)
            out += torch.cat([x, y[:, -1:]], dim=1).tolist()
        return out

    everything = rows(0, 1, 4 * W)
    batches = [everything[i:i + B] for i in range(0, len(everything), B)]
    per_rank = [rows(r, W, 4) for r in range(W)]
    for r in range(W):
        # rank r's k-th batch is the single-process batch k*W + r
        assert per_rank[r] == [row for batch in batches[r::W] for row in batch]


def test_finite_stream_ends_with_a_smaller_batch():
    docs = ["ab" * 5] * 7  # 11 tokens each, rows of 11: one document per row
    loader = BestFitLoader(one_pass(docs), CharTokenizer(), B=3, T=10, buffer_size=100)
    sizes = [x.shape[0] for x, _, _ in loader]
    assert sizes == [3, 3, 1]


def test_long_run_at_T256():
    # Many rows of a realistic shape through the hot path.
    docs = random_docs(3000, seed=7, max_len=300)
    packer = RowPacker(cycling(docs), CharTokenizer(), T=256, buffer_size=1000)
    rows = np.stack([packer.next_row() for _ in range(2000)])
    assert rows.shape == (2000, 257) and (rows[:, 0] == BOS).all()
