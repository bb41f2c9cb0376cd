"""Materialise a corpus in the cache: split documents, a manifest, and where they live.

Layout under `cache_root()`:
  corpora/<source>-<hash12>/manifest.json     written last: its presence means complete
  corpora/<source>-<hash12>/{train,val,holdout}.parquet   (small corpora)
  corpora/<source>-<hash12>/tokenizer-v<vocab>/muonlab-bpe.json
  downloads/climbmix-<hash12 of base_url>/shard_*.parquet (shared by every num_shards)
The hash covers the source's identity and the split settings, so changing either
gives a fresh directory and an unchanged configuration reuses the old one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import filelock

from muonlab.atomic import write_json, folder_undone_on_failure
from muonlab.data import climbmix
from muonlab.data.config import DataConfig
from muonlab.data.sources import SPLIT_SCHEME, SPLITS, chunk_documents, make_source, split_documents
from muonlab.data.store import hash_docs, open_parquet, sha256_file, write_docs
from muonlab.errors import UsageError
from muonlab.stop_request import stop_if_requested

FORMAT = "muonlab-corpus-v1"


@dataclass
class Corpus:
    dir: Path
    manifest: dict
    files: dict[str, list[Path]]  # split -> parquet files holding its documents
    # Which stretch of a split's packed stream is evaluated: climbmix holdout is the
    # second window of the val shard's stream; everything else starts at the beginning.
    eval_window: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})


def _short_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _load_manifest(path: Path, identity_hash: str) -> dict | None:
    try:
        manifest = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    ok = manifest.get("format") == FORMAT and manifest.get("identity_hash") == identity_hash
    return manifest if ok else None


def prepare_corpus(cfg: DataConfig, root: Path, log: Callable[[str], None]) -> Corpus:
    if cfg.source == "climbmix":
        return _prepare_climbmix(cfg, root, log)
    return _prepare_small(cfg, root, log)


def _prepare_small(cfg: DataConfig, root: Path, log: Callable[[str], None]) -> Corpus:
    source = make_source(cfg)
    identity = {
        "source": source.name,
        "identity": source.identity(),
        "split": {"scheme": SPLIT_SCHEME, "val_fraction": cfg.val_fraction, "holdout_fraction": cfg.holdout_fraction},
        "max_doc_chars": cfg.max_doc_chars,
    }
    identity_hash = _short_hash(identity)
    corpus_dir = root / "corpora" / f"{source.name}-{identity_hash[:12]}"
    files = {s: [corpus_dir / f"{s}.parquet"] for s in SPLITS}
    with folder_undone_on_failure(corpus_dir), filelock.FileLock(str(corpus_dir / ".lock")):
        manifest = _load_manifest(corpus_dir / "manifest.json", identity_hash)
        if manifest is not None and all(p.exists() for ps in files.values() for p in ps):
            log(f"data: reusing {source.name} corpus at {corpus_dir}")
            return Corpus(corpus_dir, manifest, files)

        log(f"data: building {source.name} corpus at {corpus_dir}")
        hint = " (a single .txt file is one document; try local_txt_docs='paragraph')" if cfg.source == "local" else ""
        # Split whole documents first, so pieces of one file never land in two splits.
        splits = split_documents(source.documents(), cfg.val_fraction, cfg.holdout_fraction, hint)
        h = hashlib.sha256()
        stats = {}
        for name in SPLITS:
            stop_if_requested()  # a stop whose interrupt was lost inside the draw (muonlab.stop_request)
            docs = chunk_documents(splits[name], cfg.max_doc_chars)
            write_docs(files[name][0], docs)
            h.update(name.encode() + b"\0")
            s = hash_docs(h, docs)
            stats[name] = {
                "docs": s.docs,
                "source_docs": len(splits[name]),
                "bytes": s.bytes,
                "chars": s.chars,
                "files": [f"{name}.parquet"],
            }
        stop_if_requested()
        meta = source.meta()
        manifest = {
            "format": FORMAT,
            "source": source.name,
            "identity": identity,
            "identity_hash": identity_hash,
            "splits": stats,
            "corpus_hash": h.hexdigest(),
            "entropy_bits_per_byte": meta.get("entropy_bits_per_byte"),
            "source_meta": meta,
        }
        write_json(corpus_dir / "manifest.json", manifest)
        sizes = ", ".join(f"{n} {stats[n]['docs']} docs / {stats[n]['bytes']:,} B" for n in SPLITS)
        log(f"data: {sizes}")
        return Corpus(corpus_dir, manifest, files)


def _prepare_climbmix(cfg: DataConfig, root: Path, log: Callable[[str], None]) -> Corpus:
    train_ids = climbmix.train_shard_ids(cfg.num_shards)
    url_hash = _short_hash({"base_url": cfg.base_url.rstrip("/")})
    download_dir = root / "downloads" / f"climbmix-{url_hash[:12]}"
    identity = {
        "source": "climbmix",
        "identity": {
            "base_url": cfg.base_url.rstrip("/"),
            "train_shards": len(train_ids),
            "val_shard": climbmix.VAL_SHARD,
        },
    }
    identity_hash = _short_hash(identity)
    corpus_dir = root / "corpora" / f"climbmix-{identity_hash[:12]}"
    corpus_dir.mkdir(parents=True, exist_ok=True)
    downloader = climbmix.Downloader(
        cfg.base_url, download_dir, cfg.download_retries, cfg.download_backoff_s, cfg.download_timeout_s, log
    )
    with filelock.FileLock(str(corpus_dir / ".lock")):
        ids = [*train_ids, climbmix.VAL_SHARD] if climbmix.VAL_SHARD not in train_ids else train_ids
        paths = downloader.fetch_all(ids, cfg.download_workers)  # no-op when all present
        train = [p for i, p in zip(ids, paths) if i != climbmix.VAL_SHARD]
        val = [download_dir / climbmix.shard_name(climbmix.VAL_SHARD)]
        if not train:
            raise UsageError("climbmix needs at least one training shard besides the validation shard")
        files = {"train": train, "val": val, "holdout": val}
        windows = {"train": 0, "val": 0, "holdout": 1}
        manifest = _load_manifest(corpus_dir / "manifest.json", identity_hash)
        if manifest is not None:
            log(f"data: reusing climbmix corpus ({len(train)} training shards) at {download_dir}")
            return Corpus(corpus_dir, manifest, files, windows)

        h = hashlib.sha256()
        shards = []
        for path in train + val:
            digest = sha256_file(path)
            h.update(f"{path.name}\0{digest}\n".encode())
            shards.append({"name": path.name, "sha256": digest, "docs": open_parquet(path).metadata.num_rows})
        train_docs = sum(s["docs"] for s in shards[:-1])
        manifest = {
            "format": FORMAT,
            "source": "climbmix",
            "identity": identity,
            "identity_hash": identity_hash,
            "download_dir": download_dir.relative_to(root).as_posix(),
            "shards": shards,
            "splits": {
                "train": {"docs": train_docs, "files": [p.name for p in train]},
                "val": {"docs": shards[-1]["docs"], "files": [val[0].name], "eval_window": 0},
                "holdout": {"docs": shards[-1]["docs"], "files": [val[0].name], "eval_window": 1},
            },
            "corpus_hash": h.hexdigest(),
            "entropy_bits_per_byte": None,
            "source_meta": {"base_url": cfg.base_url},
        }
        write_json(corpus_dir / "manifest.json", manifest)
        return Corpus(corpus_dir, manifest, files, windows)
