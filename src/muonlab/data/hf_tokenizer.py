"""A local Hugging Face `tokenizer.json` (seed 004 tokenized FineWeb with the SmolLM2, Qwen2.5 and
Llama-3.2 tokenizers, and UniRef50 with ProtGPT2's BPE; App. J.2–J.4, J.8). Read from a file the user
has, with the `tokenizers` library (installed with `transformers`, the `hf` extra); nothing is
downloaded. Documents are joined by the tokenizer's end-of-text token when it has one of the
usual names (a choice: the paper's caches do not say how documents were separated), else back
to back; FASTA sequences are joined back to back ("no extra EOS appended", seed 004 App. J.9).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from muonlab.errors import UsageError

SEPARATOR_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")


class HFTokenizer:
    def __init__(self, path: str):
        file = Path(path).expanduser()
        if not file.is_file():
            raise UsageError(f"tokenizer file {file} does not exist")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UsageError("--tokenizer-json needs the tokenizers library: pip install 'muonlab[hf]'") from None
        try:
            self.tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises its own exception types  # noqa: BLE001
            raise UsageError(f"{file} is not a Hugging Face tokenizer.json: {str(exc).splitlines()[0]}") from None
        self.path = file
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        vocab = self.tok.get_vocab(with_added_tokens=True)
        self.separator = next((vocab[n] for n in SEPARATOR_NAMES if n in vocab), None)
        self.fingerprint = hashlib.sha256(file.read_bytes()).hexdigest()[:16]
        self.name = f"tokenizer.json:{self.fingerprint}"

    def encode_docs(self, docs: Iterable[str], separate: bool = True, batch: int = 256) -> Iterator[list[int]]:
        """Token ids per document (the separator after each one when `separate` and known)."""
        pending: list[str] = []

        def flush():
            for enc in self.tok.encode_batch(pending, add_special_tokens=False):
                ids = list(enc.ids)
                if separate and self.separator is not None:
                    ids.append(self.separator)
                yield ids
            pending.clear()

        for doc in docs:
            pending.append(doc)
            if len(pending) == batch:
                yield from flush()
        if pending:
            yield from flush()
