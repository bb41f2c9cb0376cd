"""Device and precision: detection (CUDA, then MPS, then CPU), autocast, peak FLOPs for MFU."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from muonlab.errors import UsageError

PRECISIONS = ("auto", "bf16", "fp32")

# Dense bf16 tensor-core peaks (FLOP/s) used for MFU; unknown devices report no MFU.
_PEAK_BF16_FLOPS = {
    "H100": 989.5e12,
    "H200": 989.5e12,
    "GH200": 989.5e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A10G": 70e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165.2e12,
    "RTX 3090": 71e12,
}


def detect_device(requested: str = "auto") -> torch.device:
    """`auto` picks CUDA, then MPS, then CPU; an explicit device must exist."""
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as exc:
        raise UsageError(f"unknown device {requested!r}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("device 'cuda' requested but CUDA is not available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError("device 'mps' requested but MPS is not available")
    return device


def resolve_precision(requested: str, device: torch.device) -> str:
    """`auto` is bf16 autocast on CUDA (as upstream) and fp32 elsewhere."""
    if requested not in PRECISIONS:
        raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if requested == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return requested


def autocast_context(device: torch.device, precision: str):
    """bf16: autocast as upstream; fp32: no autocast (the model is cast to fp32 instead)."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    import platform

    return platform.processor() or platform.machine() or "cpu"


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of a known GPU, else None (MFU is then not reported)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(_PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in name:
            return _PEAK_BF16_FLOPS[key]
    return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated accelerator memory in MiB; on CPU the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1024 / 1024
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 1024 / 1024
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024 / 1024 if sys.platform == "darwin" else rss / 1024


@dataclass(frozen=True)
class Runtime:
    """Where and how a run computes."""

    device: torch.device
    precision: str

    def autocast(self):
        return autocast_context(self.device, self.precision)


def cpu_has_native_bf16() -> bool:
    """True where the CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX tiles).

    Elsewhere (AVX2) torch's bf16 GEMMs are emulated and run 25-55x slower than fp32."""
    cpu = getattr(torch, "cpu", None)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in probes)
