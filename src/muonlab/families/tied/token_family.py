"""What seed 004's token-file families share (muonlab.families.{hf,t5,imagegpt}, and the tied GPT
on `--source memmap`): their data as token memmaps per split, a seeded block loader, and the
loss-based evaluation (validation loss and perplexity, seed 004 Table 1).

Data (`token_data(cfg, log)`), by `data.source`:
  memmap              the user's token files as they are (`muonlab.data.token_data.memmap_folder`)
  local + tokenizer   text files tokenized with a local Hugging Face tokenizer.json, split by document
  fasta               protein records, tokenized per residue or with a tokenizer.json
  synthetic_protein   a seeded Markov proteome written as FASTA first (CPU presets)
  other text sources  the text pipeline's documents and BPE, joined into one stream per split
Token files are written once under the cache (`tokens/<hash of what decides them>`).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Callable

import torch

from muonlab.data.config import DataConfig
from muonlab.data.loaders.token_blocks import MemmapBlockLoader
from muonlab.data.memmap_format import TokenMemmap
from muonlab.data.token_data import TokenData, _short_hash, memmap_folder, text_token_data
from muonlab.errors import UsageError
from muonlab.eval.loss import LossResult, evaluate_loss
from muonlab.paths import cache_root
from muonlab.settings import validate_tree

TEXT_TOKEN_SOURCES = ("climbmix", "local", "stdlib", "synthetic", "memmap")
PROTEIN_SOURCES = ("fasta", "synthetic_protein")


def block_batcher(mm: TokenMemmap, B: int, T: int, seed: int, device, rank: int, world_size: int,
                  shuffle: bool = True, drop_last: bool = True, num_blocks: int | None = None):
    """Non-overlapping T + 1 token blocks shuffled per seed (NanoGPT, the Hugging Face LMs)."""
    return MemmapBlockLoader(mm, T, B, seed, drop_last=drop_last, with_target=True, shuffle=shuffle,
                             num_blocks=num_blocks, rank=rank, world_size=world_size, device=device)


def tokens_dir(cfg: DataConfig, identity: dict) -> Path:
    """Where the token files of data described by `identity` are cached."""
    return cache_root(cfg.cache_dir) / "tokens" / _short_hash(identity)


def _hf_text(cfg: DataConfig, log) -> TokenData:
    from muonlab.data.hf_tokenizer import HFTokenizer  # noqa: PLC0415
    from muonlab.data.local_source import LocalSource  # noqa: PLC0415

    source, tok = LocalSource(cfg.path, cfg.local_txt_docs), HFTokenizer(cfg.tokenizer_json)
    return _documents_as_tokens(cfg, {"source": "local", **source.identity()}, source.iter_documents,
                                tok.encode_docs, tok.vocab_size, tok.name, str(source.path), log)


def _protein(cfg: DataConfig, log) -> TokenData:
    from muonlab.data import fasta  # noqa: PLC0415

    if cfg.source == "synthetic_protein":
        path = cache_root(cfg.cache_dir) / "proteins" / f"synthetic-{cfg.synthetic_bytes}-{cfg.synthetic_seed}.fasta"
        if not path.is_file():
            fasta.synthetic_fasta(path, cfg.synthetic_bytes, cfg.synthetic_seed)
        identity = {"source": "synthetic_protein", "residues": cfg.synthetic_bytes, "seed": cfg.synthetic_seed}
    else:
        if not cfg.path:
            raise UsageError("data source 'fasta' needs --path, a FASTA file or a folder of them")
        path = Path(cfg.path).expanduser()
        files = fasta.fasta_files(path)
        identity = {"source": "fasta", "path": str(path.resolve()),
                    "files": [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]}
    if cfg.tokenizer_json:
        from muonlab.data.hf_tokenizer import HFTokenizer  # noqa: PLC0415

        tok = HFTokenizer(cfg.tokenizer_json)
        name, vocab, encode = tok.name, tok.vocab_size, lambda seqs: tok.encode_docs(seqs, separate=False)
    else:
        name, vocab = "residues", len(fasta.AMINO_ACIDS)
        encode = lambda seqs: (fasta.residue_tokens(s) for s in seqs)  # noqa: E731
    return _documents_as_tokens(cfg, identity, lambda: fasta.read_fasta(path), encode, vocab, name,
                                str(path), log)


def _documents_as_tokens(cfg: DataConfig, identity: dict, documents, encode, vocab_size: int,
                                  tokenizer: str, where: str, log) -> TokenData:
    """Documents split by their ids (train / val / holdout), each split's encoded documents one stream,
    written once into the cache by `muonlab.data.ranked_split` from one streamed pass over `documents()`
    (read only when the files do not exist yet): FineWeb shards and UniRef50 never sit in memory."""
    from muonlab.data.ranked_split import write_ranked_splits  # noqa: PLC0415
    from muonlab.data.token_data import write_once  # noqa: PLC0415

    identity = {**identity, "tokenizer": tokenizer, "val_fraction": cfg.val_fraction,
                "holdout_fraction": cfg.holdout_fraction}
    out = tokens_dir(cfg, identity)
    write_once(out, lambda folder: write_ranked_splits(
        folder, documents(), lambda texts: list(encode(texts)), vocab_size, tokenizer, cfg.val_fraction,
        cfg.holdout_fraction, {"identity": identity}, hint=f" ({where})"), log)
    files = {split: TokenMemmap(out / f"{split}.bin") for split in ("train", "val", "holdout")}
    return TokenData(cfg.source, files, tokenizer, identity=identity)


def token_data(cfg, log: Callable[[str], None] = print) -> TokenData:
    """The run's data as token memmaps per split (see the module docstring)."""
    d = cfg.data
    validate_tree(d)  # its ranges, then its own checks
    if d.source == "memmap":
        return memmap_folder(d.path)
    if d.source in PROTEIN_SOURCES:
        return _protein(d, log)
    if d.source == "local" and d.tokenizer_json:
        return _hf_text(d, log)
    from muonlab.data.prepare import prepare_data  # noqa: PLC0415

    return text_token_data(prepare_data(d, log=log), log=log)


