"""Bits per byte against a hand computation: known logits, known byte counts, special tokens out."""

import math

import pytest
import torch

from muonlab.eval.bpb import evaluate_bpb


class FixedLogits(torch.nn.Module):
    """A 'model' whose logits are a fixed table indexed by the input token."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table

    def forward(self, x, y, reduction="mean"):
        logits = self.table[x]  # [B, T, V]
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction=reduction)


def _hand_bpb(table, batches, token_bytes):
    """Sum -log softmax(table[x])[y] over non-special targets, written out without torch's loss."""
    nats, nbytes, tokens = 0.0, 0, 0
    for x, y in batches:
        for xi, yi in zip(x.flatten().tolist(), y.flatten().tolist()):
            row = table[xi].double().tolist()
            log_z = math.log(sum(math.exp(v) for v in row))
            if token_bytes[yi] == 0:
                continue  # BOS / special: no bytes, not scored
            nats += log_z - row[yi]
            nbytes += int(token_bytes[yi])
            tokens += 1
    return nats, nbytes, tokens


def test_bpb_matches_a_hand_computation():
    V = 5
    table = torch.tensor([[2.0, 0.0, -1.0, 0.5, 1.0],
                          [0.0, 3.0, 0.0, -2.0, 0.0],
                          [1.0, 1.0, 1.0, 1.0, 1.0],
                          [-1.0, 0.0, 2.0, 0.0, 0.0],
                          [0.0, 0.0, 0.0, 0.0, 4.0]])
    token_bytes = torch.tensor([0, 1, 3, 2, 5])  # token 0 is BOS: zero bytes
    x1, y1 = torch.tensor([[0, 1, 2], [3, 4, 0]]), torch.tensor([[1, 2, 3], [4, 0, 2]])
    x2, y2 = torch.tensor([[2, 2, 1]]), torch.tensor([[0, 4, 3]])
    batches = [(x1, y1), (x2, y2)]
    result = evaluate_bpb(FixedLogits(table), batches, token_bytes)
    nats, nbytes, tokens = _hand_bpb(table, batches, token_bytes)
    # by hand: the byte count of the scored targets 1,2,3,4,2 | 4,3 (two BOS targets left out)
    assert nbytes == 1 + 3 + 2 + 5 + 3 + 5 + 2 and tokens == 7
    assert result.bytes == nbytes and result.tokens == tokens
    assert result.nats == pytest.approx(nats, rel=1e-6)
    assert result.bpb == pytest.approx(nats / (math.log(2) * nbytes), rel=1e-6)
    assert result.ce == pytest.approx(nats / tokens, rel=1e-6)
    assert result.ppl == pytest.approx(math.exp(nats / tokens), rel=1e-6)
    assert V == table.shape[1]


def test_uniform_model_scores_log2_vocab_per_token():
    """Uniform logits: every token costs log2(V) bits, so BPB = log2(V) * tokens / bytes exactly."""
    V = 16
    model = FixedLogits(torch.zeros(V, V))
    token_bytes = torch.full((V,), 2)
    token_bytes[0] = 0
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (3, 11), generator=gen)
    y = torch.randint(1, V, (3, 11), generator=gen)  # no BOS targets
    result = evaluate_bpb(model, [(x, y)], token_bytes)
    assert result.bpb == pytest.approx(math.log2(V) * 33 / 66, rel=1e-6)


def test_special_targets_do_not_count_even_with_a_huge_loss():
    """A BOS target the model puts no mass on (infinite loss) must not move BPB: it is masked
    out, not multiplied by zero (inf * 0 is NaN)."""
    table = torch.zeros(3, 3)
    table[:, 0] = -float("inf")
    token_bytes = torch.tensor([0, 1, 1])
    x, y = torch.tensor([[1, 2, 1, 2]]), torch.tensor([[2, 0, 1, 0]])
    result = evaluate_bpb(FixedLogits(table), [(x, y)], token_bytes)
    only_real = evaluate_bpb(FixedLogits(table), [(x[:, [0, 2]], y[:, [0, 2]])], token_bytes)
    assert result.bpb == pytest.approx(only_real.bpb, rel=1e-9) and result.tokens == 2


def test_no_bytes_is_an_error():
    model = FixedLogits(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="no bytes"):
        evaluate_bpb(model, [(torch.tensor([[1]]), torch.tensor([[0]]))], torch.tensor([0, 1]))
