"""Hashed n-gram Over-Encoding (seed 002 §Family A), re-exported from its variant module
muonlab.model.variants.over_encoding."""

from muonlab.model.variants.over_encoding import DEFAULT_M, OverEncoding

__all__ = ["DEFAULT_M", "OverEncoding"]
