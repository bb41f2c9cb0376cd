"""Evaluation: bits per byte, cross-entropy and perplexity on val and holdout."""

from muonlab.eval.bpb import EvalResult, evaluate_bpb

__all__ = ["EvalResult", "evaluate_bpb"]
