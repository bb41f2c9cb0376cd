"""Configuration of the data layer: which corpus, how it is split, and the tokenizer size."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

from muonlab.errors import UsageError
from muonlab.settings import (COUNT, MAX_COUNT, MAX_TOKENS, NON_NEGATIVE, POSITIVE, POSITIVE_COUNT, TOKENS, Range, Section,
                              setting)

TEXT_SOURCES = ("climbmix", "local", "stdlib", "synthetic")  # documents of text, split and tokenized here
# seed 004's other data (muonlab.data.token_data): token files the user has, images, proteins
TOKEN_SOURCES = ("memmap", "images", "synthetic_images", "fasta", "synthetic_protein")
SOURCES = TEXT_SOURCES + TOKEN_SOURCES
PATH_SOURCES = ("local", "memmap", "images", "fasta")

# Upstream's pre-shuffled ClimbMix shards on the Hugging Face hub.
CLIMBMIX_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
HUB_URL = re.compile(r"^(?P<endpoint>https?://.+?)/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/?$")


def hub_location(base_url: str) -> tuple[str, str, str] | None:
    """(endpoint, dataset repo, revision) of a Hugging Face dataset URL, or None."""
    m = HUB_URL.match(base_url)
    return None if m is None else (m["endpoint"], m["repo"], m["revision"])
CLIMBMIX_MAX_SHARD = 6542  # the last shard, pinned as the validation shard

TXT_MODES = ("file", "paragraph")
OPEN_FRACTION = Range(0, 1, low_open=True, high_open=True)  # a split of none or all of the documents is no split


_AT_LEAST_TWO = Range(2, MAX_COUNT, why="a count no run reaches")  # a vocabulary, a document: two words at least


@dataclass
class DataConfig(Section):
    """Everything that decides which documents exist, how they split, and the tokenizer.

    Small corpora (local, stdlib, synthetic) are split by document into train/val/holdout
    with `val_fraction` and `holdout_fraction`. ClimbMix uses upstream's fixed split:
    shards 0..num_shards-1 for training and the pinned shard 06542 for val and holdout.
    Download settings and the cache folder cannot change a number (hashed=False).
    """

    source: Literal[SOURCES] = setting("stdlib", "corpus: climbmix (upstream's shards), local (your files), "
                                       "stdlib (the embedded Python stdlib), synthetic (Markov text with a known entropy rate)")
    path: str | None = setting(None, "local: a file or a folder of .txt/.jsonl/.parquet; memmap: a folder of "
                               "train.bin, val.bin (or eval.bin) [, holdout.bin] and metadata.json; images: a "
                               "folder of PNG/JPEG, .npy/.npz arrays (ImageNet-32's batches too) or image parquet, "
                               "or a glob of them; fasta: a FASTA file (.gz too) or folder")
    eval_path: str | None = setting(None, "images: the evaluation images (the paper's validation split); none "
                                    "holds out val_fraction of the training images")
    tokenizer_json: str | None = setting(None, "local / fasta: tokenize with this Hugging Face tokenizer.json "
                                         "(none: train a BPE on the text; one token per residue for FASTA)")
    synthetic_images: int = setting(2048, "synthetic_images: how many images (the size is the model's; at least 2: "
                                    "one is held out)", range=Range(2, MAX_COUNT, why="a count no run reaches"))
    local_txt_docs: Literal[TXT_MODES] = setting("file", "local .txt: one document per file, or per blank-line paragraph")
    # Best-fit packing crops a document longer than a row and drops its tail, so with long
    # files and a short T most text would never be seen: cut them after the split.
    max_doc_chars: int | None = setting(None, "small corpora: cut longer documents into line-aligned pieces "
                                        "after the split (none keeps whole documents)",
                                        range=Range(16, MAX_TOKENS, why="more than any dataset"))
    num_shards: int = setting(10, "climbmix training shards; -1 means all of them")
    base_url: str = setting(CLIMBMIX_URL, "climbmix: where the shards are downloaded from")
    download_workers: int = setting(8, "climbmix: parallel downloads", hashed=False, range=POSITIVE_COUNT)
    download_retries: int = setting(5, "climbmix: attempts per shard", hashed=False, range=POSITIVE_COUNT)
    download_backoff_s: float = setting(2.0, "climbmix: sleep backoff_s * 2**(attempt-1) between attempts", hashed=False,
                                        range=NON_NEGATIVE)
    download_timeout_s: float = setting(30.0, "climbmix: seconds before a stalled download is retried", hashed=False,
                                        range=POSITIVE)
    prefetch_batches: int = setting(4, "training batches a worker thread makes ahead of the step, so tokenizing and "
                                    "packing overlap it (0: made between steps in the training thread, as upstream); "
                                    "the same batches either way", hashed=False, range=COUNT)
    encode_processes: int | None = setting(None, "worker processes that tokenize the training documents ahead of "
                                           "the packer (0: threads of the training process, whose GIL the step "
                                           "shares); none: on a GPU run, this rank's share of the cores less 2, "
                                           "at most 8, when the share is 4 or more and the program is the muonlab "
                                           "command, python -m muonlab or a notebook (a script a spawned worker "
                                           "would run again gets 0); else 0; the same batches either way",
                                           hashed=False, range=COUNT)
    encoded_store_mb: int = setting(64, "small corpora: a split of at most this many MB keeps its document batches' "
                                    "token ids on disk beside the tokenizer, which later runs read instead of "
                                    "tokenizing again (0: never); the same batches either way", hashed=False,
                                    range=COUNT)
    vocab_size: int = setting(8192, "BPE vocabulary size (tokens: 256 bytes and 4 specials at least)",
                              range=Range(260, 1_000_000, why="a million tokens"))
    tokenizer_max_chars: int = setting(1_000_000_000, "characters of the train split fed to BPE training",
                                       range=TOKENS)
    tokenizer_doc_cap: int = setting(10_000, "characters taken from each document for BPE training",
                                     range=TOKENS)
    val_fraction: float = setting(0.05, "small corpora: share of documents in the val split", range=OPEN_FRACTION)
    holdout_fraction: float = setting(0.05, "small corpora: share of documents in the holdout split",
                                      range=OPEN_FRACTION)
    synthetic_bytes: int = setting(4_000_000, "synthetic: corpus size in bytes",
                                   range=Range(1000, MAX_TOKENS, why="more than any dataset"))
    synthetic_seed: int = setting(0, "synthetic: seed of the Markov chain and its text")
    synthetic_words: int = setting(512, "synthetic: distinct words in the vocabulary", range=_AT_LEAST_TWO)
    synthetic_branching: int = setting(8, "synthetic: random successors per word (plus one fixed edge; fewer than "
                                       "the words)", range=POSITIVE_COUNT)
    synthetic_doc_words: int = setting(256, "synthetic: words per document", range=_AT_LEAST_TWO)
    cache_dir: str | None = setting(None, "data, tokenizer and runs cache (default: $MUONLAB_CACHE or "
                                    "~/.cache/muonlab)", hashed=False)

    def inactive(self) -> dict[str, str]:
        why = f"the data source is {self.source}"
        src = self.source
        out = {}
        if src not in PATH_SOURCES:
            out.update(path=why)
        if src != "local":
            out.update(local_txt_docs=why)
        if src != "images":
            out.update(eval_path=why)
        if src not in ("local", "fasta"):
            out.update(tokenizer_json=why)
        if src not in ("local", "stdlib", "synthetic"):
            out.update(max_doc_chars=why)
        elif src == "local" and self.tokenizer_json:  # the tokenizer.json path tokenizes whole documents
            out.update(max_doc_chars="local text with --tokenizer-json is tokenized document by document, uncut")
        if src in ("climbmix", "memmap") or (src == "images" and self.eval_path):
            out.update(val_fraction=why if src != "images" else "images: --eval-path gives the evaluation images")
        if src in ("climbmix", "memmap", "images", "synthetic_images"):
            out.update(holdout_fraction=why)
        if src != "climbmix":
            out.update(num_shards=why, base_url=why, download_workers=why, download_retries=why,
                       download_backoff_s=why, download_timeout_s=why)
        if src != "synthetic":
            out.update({k: why for k in ("synthetic_words", "synthetic_branching", "synthetic_doc_words")})
        if src not in ("synthetic", "synthetic_protein"):
            out.update(synthetic_bytes=why)
        if src not in ("synthetic", "synthetic_protein", "synthetic_images"):
            out.update(synthetic_seed=why)
        if src != "synthetic_images":
            out.update(synthetic_images=why)
        if src in TOKEN_SOURCES or (src == "local" and self.tokenizer_json):
            why_vocab = f"the vocabulary is the data's ({src}{', tokenizer.json' if self.tokenizer_json else ''})"
            out.update(vocab_size=why_vocab, tokenizer_max_chars=why_vocab, tokenizer_doc_cap=why_vocab)
        return out

    def validate(self) -> "DataConfig":  # noqa: D102
        """Raise UsageError with one line naming the first bad field; return self. The ranges are checked first,
        by settings.validate_tree (a DataConfig made in code: validate_tree(cfg))."""
        if self.source not in SOURCES:
            raise UsageError(f"data source {self.source!r} is not one of {', '.join(SOURCES)}")
        if self.source == "local" and not self.path:  # the token sources check theirs when they are read
            raise UsageError("data source 'local' needs --path: a file or a folder of .txt/.jsonl/.parquet")
        if self.local_txt_docs not in TXT_MODES:
            raise UsageError(f"local_txt_docs {self.local_txt_docs!r} is not one of {', '.join(TXT_MODES)}")
        if self.num_shards != -1 and self.num_shards < 1:
            raise UsageError(f"num_shards must be >= 1 or -1 (all), got {self.num_shards}")
        if self.source == "climbmix" and hub_location(self.base_url) is None:
            raise UsageError(f"base_url must name a Hugging Face dataset, <endpoint>/datasets/<owner>/<name>/resolve/"
                             f"<revision> (huggingface_hub downloads it), got {self.base_url!r}")
        if self.val_fraction + self.holdout_fraction >= 1.0:
            raise UsageError("val_fraction + holdout_fraction must be < 1 to leave a train split")
        if self.synthetic_branching >= self.synthetic_words:  # each bound alone is the settings' range
            raise UsageError(f"synthetic_branching must be below synthetic_words, got {self.synthetic_branching} "
                             f"and {self.synthetic_words}")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
