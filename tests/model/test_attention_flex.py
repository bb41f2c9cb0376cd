"""FlexAttention's sliding window (the CUDA path when FA3 does not load), on CPU: its block mask
against PyTorch's own create_block_mask, its output against an independent transcription at
several windows, T not a multiple of the block, and GQA, the model wired to it, traced into one
graph, and the backend's choice.

PyTorch's CPU FlexAttention has no backward: the gradients are checked on a GPU by
benchmarks/gpu_acceptance.sh (against an fp32 reference, forward and backward).
"""

import warnings

import pytest
import torch
from support.attention import naive_attention
from support.models import small
from torch._dynamo.testing import CompileCounter
from torch.nn.attention.flex_attention import create_block_mask

from muonlab.cli import main
from muonlab.errors import MuonlabError
from muonlab.model import GPT, attention
from muonlab.model.attention import causal_attention
from muonlab.model.sliding_window import BLOCK_SIZE, window_block_mask

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _quiet():
    # eager FlexAttention warns that it is not the fused kernel (CPU tests want its numbers only)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


def _torch_block_mask(seq_len, left, block):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= q_idx - left)

    return create_block_mask(mask_mod, None, None, seq_len, seq_len, device=CPU, BLOCK_SIZE=block)


def _selected(counts, indices):
    """Per query block, the set of key blocks the mask lists."""
    return [sorted(row[:n].tolist()) for row, n in zip(indices[0, 0], counts[0, 0].tolist())]


@pytest.mark.parametrize("seq_len", [129, 256, 300, 1000])
@pytest.mark.parametrize("block", [BLOCK_SIZE, 32])
def test_block_mask_is_the_one_pytorch_builds(seq_len, block):
    for left in sorted({0, 1, 31, 32, 33, 77, block - 1, block, block + 1, seq_len // 2, seq_len - 2}):
        ours, theirs = window_block_mask(seq_len, left, CPU, block), _torch_block_mask(seq_len, left, block)
        where = f"T={seq_len} left={left} block={block}"
        assert torch.equal(ours.to_dense(), theirs.to_dense()), where
        # which blocks are masked element-wise and which are computed whole, in the same order
        assert _selected(ours.kv_num_blocks, ours.kv_indices) == _selected(theirs.kv_num_blocks, theirs.kv_indices), where
        assert (_selected(ours.full_kv_num_blocks, ours.full_kv_indices)
                == _selected(theirs.full_kv_num_blocks, theirs.full_kv_indices)), where
        assert ours.seq_lengths == (seq_len, seq_len)


def test_block_mask_never_holds_a_token_grid():
    mask = window_block_mask(4096, 1024, CPU)
    tensors = [mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices]
    assert max(t.numel() for t in tensors) == (4096 // BLOCK_SIZE) ** 2  # blocks, not T x T


@pytest.mark.parametrize("seq_len, left, kv_heads", [(300, 0, 4), (300, 5, 2), (300, 130, 1), (300, 250, 4),
                                                     (200, 127, 2), (256, 128, 4), (150, 149, 2)])
def test_flex_window_matches_the_naive_transcription(seq_len, left, kv_heads):
    torch.manual_seed(0)
    q = torch.randn(2, seq_len, 4, 16)
    k, v = torch.randn(2, seq_len, kv_heads, 16), torch.randn(2, seq_len, kv_heads, 16)
    got = causal_attention(q, k, v, (left, 0), "flex")
    want = naive_attention(q.double(), k.double(), v.double(), left).float()
    # fp32 softmax attention over <= 300 keys: the kernels' own rounding, ~1e-6
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, causal_attention(q, k, v, (left, 0), "sdpa"), rtol=1e-5, atol=1e-5)


def test_flex_under_autocast_takes_one_dtype():
    """Under bf16 autocast the projections hand over bf16 and the QK-norm fp32: FlexAttention
    gets them all in the autocast dtype, as SDPA would."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 200, 2, 16), torch.randn(1, 200, 2, 16)
    v = torch.randn(1, 200, 2, 16).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = causal_attention(q, k, v, (60, 0), "flex")
    assert got.dtype == torch.bfloat16
    want = naive_attention(q.bfloat16().double(), k.bfloat16().double(), v.double(), 60)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


def _model(backend: str) -> GPT:
    torch.manual_seed(0)
    model = GPT(small(sequence_len=300, vocab_size=64, attn_backend="sdpa"))
    model.init_weights()
    model.float()
    with torch.no_grad():  # live branches: init zeroes every c_proj
        for block in model.transformer.h:
            block.attn.c_proj.weight.normal_(0, 0.05)
    for block in model.transformer.h:
        block.attn.backend = backend
    return model


@torch.no_grad()
def test_the_model_on_flex_gives_the_sdpa_logits():
    idx = torch.randint(0, 64, (2, 300), generator=torch.Generator().manual_seed(1))
    windows = {w for w, _ in _model("sdpa").window_sizes}
    assert 150 in windows and 300 in windows  # half-context S layers and a full L layer
    torch.testing.assert_close(_model("flex")(idx), _model("sdpa")(idx), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_flex_traces_into_one_graph():
    """Under torch.compile the block mask is built inside the graph: no graph break per layer."""
    torch._dynamo.reset()
    counter = CompileCounter()
    q = torch.randn(1, 300, 4, 16)
    k, v = torch.randn(1, 300, 2, 16), torch.randn(1, 300, 2, 16)
    compiled = torch.compile(lambda q, k, v: causal_attention(q, k, v, (77, 0), "flex"), backend=counter,
                             fullgraph=True)
    got = compiled(q, k, v)
    assert counter.frame_count == 1
    torch.testing.assert_close(got, causal_attention(q, k, v, (77, 0), "sdpa"), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_flex_is_refused_off_cuda_in_one_line(capsys):
    with pytest.raises(MuonlabError, match="needs a CUDA device"):
        attention.resolve_backend("flex", CPU)
    assert main(["train", "--preset", "cpu-tiny", "--attn-backend", "flex"]) == 2  # a usage error, before any file
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: attention backend 'flex' needs a CUDA device") and "\n" not in err


def test_flex_is_chosen_on_cuda_without_loading_fa3(monkeypatch):
    monkeypatch.setattr(attention, "_cuda_capability", lambda device: (9, 0))

    def loader(*args):
        raise AssertionError("flex asked for FA3")

    monkeypatch.setattr(attention, "_load_fa3", loader)
    assert attention.resolve_backend("flex", CPU) == attention.AttentionBackend("flex")
