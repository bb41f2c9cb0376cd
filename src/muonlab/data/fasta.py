"""Protein sequences for seed 004's protein language model (App. J.8).

The paper trains a Llama on UniRef50 2021_04 tokenized with ProtGPT2's BPE, with no extra EOS
appended. Here a FASTA file (or a folder of .fasta/.fa/.faa files, sorted; gzip-compressed
`.fasta.gz` as UniProt publishes UniRef50, too) is streamed record by record, a line at a time
('>' header lines, sequence lines joined, whitespace dropped, letters upper-cased); records
are split into train/val/holdout by the same seedless hash of their ids as the text corpora
(`muonlab.data.sources.split_documents`), and tokenized with a `tokenizer.json` (ProtGPT2's, the
paper's) or, without one, one token per residue: `AMINO_ACIDS` (the 20 standard residues and
B, O, U, X, Z), 25 tokens. `synthetic_fasta` writes a seeded Markov-chain proteome for CPU
presets (stated as what it is: not UniRef50).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from muonlab.errors import CorruptInput, UsageError

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWYBOUXZ"
RESIDUE_IDS = {a: i for i, a in enumerate(AMINO_ACIDS)}
STANDARD = AMINO_ACIDS[:20]
FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas")


def is_fasta(path: Path) -> bool:
    name = path.name.lower()
    return any(name.endswith(s) or name.endswith(s + ".gz") for s in FASTA_SUFFIXES)


def fasta_files(path: str | Path) -> list[Path]:
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UsageError(f"FASTA path {path} does not exist")
    files = sorted(p for p in path.rglob("*") if p.is_file() and is_fasta(p))
    if not files:
        raise UsageError(f"no {'/'.join(FASTA_SUFFIXES)} files (or .gz of them) under {path}")
    return files


def _lines(file: Path) -> Iterator[str]:
    """The file's lines, decompressed on the fly when it is gzip (by its magic bytes): never whole."""
    with open(file, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    lineno = 0
    try:
        with opener(file, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                yield line
    except UnicodeDecodeError:
        raise UsageError(f"{file}:{lineno + 1}: not UTF-8 text; not a FASTA file") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise CorruptInput(f"{file}: a truncated or corrupt gzip file after line {lineno} ({e})") from None


def read_fasta(path: str | Path) -> Iterator[tuple[str, str]]:
    """(record id, sequence) of every record, streamed (memory: one record); UsageError names the
    file and line of a bad one."""
    for file in fasta_files(path):
        header, parts, start = None, [], 0
        for lineno, line in enumerate(_lines(file), 1):
            line = line.strip()
            if not line or line.startswith(";"):
                continue
            if line.startswith(">"):
                if header is not None:
                    yield _record(file, start, header, parts)
                header, parts, start = line[1:].strip(), [], lineno
            elif header is None:
                raise UsageError(f"{file}:{lineno}: sequence before the first '>' header; not a FASTA file")
            else:
                parts.append(line)
        if header is None:
            raise UsageError(f"{file} holds no FASTA record")
        yield _record(file, start, header, parts)


def _record(file: Path, lineno: int, header: str, parts: list[str]) -> tuple[str, str]:
    seq = "".join("".join(parts).split()).upper().rstrip("*")
    if not seq:
        raise UsageError(f"{file}:{lineno}: record {header!r} has an empty sequence")
    bad = sorted(set(seq) - set(AMINO_ACIDS))
    if bad:
        raise UsageError(f"{file}:{lineno}: record {header!r} has letters {''.join(bad)!r} that are no amino acid")
    return f"{file.name}:{header.split()[0] if header else lineno}", seq


def residue_tokens(seq: str) -> list[int]:
    return [RESIDUE_IDS[a] for a in seq]


def synthetic_fasta(path: Path, total_residues: int, seed: int) -> Path:
    """A FASTA file of Markov-chain proteins (20 standard residues, Dirichlet(0.3) transitions,
    lengths 50..400) with about `total_residues` residues: structure to learn, seeded."""
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.full(20, 0.3), size=20)
    cum = np.cumsum(trans, axis=1)
    lines, made, n = [], 0, 0
    while made < total_residues:
        length = int(rng.integers(50, 401))
        state, seq = int(rng.integers(20)), []
        u = rng.random(length)
        for k in range(length):
            seq.append(STANDARD[state])
            state = min(int(np.searchsorted(cum[state], u[k])), 19)
        lines += [f">synthetic_{n} seed={seed}", *("".join(seq)[i:i + 60] for i in range(0, length, 60))]
        made += length
        n += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="ascii")
    tmp.replace(path)
    return path

