"""Evaluation: bits per byte, cross-entropy and perplexity on val and holdout; seed 004's
loss-based metrics (loss, perplexity, bits per dimension, completion loss)."""

from muonlab.eval.bpb import EvalResult, evaluate_bpb
from muonlab.eval.loss import LossResult, evaluate_loss, image_metrics

__all__ = ["EvalResult", "LossResult", "evaluate_bpb", "evaluate_loss", "image_metrics"]