def eval_examples(mm: TokenMemmap, tokens: int, targets_per_example: int, available: int) -> int:
    """Examples an evaluation of `tokens` target tokens reads: ceil(tokens / targets), capped at the file."""
    n = min(available, math.ceil(tokens / targets_per_example))
    if n < 1:
        raise UsageError(f"{mm.path} holds no whole example of {targets_per_example} targets to evaluate")
    return n


def evaluate_token_splits(model, data: TokenData, cfg, runtime, ctx, splits=("val", "holdout"), tokens=None,
                          eval_loader=None, completion_from: int | None = None,
                          finish: Callable[[LossResult], LossResult] = lambda r: r) -> dict[str, LossResult]:
    """Validation loss (and perplexity) of each split the data has, over its first `tokens` target
    tokens (default train.eval_tokens), in file order; the batches are shared out over the ranks
    and the sums reduced, so every world size scores the same tokens. `eval_loader(mm, B, T, n)`
    gives the family's in-order batches (default: T + 1 token blocks)."""
    B = cfg.train.eval_batch_size or cfg.train.device_batch_size
    T = cfg.train.sequence_len
    tokens = tokens or cfg.train.eval_tokens
    eval_loader = eval_loader or _block_eval_loader
    model.eval()
    out = {}
    for split in splits:
        if split not in data.files:
            continue
        loader = eval_loader(data.files[split], B, T, tokens, runtime.device)
        batches = (next(loader) for _ in range(loader.batches_per_epoch))  # one pass, in file order
        shard = itertools.islice(batches, ctx.rank, None, ctx.world_size) if ctx.active else batches
        out[split] = finish(evaluate_loss(lambda b: model(b[0], b[1], reduction="none"), shard, runtime.autocast,
                                          runtime.device, reduce=ctx.all_reduce_ if ctx.active else None,
                                          completion_from=completion_from))
    model.train()
    return out


def _block_eval_loader(mm: TokenMemmap, B: int, T: int, tokens: int, device):
    from muonlab.data.memmap_format import count_blocks  # noqa: PLC0415

    n = eval_examples(mm, tokens, T, count_blocks(mm, T, with_target=True))
    return block_batcher(mm, B, T, 0, device, 0, 1, shuffle=False, drop_last=False, num_blocks=n)


def check_vocab(model_vocab: int | None, data: TokenData, what: str) -> None:
    if model_vocab is not None and data.vocab_size > model_vocab:
        raise UsageError(f"{what}: the data's tokens reach id {data.vocab_size - 1}, beyond the model's "
                         f"{model_vocab}-row table")


def describe_counts(model: torch.nn.Module) -> dict[str, int]:
    """The lab's parameter breakdown of a tied model: the table once, matrices, vectors."""
    from muonlab.optim.af_muon import find_tied  # noqa: PLC0415

    unique = {id(p): p for p in model.parameters()}.values()
    try:
        table = find_tied(model)[1].numel()
    except ValueError:  # an untied control: its tables are matrices here
        table = 0
    frozen = sum(p.numel() for p in unique if not p.requires_grad)  # e.g. T5Gemma2's unused vision tower
    vectors = sum(p.numel() for p in unique if p.ndim <= 1 and p.requires_grad)
    total = sum(p.numel() for p in unique)
    counts = {"tied_table": table, "matrices": total - table - vectors - frozen, "vectors": vectors, "total": total}
    return {**counts, "frozen": frozen} if frozen else counts
