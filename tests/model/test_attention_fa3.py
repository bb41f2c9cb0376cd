"""FlashAttention-3 on CPU, through a stub kernel: loading (pinned Hub version, local directory),
explicit vs auto failure, the fp32 -> bf16 hand-off, one compiled graph, the run record.

The stub stands in for the kernel module `kernels` returns: its flash_attn_func calls a
torch.library custom op (as the real kernel does) that computes causal sliding-window attention
with SDPA, with a fake implementation for tracing and an autograd formula.
"""

import functools
import inspect
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

kernels = pytest.importorskip("kernels", reason="the FA3 loading tests need kernels (pip install 'muonlab[fa3]')")

import torch
import torch.nn.functional as F
from support.models import small
from torch._dynamo.testing import CompileCounter

from muonlab.cli import main
from muonlab.diagnostics.runs import load_run
from muonlab.errors import MuonlabError, UsageError
from muonlab.model import GPT
from muonlab.model import attention
from muonlab.record.ledger import read_records

SEEN_DTYPES: list[torch.dtype] = []  # the q dtype of every stub call, in order


def _reference(q, k, v, left: int):
    """Causal attention over keys i - left <= j <= i; [B, T, H, D] in and out."""
    T = q.size(1)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    mask = (j <= i) & ((j >= i - left) if left >= 0 else True)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                       enable_gqa=k.size(2) != q.size(2))
    return y.transpose(1, 2).contiguous()


@torch.library.custom_op("muonlab_test::fa3_stub", mutates_args=())
def _fa3_stub(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, left: int) -> torch.Tensor:
    SEEN_DTYPES.append(q.dtype)
    return _reference(q, k, v, left)


@_fa3_stub.register_fake
def _(q, k, v, left):
    return torch.empty_like(q)


@torch.library.custom_op("muonlab_test::fa3_stub_backward", mutates_args=())
def _fa3_stub_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, left: int,
                       grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax attention's gradients written out (autograd does not run inside an op): with
    P = softmax(S), S = q k^T / sqrt(D): dv = P^T g, dS = P * (g v^T - rowsum(P * g v^T))."""
    assert k.size(2) == q.size(2), "the stub has no GQA backward"
    qt, kt, vt, gt = (t.transpose(1, 2).float() for t in (q, k, v, grad))
    T, scale = q.size(1), q.size(-1) ** -0.5
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    mask = (j <= i) & ((j >= i - left) if left >= 0 else True)
    p = torch.softmax((qt @ kt.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")), dim=-1)
    dp = gt @ vt.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    grads = (ds @ kt * scale, ds.transpose(-1, -2) @ qt * scale, p.transpose(-1, -2) @ gt)
    return tuple(g.transpose(1, 2).to(t.dtype).contiguous() for g, t in zip(grads, (q, k, v)))


@_fa3_stub_backward.register_fake
def _(q, k, v, left, grad):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, ctx.left = inputs
    ctx.save_for_backward(q, k, v)


def _backward(ctx, grad):
    return (*_fa3_stub_backward(*ctx.saved_tensors, ctx.left, grad), None)


_fa3_stub.register_autograd(_backward, setup_context=_setup_context)


def stub_flash_attn_func(q, k, v, causal=False, window_size=(-1, -1)):
    """The kernel's call shape: flash_attn_func(q, k, v, causal=True, window_size=(left, right))."""
    assert causal and window_size[1] == 0
    return torch.ops.muonlab_test.fa3_stub(q, k, v, window_size[0])


REAL_LOADER = attention._load_fa3
REAL_GET_KERNEL = kernels.get_kernel
STUB_KERNEL = SimpleNamespace(flash_attn_interface=SimpleNamespace(flash_attn_func=stub_flash_attn_func))


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    REAL_LOADER.cache_clear()
    torch._dynamo.reset()
    SEEN_DTYPES.clear()
    monkeypatch.delenv(attention.FA3_PATH_ENV, raising=False)
    monkeypatch.delenv(attention.FA3_REVISION_ENV, raising=False)
    yield
    REAL_LOADER.cache_clear()
    torch._dynamo.reset()


@pytest.fixture
def on_hopper(monkeypatch):
    """This CPU passes for an sm_90 GPU: the device check returns (9, 0)."""
    monkeypatch.setattr(attention, "_cuda_capability", lambda device: (9, 0))


