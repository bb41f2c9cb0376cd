"""Data layer: corpora (climbmix, local, stdlib, synthetic), BPE tokenizer, best-fit packing."""

from muonlab.data.config import DataConfig
from muonlab.data.packing import BestFitLoader, RowPacker
from muonlab.data.prepare import PreparedData, compress_bits_per_byte, prepare_data
from muonlab.data.store import DocBatch
from muonlab.data.tokenizer import BOS_TOKEN, SPECIAL_TOKENS, SPLIT_PATTERN, Tokenizer

__all__ = [
    "BOS_TOKEN",
    "BestFitLoader",
    "DataConfig",
    "DocBatch",
    "PreparedData",
    "RowPacker",
    "SPECIAL_TOKENS",
    "SPLIT_PATTERN",
    "Tokenizer",
    "compress_bits_per_byte",
    "prepare_data",
]
