"""`muonlab prepare --preset P --download`: a paper preset's dataset and tokenizer, once checked, are used
from disk without the network (HF_HUB_OFFLINE, and an endpoint that cannot answer), prepared into the
preset's token files, and the settings that read them are printed; files that changed since they were
checked, a missing download offline, and presets without paper data are refused in one line."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from muonlab.cli import main
from muonlab.data.memmap_format import TokenMemmap
from muonlab.data.paper_data import FINEWEB, IMAGENET32, MANIFEST, PAPER_DATA, sha256_of

tokenizers = pytest.importorskip("tokenizers")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing answers there
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def _checked(asset, root, files: dict[str, bytes]):
    """Files as a finished, checked download leaves them (the record `fetch` writes)."""
    folder = asset.folder(root)
    record = {}
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        record[name] = {"sha256": sha256_of(folder / name), "size": len(data)}
    (folder / MANIFEST).write_text(json.dumps({"repo_id": asset.repo_id, "revision": "main", "complete": True,
                                               "max_files": None, "files": record}))
    return folder


def _parquet_bytes(table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=7)
    return buf.getvalue()


def _tokenizer_bytes(docs) -> bytes:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, tokenizers.trainers.BpeTrainer(vocab_size=150, special_tokens=["[UNK]", "<|endoftext|>"]))
    return tok.to_str().encode()


def test_text_preset_prepares_fineweb_with_the_models_tokenizer_offline(tmp_path, capsys):
    docs = [f"fineweb page {i}: some words about topic {i % 5} and more" for i in range(80)]
    root = tmp_path / "cache"
    _checked(FINEWEB, root, {"sample/10BT/000_00000.parquet": _parquet_bytes(pa.table({"text": docs[:50]})),
                             "sample/10BT/001_00000.parquet": _parquet_bytes(pa.table({"text": docs[50:]}))})
    tok_folder = _checked(PAPER_DATA["smollm2-135m"].tokenizer, root, {"tokenizer.json": _tokenizer_bytes(docs)})
    rc = main(["prepare", "--preset", "smollm2-135m", "--download", "--cache-dir", str(root), "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    payload = json.loads(out.out)
    assert "--source local" in payload["train_with"] and str(tok_folder / "tokenizer.json") in payload["train_with"]
    tok = tokenizers.Tokenizer.from_file(str(tok_folder / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    streams = {s: TokenMemmap(f).read(0, TokenMemmap(f).num_tokens) for s in ("train", "val", "holdout")
               for f in root.rglob(f"tokens/*/{s}.bin")}
    assert sum(int((v == eos).sum()) for v in streams.values()) == len(docs)  # every page once, in some split
    encoded = sorted(len(tok.encode(d, add_special_tokens=False).ids) + 1 for d in docs)
    assert sum(len(v) for v in streams.values()) == sum(encoded)


def test_imagegpt_prepares_imagenet_parquet_offline(tmp_path, capsys):
    Image = pytest.importorskip("PIL.Image")

    def shard(n, seed):
        rng = np.random.default_rng(seed)
        cells = []
        for _ in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
            cells.append({"bytes": buf.getvalue(), "path": None})
        return _parquet_bytes(pa.table({"image": cells, "label": list(range(n))}))

    root = tmp_path / "cache"
    _checked(IMAGENET32, root, {"data/train-00000-of-00001.parquet": shard(12, 0),
                                "data/validation-00000-of-00001.parquet": shard(4, 1)})
    rc = main(["prepare", "--preset", "imagegpt", "--download", "--cache-dir", str(root), "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "--eval-path" in json.loads(out.out)["train_with"]
    (train,) = root.rglob("tokens/*/train.bin")
    assert TokenMemmap(train).num_tokens == 12 * 1024 and TokenMemmap(train.with_name("eval.bin")).num_tokens == 4 * 1024


def test_refusals_are_one_line(tmp_path, capsys):
    root = tmp_path / "cache"
    assert main(["prepare", "--preset", "qwen2.5-0.5b", "--download", "--cache-dir", str(root)]) == 1
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE is set" in err and err.count("\n") == 1
    assert not (root / "hub").exists() or not any((root / "hub").rglob("*.parquet"))

    folder = _checked(FINEWEB, root, {"sample/10BT/000_00000.parquet": _parquet_bytes(pa.table({"text": ["a b"] * 9}))})
    (folder / "sample/10BT/000_00000.parquet").write_bytes(b"changed")
    assert main(["prepare", "--preset", "nanogpt-124m", "--download", "--cache-dir", str(root)]) == 1
    assert "when it was checked; delete it" in capsys.readouterr().err

    assert main(["prepare", "--preset", "cpu-tiny", "--download", "--cache-dir", str(root)]) == 2
    assert "not of cpu-tiny" in capsys.readouterr().err
    assert main(["prepare", "--preset", "protein-llama", "--download", "--cache-dir", str(root)]) == 2
    assert "give --path" in capsys.readouterr().err
    assert main(["prepare", "--preset", "imagegpt", "--download-files", "2", "--cache-dir", str(root)]) == 2
    assert "give --download" in capsys.readouterr().err
