"""Prepare a corpus and its tokenizer; hand out documents, training loaders and eval rows."""

from __future__ import annotations

import lzma
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import filelock
import torch

from muonlab.data.config import DataConfig
from muonlab.data.corpus import Corpus, prepare_corpus
from muonlab.data.encoded_store import EncodedStore
from muonlab.data.encoding_processes import main_is_spawn_safe
from muonlab.data.packing import BestFitLoader, RowPacker
from muonlab.data.sources import SPLITS
from muonlab.data.store import DocBatch, iter_doc_batches, iter_docs
from muonlab.data.tokenizer import Tokenizer, usable_cpus
from muonlab.errors import UsageError
from muonlab.paths import cache_root
from muonlab.settings import validate_tree


def compress_bits_per_byte(text: str | bytes) -> float:
    """Bits per byte of `text` under xz -9e (lzma preset 9 | PRESET_EXTREME)."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if not data:
        raise UsageError("cannot compress an empty text")
    return 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise UsageError(f"split {split!r} is not one of {', '.join(SPLITS)}")


@dataclass
class PreparedData:
    """A prepared corpus with its tokenizer, ready for training and evaluation."""

    config: DataConfig
    tokenizer: Tokenizer
    corpus_dir: Path
    manifest: dict
    corpus_hash: str
    tokenizer_hash: str
    entropy_bits_per_byte: float | None
    corpus: Corpus = field(repr=False)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def tokenizer_dir(self) -> Path:
        return self.corpus_dir / f"tokenizer-v{self.tokenizer.vocab_size}"

    def describe(self) -> dict:
        """Flat, printable summary: where the corpus and tokenizer are, sizes, hashes."""
        out = {
            "source": self.manifest["source"],
            "corpus_dir": str(self.corpus_dir),
            "corpus_hash": self.corpus_hash,
            "tokenizer_dir": str(self.tokenizer_dir),
            "tokenizer_hash": self.tokenizer_hash,
            "vocab_size": self.tokenizer.vocab_size,
        }
        for split in SPLITS:
            for key in ("docs", "bytes"):
                value = self.manifest["splits"][split].get(key)
                if value is not None:
                    out[f"{split}_{key}"] = value
        if self.entropy_bits_per_byte is not None:
            out["entropy_bits_per_byte"] = round(self.entropy_bits_per_byte, 6)
        return out

    # --- documents ------------------------------------------------------------------
    def documents(self, split: str, start: int = 0, one_pass: bool = False) -> Iterator[DocBatch]:
        """Batches of up to 128 documents, from batch index `start`.

        `train` cycles forever (unless `one_pass`) and `DocBatch.epoch` counts passes
        from 1; `val` and `holdout` make one pass. ClimbMix holdout has no documents of its own (it is a
        later stretch of the val stream): use eval_rows / eval_stream for it.
        """
        _check_split(split)
        if self.corpus.eval_window[split] != 0:
            raise UsageError(f"{self.manifest['source']} {split} is an offset into the val stream; use eval_rows")
        return iter_doc_batches(self.corpus.files[split], start=start, cycle=(split == "train" and not one_pass))

    def split_text(self, split: str, max_bytes: int | None = None) -> str:
        """The split's documents joined by newlines (small corpora), at most `max_bytes`."""
        _check_split(split)
        if self.manifest["source"] == "climbmix":
            raise UsageError("climbmix splits are too large for split_text; use eval_bytes")
        parts, total = [], 0
        for doc in iter_docs(self.corpus.files[split]):
            parts.append(doc)
            total += len(doc.encode("utf-8")) + 1
            if max_bytes is not None and total >= max_bytes:
                break
        text = "\n".join(parts)
        if max_bytes is not None:
            text = text.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")
        return text

    # --- loaders --------------------------------------------------------------------
    def loader(
        self,
        B: int,
        T: int,
        split: str = "train",
        device: str | torch.device = "cpu",
        rank: int = 0,
        world_size: int = 1,
        buffer_size: int = 1000,
        seed: int = 0,
    ) -> BestFitLoader:
        """Best-fit packed (x, y, epoch) batches of `split` (train cycles forever). The packed stream
        has one order whatever the run's seed (upstream's); `seed` is for the token-file loaders'
        interface (muonlab.data.token_data), which shuffle per seed."""
        _check_split(split)
        self.documents(split)  # validates the split
        return BestFitLoader(
            lambda start: self.documents(split, start), self.tokenizer, B, T, buffer_size, device, rank, world_size,
            **self._encoding(world_size, device), store=self.encoded_store(split),
        )

    def encoded_store(self, split: str) -> EncodedStore | None:
        """Where the packer reads `split`'s document batches' ids instead of tokenizing them: a split of a
        small corpus (at most `data.encoded_store_mb`); None for a larger one, tokenized as it is read."""
        size = self.manifest.get("splits", {}).get(split, {}).get("bytes")
        if size is None or size > self.config.encoded_store_mb * 2**20:
            return None
        return EncodedStore(self.tokenizer_dir / "encoded", self.tokenizer_hash)

    def _encoding(self, world_size: int, device: str | torch.device) -> dict[str, int]:
        """How a rank's packer encodes the next document batches at once: on threads or in worker processes
        (`data.encode_processes`), with a share of the machine's cores per rank (the same ids either way).
        Left to none, processes only feed a GPU: a CPU run's step uses the cores they would take."""
        share = max(1, usable_cpus() // world_size)
        processes = self.config.encode_processes
        if processes is None:
            feeds_gpu = torch.device(device).type == "cuda"
            processes = encode_processes_for(share, main_is_spawn_safe()) if feeds_gpu else 0
        return {"encode_workers": min(8, share), "encode_processes": processes}

    def eval_stream(self, split: str, T: int, max_tokens: int) -> tuple[Callable[[int], Iterator[DocBatch]], int]:
        """(documents factory, row offset) of the packed stream that `split` is evaluated on.

        Rows are T+1 tokens and an eval window is max_tokens // T rows. Small corpora:
        each split's own documents, offset 0. ClimbMix: val and holdout both pack the
        val shard; holdout starts one window later.
        """
        _check_split(split)
        n_rows = max_tokens // T
        if n_rows < 1:
            raise UsageError(f"max_tokens ({max_tokens}) must be at least T ({T})")
        files = self.corpus.files[split]
        return (lambda start: iter_doc_batches(files, start=start)), self.corpus.eval_window[split] * n_rows

    def _eval_row_iter(self, split: str, T: int, max_tokens: int, buffer_size: int, world_size: int = 1,
                       device: str | torch.device = "cpu") -> Iterator:
        factory, offset = self.eval_stream(split, T, max_tokens)
        # gpu-d8 scores 2 x 20,971,520 tokens (and skips as many to holdout's window): encoded as training is
        packer = RowPacker(factory, self.tokenizer, T, buffer_size, **self._encoding(world_size, device),
                           store=self.encoded_store(split))
        try:
            if packer.skip_rows(offset) < offset:
                raise UsageError(f"the {split} stream ends before its evaluation window starts (row {offset})")
            for _ in range(max_tokens // T):
                row = packer.next_row()
                if row is None:
                    return
                yield row
        finally:
            packer.close()

    def eval_rows(
        self, split: str, B: int, T: int, max_tokens: int, device: str | torch.device = "cpu", buffer_size: int = 1000,
        world_size: int = 1,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Packed evaluation batches (x, y) of `split`: at most max_tokens // T rows, one pass.

        The last batch may hold fewer than B rows; a split too small for one full row
        raises UsageError rather than yielding nothing. `world_size`: the processes on this machine that
        each pack the whole stream (and score their share), to share its cores for encoding.
        """
        if B < 1:
            raise UsageError(f"batch size B must be >= 1, got {B}")
        rows: list[torch.Tensor] = []
        produced = 0
        for row in self._eval_row_iter(split, T, max_tokens, buffer_size, world_size, device):
            rows.append(torch.from_numpy(row))
            produced += 1
            if len(rows) == B:
                yield _to_xy(rows, device)
                rows = []
        if rows:
            yield _to_xy(rows, device)
        if produced == 0:
            raise UsageError(f"the {split} split has fewer than {T + 1} tokens: too small to evaluate with T={T}")

    def eval_bytes(self, split: str, T: int, max_tokens: int, buffer_size: int = 1000) -> bytes:
        """The bytes of the target tokens of eval_rows(split, ...), BOS dropped.

        Its length equals the bits-per-byte denominator (sum of token_bytes over the
        targets) except for tokens that are partial UTF-8 sequences; compare a model's
        bpb with compress_bits_per_byte(eval_bytes(...)).
        """
        bos = self.tokenizer.bos_token_id
        out = bytearray()
        for row in self._eval_row_iter(split, T, max_tokens, buffer_size):
            out += self.tokenizer.decode_bytes(int(t) for t in row[1:] if t != bos)
        return bytes(out)


def encode_processes_for(cores: int, spawn_safe: bool = True) -> int:
    """`data.encode_processes` left to none: the tokenizing processes a rank with `cores` cores gets. Two
    cores stay with the training process (the step's thread and the packing thread); a small machine
    encodes on threads instead, where starting processes would cost more than it saves, and so does a
    program whose main module a spawned worker would run again (encoding_processes.main_is_spawn_safe)."""
    return min(8, cores - 2) if cores >= 4 and spawn_safe else 0


def _to_xy(rows: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    batch = torch.stack(rows)
    return batch[:, :-1].contiguous().to(device), batch[:, 1:].contiguous().to(device)


def _training_texts(corpus: Corpus, max_chars: int, doc_cap: int) -> Iterator[str]:
    # As upstream: each document capped at doc_cap chars, stop once max_chars are used.
    used = 0
    for doc in iter_docs(corpus.files["train"]):
        doc = doc[:doc_cap]
        used += len(doc)
        yield doc
        if used >= max_chars:
            return


def _ensure_tokenizer(cfg: DataConfig, corpus: Corpus, log: Callable[[str], None]) -> Tokenizer:
    tok_dir = corpus.dir / f"tokenizer-v{cfg.vocab_size}"
    training = {
        "corpus_hash": corpus.manifest["corpus_hash"],
        "split": "train",
        "vocab_size": cfg.vocab_size,
        "max_chars": cfg.tokenizer_max_chars,
        "doc_cap": cfg.tokenizer_doc_cap,
    }
    tok_dir.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(tok_dir / ".lock")):
        if Tokenizer.stored(tok_dir) is not None:
            tok = Tokenizer.load(tok_dir)
            if tok.training == training:
                log(f"data: reusing tokenizer at {tok_dir}")
                return tok
            log("data: stored tokenizer was trained with other settings; retraining")
        t0 = time.perf_counter()
        texts = _training_texts(corpus, cfg.tokenizer_max_chars, cfg.tokenizer_doc_cap)
        tok = Tokenizer.train(texts, cfg.vocab_size, training)
        tok.save(tok_dir)
        log(f"data: trained vocab-{cfg.vocab_size} tokenizer in {time.perf_counter() - t0:.1f}s at {tok_dir}")
        return tok


def prepare_data(cfg: DataConfig, log: Callable[[str], None] = print) -> PreparedData:
    """Download or build the corpus, train (or reuse) the tokenizer on its train split."""
    validate_tree(cfg)  # its ranges, then its own checks
    root = cache_root(cfg.cache_dir)
    corpus = prepare_corpus(cfg, root, log)
    tokenizer = _ensure_tokenizer(cfg, corpus, log)
    return PreparedData(
        config=cfg,
        tokenizer=tokenizer,
        corpus_dir=corpus.dir,
        manifest=corpus.manifest,
        corpus_hash=corpus.manifest["corpus_hash"],
        tokenizer_hash=tokenizer.fingerprint,
        entropy_bits_per_byte=corpus.manifest.get("entropy_bits_per_byte"),
        corpus=corpus,
    )
