"""Data layer: corpora (climbmix, local, stdlib, synthetic), BPE tokenizer, best-fit packing.

The names below are loaded on first use (PEP 562), so that importing one module of the package does not
import the others: a tokenizing worker process (muonlab.data.encoding_processes) then starts without torch.
"""

from importlib import import_module

_HOMES = {
    "BOS_TOKEN": "tokenizer",
    "BestFitLoader": "packing",
    "DataConfig": "config",
    "DocBatch": "store",
    "PreparedData": "prepare",
    "RowPacker": "packing",
    "SPECIAL_TOKENS": "tokenizer",
    "SPLIT_PATTERN": "tokenizer",
    "Tokenizer": "tokenizer",
    "compress_bits_per_byte": "prepare",
    "prepare_data": "prepare",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'muonlab.data' has no attribute {name!r}")
    value = getattr(import_module(f"muonlab.data.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
