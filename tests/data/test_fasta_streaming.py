"""UniRef50 as UniProt publishes it (`uniref50.fasta.gz`, 48M records) is read a line at a time and split
into token files without holding the records: the split and the order are those of the in-memory
split (`sources.split_documents`), checked here against it, and the memory stays a small fraction of
the sequences' size."""

from __future__ import annotations

import gzip
import tracemalloc

import numpy as np
import pytest

from muonlab.data.fasta import AMINO_ACIDS, read_fasta, residue_tokens
from muonlab.data.memmap_format import TokenMemmap
from muonlab.data.ranked_split import write_ranked_splits
from muonlab.data.sources import split_documents
from muonlab.errors import CorruptInput, UsageError


def _proteome(n, seed, max_len=300):
    rng = np.random.default_rng(seed)
    letters = np.array(list(AMINO_ACIDS[:20]))
    return [(f"UniRef50_{seed}_{i} n=2 Tax=x", "".join(rng.choice(letters, int(rng.integers(5, max_len)))))
            for i in range(n)]


def _fasta_text(records, width=60):
    lines = []
    for header, seq in records:
        lines += [f">{header}", *(seq[i:i + width] for i in range(0, len(seq), width))]
    return "\n".join(lines) + "\n"


def test_gzip_and_plain_files_give_the_same_records(tmp_path):
    records = _proteome(40, 0)
    (tmp_path / "a.fasta").write_text(_fasta_text(records))
    with gzip.open(tmp_path / "b.fasta.gz", "wt") as fh:
        fh.write(_fasta_text(records, width=80))
    plain, packed = list(read_fasta(tmp_path / "a.fasta")), list(read_fasta(tmp_path / "b.fasta.gz"))
    assert [s for _, s in plain] == [s for _, s in packed] == [s for _, s in records]
    assert [i.split(":", 1)[1] for i, _ in packed] == [h.split()[0] for h, _ in records]

    truncated = tmp_path / "c.fasta.gz"
    truncated.write_bytes((tmp_path / "b.fasta.gz").read_bytes()[:-40])
    with pytest.raises(CorruptInput, match="c.fasta.gz: a truncated or corrupt gzip file"):
        list(read_fasta(truncated))
    (tmp_path / "d.fasta").write_bytes(b">x\nMKV\xff\n")
    with pytest.raises(UsageError, match="d.fasta:.*not UTF-8"):
        list(read_fasta(tmp_path / "d.fasta"))


def test_the_streamed_split_is_the_in_memory_split(tmp_path):
    with gzip.open(tmp_path / "u.fasta.gz", "wt") as fh:
        fh.write(_fasta_text(_proteome(300, 1)))
    docs = list(read_fasta(tmp_path / "u.fasta.gz"))
    want = split_documents(docs, 0.1, 0.05)  # the ranked in-memory split the small corpora use
    names = write_ranked_splits(tmp_path / "out", read_fasta(tmp_path / "u.fasta.gz"),
                                lambda texts: [residue_tokens(t) for t in texts], len(AMINO_ACIDS), "residues",
                                0.1, 0.05, {}, batch=7, chunk_tokens=500)  # many batches, many copy chunks
    assert names == ["train", "val", "holdout"]
    for split in names:
        mm = TokenMemmap(tmp_path / "out" / f"{split}.bin")
        expected = [tok for seq in want[split] for tok in residue_tokens(seq)]
        assert mm.read(0, mm.num_tokens).tolist() == expected
    assert not (tmp_path / "out" / ".staging").exists()


def test_memory_stays_far_below_the_sequences(tmp_path):
    records = _proteome(12_000, 2, max_len=500)  # about 3M residues
    residues = sum(len(s) for _, s in records)
    with gzip.open(tmp_path / "big.fasta.gz", "wt") as fh:
        fh.write(_fasta_text(records))
    del records
    tracemalloc.start()
    try:
        write_ranked_splits(tmp_path / "out", read_fasta(tmp_path / "big.fasta.gz"),
                            lambda texts: [residue_tokens(t) for t in texts], len(AMINO_ACIDS), "residues",
                            0.05, 0.05, {}, batch=16, chunk_tokens=1 << 12)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    total = sum(TokenMemmap(tmp_path / "out" / f"{s}.bin").num_tokens for s in ("train", "val", "holdout"))
    assert total == residues
    # holding the sequences takes more than `residues` bytes; here about 40 bytes a record of ~250 residues
    assert peak < residues / 2, (peak, residues)
