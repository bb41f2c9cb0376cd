"""BPE tokenizer: trained with rustbpe (optional: only training needs it), served by tiktoken, stored as plain JSON.

The stored file `muonlab-bpe.json` (named so that no tool mistakes it for a Hugging Face
`tokenizer.json`; caches written before are read under that older name) holds the split pattern, the mergeable ranks (token
bytes in base64, position = rank), the special tokens, the byte length of every token
(for bits-per-byte) and how it was trained. No pickle anywhere, so loading a tokenizer
from a shared cache can never execute code.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tiktoken
import torch

from muonlab.atomic import atomic_open
from muonlab.data.encoding_processes import EncodingSpec
from muonlab.errors import CorruptInput, MuonlabError, UsageError
from muonlab.optional import require

# GPT-4 style split, with numbers grouped by at most 2 digits (as upstream).
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
_TEXTS_PER_THREAD = 64  # below this many texts per thread, starting threads costs more than it saves


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


SPECIAL_TOKENS = tuple(f"<|reserved_{i}|>" for i in range(4))
BOS_TOKEN = SPECIAL_TOKENS[0]
FILE_NAME = "muonlab-bpe.json"
OLD_FILE_NAME = "tokenizer.json"  # the same content, as caches of earlier releases named it
FORMAT = "muonlab-bpe-v1"


class Tokenizer:
    """A trained BPE vocabulary: mergeable ranks followed by 4 reserved special tokens."""

    def __init__(self, pattern: str, ranks: list[bytes], training: dict | None = None):
        self.pattern = pattern
        self.ranks = list(ranks)
        self.training = dict(training or {})
        offset = len(self.ranks)
        self.special_tokens = {name: offset + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.enc = tiktoken.Encoding(
            name="muonlab-bpe",
            pat_str=pattern,
            mergeable_ranks={tok: rank for rank, tok in enumerate(self.ranks)},
            special_tokens=self.special_tokens,
        )
        self.bos_token_id = self.special_tokens[BOS_TOKEN]
        self._token_bytes = _compute_token_bytes(self.enc, self.special_tokens)
        self._fingerprint: str | None = None

    # --- training -----------------------------------------------------------------
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, training: dict | None = None) -> "Tokenizer":
        """Train on `texts`; UsageError if the text is too small to learn `vocab_size` tokens."""
        n_ranks = vocab_size - len(SPECIAL_TOKENS)
        if n_ranks < 256:
            raise UsageError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)}, got {vocab_size}")
        bpe = require("rustbpe", "training a BPE tokenizer").Tokenizer()  # serving one needs only tiktoken
        bpe.train_from_iterator(iter(texts), n_ranks, pattern=SPLIT_PATTERN)
        pairs = bpe.get_mergeable_ranks()
        if len(pairs) < n_ranks:
            raise UsageError(
                f"training text is too small for vocab_size {vocab_size}: BPE found only "
                f"{len(pairs) - 256} merges; use a smaller vocab_size or a larger corpus"
            )
        ranks: list[bytes | None] = [None] * len(pairs)
        for tok, rank in pairs:
            ranks[rank] = bytes(tok)
        if any(tok is None for tok in ranks):
            raise MuonlabError("rustbpe returned non-contiguous ranks")  # we store rank = position
        return cls(bpe.get_pattern(), ranks, training)

    # --- storage ------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "pattern": self.pattern,
            "ranks": [base64.b64encode(tok).decode("ascii") for tok in self.ranks],
            "special_tokens": self.special_tokens,
            "bos_token": BOS_TOKEN,
            "token_bytes": self._token_bytes.tolist(),
            "training": self.training,
        }

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `directory/muonlab-bpe.json` atomically; return its path."""
        path = Path(directory) / FILE_NAME
        data = _canonical_bytes(self.to_json())
        with atomic_open(path, "wb") as f:
            f.write(data)
        self._fingerprint = hashlib.sha256(data).hexdigest()
        return path

    @staticmethod
    def stored(directory: str | os.PathLike) -> Path | None:
        """The tokenizer file in `directory` (today's name, else the earlier one), or None."""
        for name in (FILE_NAME, OLD_FILE_NAME):
            if (Path(directory) / name).is_file():
                return Path(directory) / name
        return None

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Tokenizer":
        path = cls.stored(directory) or Path(directory) / FILE_NAME
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise UsageError(f"no tokenizer at {path}; prepare the data first") from None
        try:
            obj = json.loads(raw)
            if obj.get("format") != FORMAT:
                raise ValueError(f"unknown format {obj.get('format')!r}")
            ranks = [base64.b64decode(tok) for tok in obj["ranks"]]
            tok = cls(obj["pattern"], ranks, obj.get("training"))
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptInput(f"corrupted tokenizer file {path}: {e}") from None
        if obj.get("special_tokens") != tok.special_tokens or obj.get("token_bytes") != tok._token_bytes.tolist():
            raise MuonlabError(f"corrupted tokenizer file {path}: special tokens or token_bytes disagree")
        tok._fingerprint = hashlib.sha256(raw).hexdigest()
        return tok

    @property
    def fingerprint(self) -> str:
        """sha256 of the stored file (of what save() would write, if unsaved)."""
        if self._fingerprint is None:
            self._fingerprint = hashlib.sha256(_canonical_bytes(self.to_json())).hexdigest()
        return self._fingerprint

    # --- encoding -----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.enc.n_vocab

    def encode(self, text: str) -> list[int]:
        """Encode as ordinary text: special-token strings in `text` are not special."""
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str], prepend_bos: bool = True, num_threads: int = 8) -> list[list[int]]:
        """Encode each text as ordinary text, on up to `num_threads` threads (tiktoken releases the GIL).

        Each thread takes one contiguous slice: tiktoken's own batch call submits one task per
        text, whose overhead exceeds the work for short documents (serial encoding beats it on
        2 cores). The tokens are the same either way."""
        threads = max(1, min(num_threads, len(texts) // _TEXTS_PER_THREAD, usable_cpus()))
        if threads == 1:
            rows = [self.enc.encode_ordinary(t) for t in texts]
        else:
            step = -(-len(texts) // threads)
            slices = [texts[i:i + step] for i in range(0, len(texts), step)]
            with ThreadPoolExecutor(len(slices)) as pool:
                parts = list(pool.map(lambda part: [self.enc.encode_ordinary(t) for t in part], slices))
            rows = [row for part in parts for row in part]
        if prepend_bos:
            bos = self.bos_token_id
            rows = [[bos, *row] for row in rows]
        return rows

    def encoding_spec(self) -> EncodingSpec:
        """What a tokenizing worker process rebuilds this encoding from (muonlab.data.encoding_processes)."""
        return EncodingSpec(self.pattern, list(self.ranks), dict(self.special_tokens), self.bos_token_id)

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode(list(ids))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return self.enc.decode_bytes(list(ids))

    def token_bytes(self, device: str | torch.device = "cpu") -> torch.Tensor:
        """int32 [vocab]: UTF-8 length of each token's decoded string; 0 for special tokens."""
        return self._token_bytes.clone().to(device)


def _compute_token_bytes(enc: tiktoken.Encoding, special_tokens: dict[str, int]) -> torch.Tensor:
    # As upstream: length of the *decoded string* re-encoded, so a token that is a partial
    # UTF-8 sequence counts as its replacement character (3 bytes).
    special_ids = set(special_tokens.values())
    lengths = [0 if i in special_ids else len(enc.decode([i]).encode("utf-8")) for i in range(enc.n_vocab)]
    return torch.tensor(lengths, dtype=torch.int32)


def _canonical_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