@pytest.fixture
def stub_kernel(monkeypatch, on_hopper):
    """The loader returns the stub kernel, cached as the real one is, and counts its calls. Like
    the real one (Hub and file access), dynamo cannot trace it: it asks for a graph break."""
    calls = []

    @functools.lru_cache(maxsize=None)
    def load(capability, path, revision=None):
        torch._dynamo.graph_break()
        calls.append(capability)
        return STUB_KERNEL

    monkeypatch.setattr(attention, "_load_fa3", load)
    return calls


def _fa3_model(**kw) -> GPT:
    torch.manual_seed(0)
    model = GPT(small(attn_backend="fa3", **kw))
    model.init_weights()
    model.float()
    assert model.resolve_attention_backend() == "fa3"
    return model


def test_fa3_model_compiles_to_one_graph(stub_kernel):
    model = _fa3_model()
    assert stub_kernel == [(9, 0)]  # loaded once, when the backend was resolved
    idx = torch.randint(0, 64, (2, 32))
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)  # fullgraph: a graph break raises
    logits = compiled(idx)
    assert counter.frame_count == 1
    assert len(SEEN_DTYPES) == model.config.n_layer  # every layer ran the kernel, none fell back to SDPA
    torch.testing.assert_close(logits, model(idx))
    assert stub_kernel == [(9, 0)]  # forward, compiled or not, never asks the loader


def test_fp32_reaches_fa3_as_bf16_and_returns_fp32():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 16, 4, 8, requires_grad=True) for _ in range(3))
    y = attention.causal_attention(q, k, v, (5, 0), "fa3", stub_flash_attn_func)
    assert SEEN_DTYPES == [torch.bfloat16] and y.dtype == torch.float32
    torch.testing.assert_close(y, _reference(q, k, v, 5), atol=3e-2, rtol=3e-2)  # bf16 rounding
    y.square().sum().backward()
    assert q.grad.dtype == torch.float32 and k.grad.dtype == torch.float32
    ref = [t.detach().requires_grad_() for t in (q, k, v)]
    _reference(*ref, 5).square().sum().backward()
    for got, want in zip((q, k, v), ref):
        torch.testing.assert_close(got.grad, want.grad, atol=5e-2, rtol=5e-2)
    # bf16 (autocast) inputs go through as they are
    SEEN_DTYPES.clear()
    y16 = attention.causal_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), (5, 0), "fa3", stub_flash_attn_func)
    assert SEEN_DTYPES == [torch.bfloat16] and y16.dtype == torch.bfloat16


def test_fp32_model_on_fa3_keeps_fp32_logits(stub_kernel):
    model = _fa3_model()
    logits = model(torch.randint(0, 64, (2, 32)))
    assert logits.dtype == torch.float32 and set(SEEN_DTYPES) == {torch.bfloat16}


def _broken_loader(capability, path, revision=None):
    raise FileNotFoundError("Cannot find a build variant for this system in x/y:\n\ntorch212-cu130: no match")


def test_explicit_fa3_that_cannot_load_is_a_runtime_error(monkeypatch, on_hopper):
    monkeypatch.setattr(attention, "_load_fa3", _broken_loader)
    with pytest.raises(MuonlabError) as info:
        attention.resolve_backend("fa3", torch.device("cpu"))
    assert not isinstance(info.value, UsageError) and info.value.exit_code == 1
    message = str(info.value)
    assert "\n" not in message and "Cannot find a build variant" in message and "torch212-cu130" in message


def test_explicit_fa3_off_cuda_fails_the_cli_in_one_line(capsys):
    assert main(["train", "--preset", "cpu-tiny", "--attn-backend", "fa3"]) == 2  # a usage error, before any file
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: attention backend 'fa3' needs a CUDA device") and "\n" not in err


def test_auto_falls_back_to_flex_attention_naming_the_reason(monkeypatch, on_hopper, caplog):
    monkeypatch.setattr(attention, "_load_fa3", _broken_loader)
    with caplog.at_level(logging.WARNING, logger=attention.__name__):
        backend = attention.resolve_backend("auto", torch.device("cpu"))
    assert backend == attention.AttentionBackend("flex")
    (record,) = caplog.records
    assert "\n" not in record.getMessage()
    assert "FileNotFoundError: Cannot find a build variant" in record.getMessage()
    assert record.getMessage().endswith("using FlexAttention")


