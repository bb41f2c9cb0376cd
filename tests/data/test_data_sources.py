"""Small corpora: stdlib discovery, local files, the document split, chunking."""

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from muonlab.data.local_source import LocalSource, local_files
from muonlab.data.sources import chunk_document, split_documents
from muonlab.data.stdlib_source import StdlibSource, stdlib_files, stdlib_root
from muonlab.errors import MuonlabError, UsageError

TEST_DIRS = {"test", "tests", "idle_test"}


def test_stdlib_file_list_excludes_tests_and_is_a_few_mb():
    root = stdlib_root()
    files = stdlib_files(root)
    names = {p.as_posix() for p in files}
    assert {"os.py", "json/__init__.py", "asyncio/events.py"} <= names
    assert files == sorted(files, key=lambda p: p.as_posix())
    for p in files:
        assert not TEST_DIRS & set(p.parts[:-1]), p
        assert "site-packages" not in p.parts and not p.name.startswith("_sysconfigdata")
    size = sum((root / p).stat().st_size for p in files)
    assert 5e6 < size < 20e6  # ~12 MB for CPython 3.11; ~31 MB with the test suites


def test_stdlib_source_on_a_fake_tree(tmp_path):
    for rel, data in {
        "os.py": b"import sys\n",
        "json/__init__.py": b"x = 1\n",
        "empty.py": b"",
        "test/test_os.py": b"assert 1\n",
        "idlelib/idle_test/t.py": b"1\n",
        "lib2to3/tests/data/bom.py": b"1\n",
        "site-packages/pkg.py": b"1\n",
        "latin1.py": "caf\u00e9 = 1\n".encode("latin-1"),
        "notes.txt": b"not python\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    src = StdlibSource(tmp_path)
    assert [p.as_posix() for p in src.files] == ["empty.py", "json/__init__.py", "latin1.py", "os.py"]
    assert src.documents() == [("json/__init__.py", "x = 1\n"), ("os.py", "import sys\n")]


def write_local_tree(root: Path) -> None:
    (root / "a").mkdir(parents=True)
    (root / "a" / "one.txt").write_text("first document\n")
    (root / "b.txt").write_text("second\n\nstill second\n")
    (root / "c.jsonl").write_text(json.dumps({"text": "j1"}) + "\n\n" + json.dumps({"text": "j2", "id": 3}) + "\n")
    pq.write_table(pa.table({"text": ["p1", "", "p2"], "n": [1, 2, 3]}), root / "d.parquet")
    (root / ".hidden.txt").write_text("ignored")
    (root / "readme.md").write_text("ignored")


def test_local_folder_all_formats(tmp_path):
    write_local_tree(tmp_path)
    base, files = local_files(tmp_path)
    assert [f.as_posix() for f in files] == ["a/one.txt", "b.txt", "c.jsonl", "d.parquet"]
    docs = LocalSource(tmp_path).documents()
    assert docs == [
        ("a/one.txt", "first document\n"),
        ("b.txt", "second\n\nstill second\n"),
        ("c.jsonl:1", "j1"),
        ("c.jsonl:3", "j2"),
        ("d.parquet:0", "p1"),
        ("d.parquet:2", "p2"),
    ]


def test_local_single_txt_by_paragraph(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("para one\nline two\n\n\npara two\n  \npara three\n")
    assert LocalSource(path).documents() == [("book.txt", path.read_text())]
    docs = LocalSource(path, txt_docs="paragraph").documents()
    assert [t for _, t in docs] == ["para one\nline two", "para two", "para three"]


@pytest.mark.parametrize(
    "setup,exc,match",
    [
        (lambda p: None, UsageError, "does not exist"),
        (lambda p: p.mkdir(), UsageError, "no .txt, .jsonl or .parquet"),
        (lambda p: (p.mkdir(), (p / "e.txt").write_text("")), UsageError, "no non-empty documents"),
        (lambda p: (p.mkdir(), (p / "x.jsonl").write_text('{"body": 1}\n')), UsageError, r"x.jsonl:1: no string field"),
        (lambda p: (p.mkdir(), (p / "x.txt").write_bytes(b"\xff\xfe")), UsageError, "not UTF-8"),
        (lambda p: (p.mkdir(), (p / "x.parquet").write_bytes(b"junk")), MuonlabError, "corrupted parquet .*x.parquet"),
    ],
)
def test_local_errors(tmp_path, setup, exc, match):
    path = tmp_path / "corpus"
    setup(path)
    with pytest.raises(exc, match=match):
        LocalSource(path).documents()


def test_split_is_disjoint_proportional_and_order_free():
    docs = [(f"doc{i}", f"text {i}") for i in range(1000)]
    splits = split_documents(docs, 0.05, 0.1)
    assert [len(splits[s]) for s in ("train", "val", "holdout")] == [850, 50, 100]
    sets = [set(splits[s]) for s in ("train", "val", "holdout")]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert set().union(*sets) == {t for _, t in docs}
    shuffled = docs[:]
    random.Random(0).shuffle(shuffled)
    assert split_documents(shuffled, 0.05, 0.1) == splits
    assert split_documents(docs[:3], 0.05, 0.05) == split_documents(docs[:3], 0.05, 0.05)
    assert all(len(v) == 1 for v in split_documents(docs[:3], 0.05, 0.05).values())


@pytest.mark.parametrize("n", [0, 1, 2])
def test_split_too_few_documents(n):
    with pytest.raises(UsageError, match="empty|at least 3"):
        split_documents([(f"d{i}", "x") for i in range(n)], 0.05, 0.05)


@pytest.mark.parametrize("max_chars", [16, 50, 200])
def test_chunk_document(max_chars):
    text = "".join(f"line {i} " + "x" * (i % 37) + ("\n\n" if i % 5 == 0 else "\n") for i in range(300)) + "y" * 500
    pieces = chunk_document(text, max_chars)
    assert "".join(pieces) == text
    assert all(0 < len(p) <= max_chars for p in pieces)
    if max_chars >= 50:  # every line fits: pieces end at line ends, except in the long tail
        body = [p for p in pieces if "y" not in p]
        assert all(p.endswith("\n") for p in body)
        if max_chars >= 200:  # blank lines (every 5th line here) are preferred cut points
            assert sum(p.endswith("\n\n") for p in body) > len(body) // 2


def test_parquet_documents_stream_a_row_group_at_a_time_with_their_row_ids(tmp_path):
    texts = [f"doc {i}" if i % 4 else "" for i in range(11)]  # empty rows are skipped, their index kept
    pq.write_table(pa.table({"text": texts}), tmp_path / "shard.parquet", row_group_size=3)
    source = LocalSource(tmp_path / "shard.parquet")
    docs = source.iter_documents()
    assert next(docs) == ("shard.parquet:1", "doc 1")  # a generator: nothing read past the first group
    assert list(docs) == [(f"shard.parquet:{i}", f"doc {i}") for i in range(2, 11) if i % 4]
    assert source.documents()[0] == ("shard.parquet:1", "doc 1")
