"""The baseline GPT and its building blocks."""

from muonlab.model.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
