"""Causal sliding-window attention with three backends.

`fa3`: FlashAttention-3 loaded through the `kernels` package on CUDA, as upstream
(varunneal's Hopper build on sm_90, kernels-community elsewhere). `flex`: PyTorch's
FlexAttention with a sliding-window block mask (muonlab.model.sliding_window), fused under
torch.compile, CUDA only. `sdpa`: PyTorch's scaled_dot_product_attention with an explicit
causal window mask, the CPU/MPS path and the reference the others are tested against. All see
the same keys: query i attends to keys j with i - left <= j <= i, where `left` is the layer's
window. A layer whose window covers the whole prefix runs SDPA with is_causal under `flex` and
`sdpa` (its flash kernel on CUDA).

Choosing: `sdpa` always uses SDPA; `flex` uses FlexAttention (CUDA); `auto` uses FA3 when it
loads, otherwise FlexAttention on CUDA (with a warning that says why FA3 did not load) and SDPA
elsewhere; `fa3` uses FA3 or fails the run (a MuonlabError) instead of quietly training on
another kernel. The kernel is loaded once, when the model's backend is resolved
(GPT.resolve_attention_backend), and forward calls the resolved function directly, so
torch.compile traces it as the custom op it is, without a graph break per layer.

Where the kernel comes from:
- the Hugging Face Hub, pinned to major version FA3_KERNEL_VERSION (kernels >= 0.15 refuses
  an unpinned `get_kernel(repo)`), or to one commit with MUONLAB_FA3_REVISION. The repository
  is FA3_REPO_HOPPER on sm_90, FA3_REPO_OTHER elsewhere.
- offline, a pre-seeded Hub cache and HF_HUB_OFFLINE=1: `kernels` then resolves the pin from
  the cache alone, through its refs/v<N> entry, which only a download of the branch by name
  writes (`hf download REPO --repo-type kernel --revision v1`; README "Attention on CUDA").
- offline, a local kernel directory: MUONLAB_FA3_PATH=/path/to/kernel (a kernel repository
  with build/<variant>/, or one variant directory), loaded with kernels.get_local_kernel.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from muonlab.errors import MuonlabError, UsageError
from muonlab.model.sliding_window import flex_window_attention
from muonlab.optional import MissingPackage, require

log = logging.getLogger(__name__)

BACKENDS = ("auto", "fa3", "flex", "sdpa")

FA3_REPO_HOPPER = "varunneal/flash-attention-3"  # upstream train.py's choice on sm_90
FA3_REPO_OTHER = "kernels-community/flash-attn3"  # upstream's choice on other CUDA GPUs
# The Hub pin for both repositories: the kernel's major version (its `v1` branch). Upstream
# train.py (228791f) calls get_kernel(repo) unpinned, which kernels 0.17.2 rejects with a
# ValueError before any download. version=1 is what the kernels docs pass for
# kernels-community/flash-attn3 (huggingface.co/docs/kernels: "Migrate from older versions",
# 0.12, and the check_arch example) and what its Hub card shows; for varunneal's repository no
# card says so, it is what other kernels >= 0.15 users pass. A repository without that build
# fails to load: `auto` then says so and uses SDPA.
FA3_KERNEL_VERSION = 1
FA3_PATH_ENV = "MUONLAB_FA3_PATH"  # a local kernel directory, for machines without the Hub
FA3_REVISION_ENV = "MUONLAB_FA3_REVISION"  # one Hub commit (or tag) instead of the version branch

# FA3 computes in half precision only; fp32 inputs go to it in bf16 (the autocast dtype)
_FA3_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class AttentionBackend:
    """The resolved backend: its name and, for fa3, the kernel's flash_attn_func."""

    name: str  # "fa3" | "flex" | "sdpa"
    flash_attn_func: Callable[..., torch.Tensor] | None = None


def fa3_repo(capability: tuple[int, int]) -> str:
    return FA3_REPO_HOPPER if capability == (9, 0) else FA3_REPO_OTHER


def fa3_source(capability: tuple[int, int]) -> str:
    """Where FA3 is loaded from on a GPU of `capability`, as the environment has it now."""
    local, revision = os.environ.get(FA3_PATH_ENV), os.environ.get(FA3_REVISION_ENV)
    if local:
        return f"{FA3_PATH_ENV}={local}"
    pin = f"revision {revision}" if revision else f"version {FA3_KERNEL_VERSION}"
    return f"{fa3_repo(capability)} (Hub, {pin})"


