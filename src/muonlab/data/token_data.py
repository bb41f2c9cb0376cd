"""Token arrays per split, the data of seed 004's families (released code; seed 004 §3.1 says only 'token cache').

The paper trains every setting from pre-tokenized token memmaps (`muonlab.data.memmap_format`):
train and eval files, non-overlapping blocks shuffled per seed. `TokenData` holds one
`TokenMemmap` per split (train, val, and holdout when the data has one) and hands out the
family's loader (its `batcher`: NanoGPT blocks, T5 prefix-to-continuation windows, ImageGPT
images) with the run seed. It comes from:

  - a folder the user already has (`--source memmap --path DIR`): `train.bin` and `val.bin`
    (or `eval.bin`, the reference's name), optional `holdout.bin`, described by `metadata.json`;
  - any text corpus: the documents of each split tokenized (BPE or a `tokenizer.json`) and
    joined into one stream per split (`text_token_data`, written once into the cache);
  - FASTA and images (`muonlab.data.fasta`, `muonlab.data.images`), written the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import filelock
import numpy as np

from muonlab.atomic import write_json, folder_undone_on_failure
from muonlab.data.memmap_format import TokenMemmap, TokenMemmapWriter, default_dtype
from muonlab.errors import UsageError

SPLITS = ("train", "val", "holdout")
EVAL_ALIASES = {"val": ("val.bin", "eval.bin"), "holdout": ("holdout.bin",), "train": ("train.bin",)}

# (memmap, B, T, seed, device, rank, world_size) -> an infinite, resumable (x, y, epoch) loader
Batcher = Callable[..., Iterator]


@dataclass
class TokenData:
    """Token memmaps per split and what the run records about them."""

    source: str
    files: dict[str, TokenMemmap]
    tokenizer_name: str
    identity: dict = field(default_factory=dict)
    batcher: Batcher | None = None
    entropy_bits_per_byte: float | None = None

    def __post_init__(self) -> None:
        for split in ("train", "val"):
            if split not in self.files:
                raise UsageError(f"{self.source} data has no {split} split")
        sizes = {mm.vocab_size for mm in self.files.values()}
        if len(sizes) != 1:
            raise UsageError(f"the splits' token files disagree on the vocabulary size: {sorted(sizes)}")

    @property
    def vocab_size(self) -> int:
        return self.files["train"].vocab_size

    @property
    def corpus_hash(self) -> str:
        return _short_hash({"identity": self.identity,
                            "files": {s: (mm.path.name, mm.num_tokens) for s, mm in self.files.items()}})

    @property
    def tokenizer_hash(self) -> str:
        return _short_hash({"tokenizer": self.tokenizer_name, "vocab_size": self.vocab_size})

    def describe(self) -> dict:
        out = {"source": self.source, "tokenizer": self.tokenizer_name, "vocab_size": self.vocab_size,
               "corpus_hash": self.corpus_hash}
        for split, mm in self.files.items():
            out[f"{split}_file"] = str(mm.path)
            out[f"{split}_tokens"] = mm.num_tokens
        return out

    def with_batcher(self, batcher: Batcher) -> "TokenData":
        self.batcher = batcher
        return self

    def loader(self, B: int, T: int, split: str = "train", device="cpu", rank: int = 0, world_size: int = 1,
               seed: int = 0):
        if self.batcher is None:
            raise UsageError("this token data has no loader (its family sets one)")
        if split not in self.files:
            raise UsageError(f"{self.source} data has no {split} split")
        return self.batcher(self.files[split], B, T, seed, device, rank, world_size)


def _short_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def memmap_folder(path: str | None) -> TokenData:
    """`--source memmap`: train.bin, val.bin (or eval.bin) and an optional holdout.bin in `path`."""
    if not path:
        raise UsageError("data source 'memmap' needs --path, a folder with train.bin, val.bin and metadata.json")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UsageError(f"memmap folder {folder} does not exist")
    files = {}
    for split, names in EVAL_ALIASES.items():
        found = [folder / n for n in names if (folder / n).is_file()]
        if found:
            files[split] = TokenMemmap(found[0])
        elif split != "holdout":
            raise UsageError(f"memmap folder {folder} has no {' or '.join(names)}")
    tokenizers = {mm.tokenizer for mm in files.values()}
    if len(tokenizers) != 1:
        raise UsageError(f"the token files in {folder} name different tokenizers: {sorted(tokenizers)}")
    return TokenData("memmap", files, tokenizers.pop(), identity={"folder": str(folder.resolve())})


def write_once(out_dir: Path, write: Callable[[Path], list[str]], log: Callable[[str], None] = print) -> list[str]:
    """Run `write(out_dir)` (which writes the split files and returns their names) once: under a file
    lock, so concurrent runs write a set once, and marked complete by `done.json`; afterwards the
    recorded split names are returned without writing."""
    done = out_dir / "done.json"
    with folder_undone_on_failure(out_dir), filelock.FileLock(str(out_dir / ".lock")):
        if done.is_file():
            log(f"data: reusing token files at {out_dir}")
        else:
            write_json(done, {"splits": write(out_dir)})
            log(f"data: wrote token files to {out_dir}")
        return json.loads(done.read_text())["splits"]


def write_split_streams(out_dir: Path, make_streams: Callable[[], dict[str, Iterable]], vocab_size: int,
                        tokenizer: str, extra: dict, log: Callable[[str], None] = print) -> dict[str, TokenMemmap]:
    """out_dir/{split}.bin of each split's token chunks, written once (`write_once`): `make_streams()`
    (which may read and tokenize a corpus) is called only when the files do not exist yet."""

    def write(folder: Path) -> list[str]:
        streams = make_streams()
        for split, chunks in streams.items():
            with TokenMemmapWriter(folder / f"{split}.bin", vocab_size, tokenizer,
                                   default_dtype(vocab_size), extra) as writer:
                for chunk in chunks:
                    writer.append(np.asarray(chunk, dtype=np.int64))
            if writer.num_tokens == 0:
                raise UsageError(f"the {split} split has no tokens ({folder})")
        return list(streams)

    return {split: TokenMemmap(out_dir / f"{split}.bin") for split in write_once(out_dir, write, log)}


def text_token_data(prepared, log: Callable[[str], None] = print) -> TokenData:
    """A prepared text corpus (muonlab.data.prepare) as one token stream per split: each document
    with the tokenizer's BOS in front (the packed loader's convention), in split order."""
    corpus = prepared.corpus
    tok = prepared.tokenizer
    splits = [s for s in SPLITS if corpus.eval_window[s] == 0]  # ClimbMix holdout is an offset: left out
    out_dir = prepared.corpus_dir / f"token-stream-{prepared.tokenizer_hash[:12]}"

    def chunks(split):
        for batch in prepared.documents(split, one_pass=True):
            for row in tok.encode_batch(list(batch.docs)):
                yield row

    files = write_split_streams(out_dir, lambda: {s: chunks(s) for s in splits}, tok.vocab_size, "bpe",
                                {"corpus_hash": prepared.corpus_hash, "tokenizer_hash": prepared.tokenizer_hash}, log)
    return TokenData(prepared.manifest["source"], files, f"bpe-{tok.vocab_size}",
                     identity={"corpus_hash": prepared.corpus_hash, "tokenizer_hash": prepared.tokenizer_hash},
                     entropy_bits_per_byte=prepared.entropy_bits_per_byte)