@pytest.fixture
def hub_calls(monkeypatch):
    """kernels.get_kernel answers with the stub kernel and records its (repo_id, kwargs)."""
    calls = []

    def get_kernel(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return STUB_KERNEL

    monkeypatch.setattr(kernels, "get_kernel", get_kernel)
    return calls


def _installed_kernels_takes(repo_id: str, kwargs: dict) -> None:
    inspect.signature(REAL_GET_KERNEL).bind(repo_id, **kwargs)  # the installed kernels takes these arguments
    # and its pin check (which rejects a bare get_kernel(repo)) passes
    kernels._versions.revision_or_version(revision=kwargs.get("revision"), version=kwargs.get("version"))


@pytest.mark.parametrize("capability, repo", [((9, 0), attention.FA3_REPO_HOPPER),
                                              ((8, 0), attention.FA3_REPO_OTHER)])
def test_hub_load_is_pinned(monkeypatch, hub_calls, capability, repo):
    monkeypatch.setattr(attention, "_cuda_capability", lambda device: capability)
    backend = attention.resolve_backend("fa3", torch.device("cpu"))
    assert backend.name == "fa3" and backend.flash_attn_func is stub_flash_attn_func
    ((repo_id, kwargs),) = hub_calls
    assert repo_id == repo and kwargs["version"] == attention.FA3_KERNEL_VERSION == 1
    assert kwargs["trust_remote_code"] == [repo]  # varunneal is no Hub "trusted publisher": allow just this repo
    _installed_kernels_takes(repo_id, kwargs)


def test_a_pinned_revision_replaces_the_version_branch(monkeypatch, on_hopper, hub_calls):
    monkeypatch.setenv(attention.FA3_REVISION_ENV, "0123abc")
    assert attention.resolve_backend("fa3", torch.device("cpu")).name == "fa3"
    ((repo_id, kwargs),) = hub_calls
    assert repo_id == attention.FA3_REPO_HOPPER and kwargs["revision"] == "0123abc" and "version" not in kwargs
    assert attention.fa3_source((9, 0)) == f"{attention.FA3_REPO_HOPPER} (Hub, revision 0123abc)"
    _installed_kernels_takes(repo_id, kwargs)


def test_local_kernel_directory_uses_the_local_loader(monkeypatch, on_hopper, tmp_path):
    calls = []

    def get_local_kernel(repo_path, **kwargs):
        calls.append(repo_path)
        return STUB_KERNEL

    def get_kernel(*args, **kwargs):
        raise AssertionError("the Hub was asked although a local kernel directory is set")

    real = kernels.get_local_kernel
    monkeypatch.setattr(kernels, "get_local_kernel", get_local_kernel)
    monkeypatch.setattr(kernels, "get_kernel", get_kernel)
    monkeypatch.setenv(attention.FA3_PATH_ENV, str(tmp_path))
    assert attention.resolve_backend("fa3", torch.device("cpu")).name == "fa3"
    assert calls == [tmp_path]
    inspect.signature(real).bind(calls[0])


def test_run_records_its_attention_backend(tmp_path, capsys):
    assert main(["train", "--preset", "cpu-tiny", "--json", "--num-steps", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["attention_backend"] == "sdpa"
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["attention_backend"] == "sdpa"
    (record,) = read_records(tmp_path / "cache" / "runs" / "ledger.jsonl")
    assert record["status"] == "ok" and record["attention_backend"] == "sdpa"


def test_a_run_trained_on_explicit_fa3_is_read_back_on_sdpa_off_cuda(capsys):
    assert main(["train", "--preset", "cpu-tiny", "--json", "--num-steps", "2"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["run_dir"])
    saved = json.loads((run_dir / "config.json").read_text())
    saved["config"]["model"]["attn_backend"] = "fa3"  # as a CUDA run with --attn-backend fa3 saves it
    (run_dir / "config.json").write_text(json.dumps(saved))
    loaded = load_run(run_dir)  # the diagnostics' CPU replay
    assert loaded.cfg.model.attn_backend == "fa3" and loaded.model.transformer.h[0].attn.backend == "sdpa"