@functools.lru_cache(maxsize=None)
def _load_fa3(capability: tuple[int, int], local_path: str | None, revision: str | None = None) -> Any:
    """The FA3 kernel module (from `local_path`, else the Hub build at `revision` or the pinned
    version); raises when it cannot be loaded. Cached: every model built in a process shares one load."""
    kernels = require("kernels", "FlashAttention-3 (attention backend 'fa3')")  # only where a CUDA run needs it

    if local_path:
        return kernels.get_local_kernel(Path(local_path))
    repo = fa3_repo(capability)
    pin = {"revision": revision} if revision else {"version": FA3_KERNEL_VERSION}
    # varunneal is not a Hub "trusted kernel publisher": allow exactly this pinned repository
    return kernels.get_kernel(repo, **pin, trust_remote_code=[repo])


def _cuda_capability(device: torch.device) -> tuple[int, int] | None:
    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None


def _one_line(exc: BaseException) -> str:
    """`Class: message` on one line (kernels' messages list build variants over many lines)."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= 400 else text[:397] + "..."
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def check_backend_runs_on(requested: str, device: torch.device) -> None:
    """Refuse a backend that cannot run on `device` (fa3 and flex need CUDA): the run checks it before its
    directory is made, so a refused run leaves nothing behind."""
    if requested in ("fa3", "flex") and _cuda_capability(device) is None:
        why = " (PyTorch's FlexAttention has no backward there)" if requested == "flex" else ""
        raise UsageError(f"attention backend {requested!r} needs a CUDA device, not {device.type}{why}; "
                         "use --attn-backend auto or sdpa")


def resolve_backend(requested: str, device: torch.device) -> AttentionBackend:
    """Pick the attention backend actually used on `device`, loading FA3 if it is chosen."""
    if requested not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {requested!r}")
    if requested == "sdpa":
        return AttentionBackend("sdpa")
    check_backend_runs_on(requested, device)
    capability = _cuda_capability(device)
    if capability is None:
        return AttentionBackend("sdpa")
    if requested == "flex":
        return AttentionBackend("flex")
    try:
        module = _load_fa3(capability, os.environ.get(FA3_PATH_ENV) or None,
                           os.environ.get(FA3_REVISION_ENV) or None)
        func = getattr(module, "flash_attn_interface", module).flash_attn_func
    except Exception as exc:  # offline, unsupported GPU or torch, missing build, no `kernels`
        why = _one_line(exc)
        if requested == "fa3":
            if isinstance(exc, MissingPackage):  # a usage error: it names the install command
                raise
            raise MuonlabError(f"attention backend 'fa3' could not be loaded ({why}); use --attn-backend "
                               f"auto or sdpa, or load it offline ({FA3_PATH_ENV}, HF_HUB_OFFLINE)") from exc
        log.warning("FlashAttention-3 unavailable (%s); using FlexAttention", why)
        return AttentionBackend("flex")
    return AttentionBackend("fa3", func)


def window_mask(seq_len: int, left: int, device: torch.device) -> torch.Tensor:
    """Boolean [T, T] mask, True where query i may attend key j (i - left <= j <= i)."""
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    return (j <= i) & (j >= i - left)


_cached_window_mask = functools.lru_cache(maxsize=32)(window_mask)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: tuple[int, int],
                     backend: str = "sdpa", flash_attn_func: Callable[..., torch.Tensor] | None = None
                     ) -> torch.Tensor:
    """q [B, T, H, D], k/v [B, T, Hkv, D] -> [B, T, H, D]; window = (left, right=0).

    backend "fa3" calls `flash_attn_func` (AttentionBackend.flash_attn_func, resolved once);
    "flex" and "sdpa" differ on windowed layers only."""
    if backend == "fa3":
        # FA3 takes fp16/bf16 only: under --precision fp32 it sees bf16 (the output returns in
        # the input dtype, so the rest of the model stays fp32)
        half = q.dtype if q.dtype in _FA3_DTYPES else torch.bfloat16
        y = flash_attn_func(q.to(half), k.to(half), v.to(half), causal=True, window_size=window)
        return y.to(q.dtype)
    T = q.size(1)
    left = window[0]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = k.size(2) != q.size(2)
    if left < 0 or left >= T - 1:
        # the window covers the whole causal prefix: plain causal attention
        y = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
    elif backend == "flex":
        y = flex_window_attention(qt, kt, vt, left)
    else:
        # eager runs reuse one mask per shape; a compiled graph builds its own (dynamo would
        # trace through the cache wrapper and warn)
        mask = (window_mask if torch.compiler.is_compiling() else _cached_window_mask)(T, left, q.device)
        y = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=gqa)
    return y.transpose(1, 2)
