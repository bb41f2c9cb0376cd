"""Device and precision: detection (CUDA, then MPS, then CPU), autocast, peak FLOPs for MFU."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from muonlab.errors import UsageError

PRECISIONS = ("auto", "bf16", "fp32")

# Dense bf16 tensor-core peaks (FLOP/s) per GPU, for MFU; unknown devices report no MFU. Where a
# datasheet gives only the figure "with sparsity" (2:4), the dense peak is half of it, as NVIDIA's
# footnotes say. Rules are tried in order, most specific first, and match whole words of the name
# torch.cuda.get_device_name reports ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA L40S"),
# so "L40" is not taken for "L4" nor "A100" for "A10". Sources, NVIDIA's datasheets:
#   H100 SXM / PCIe / NVL: 1,979 / 1,513 / 1,671 TF with sparsity (H100 datasheet, per GPU; the
#     SXM figure halved is upstream autoresearch's H100_BF16_PEAK_FLOPS = 989.5e12)
#   H200 SXM / NVL: 1,979 / 1,671 TF with sparsity (H200 datasheet); GH200: 1,979 (GH200 datasheet)
#   B200 (HGX B200) / GB200: 4.5 / 5 PF with sparsity (Blackwell datasheet, per GPU)
#   A100 (SXM and PCIe): 312 TF dense; A10: 125 dense (A10 datasheet)
#   A10G (an AWS-only part, no NVIDIA datasheet): 70 TF dense (Baseten, "NVIDIA A10 vs A10G")
#   L40S: 362.05 dense; L40: 181.05 dense; L4: 242 with sparsity (L40S, L40, L4 datasheets)
#   RTX 4090: 165.2 dense, FP32 accumulate (Ada whitepaper); RTX 3090: 71 dense (Ampere GA102 whitepaper)
_PEAK_BF16_RULES: tuple[tuple[tuple[str, ...], float], ...] = (
    (("H100", "NVL"), 1671e12 / 2),
    (("H100", "PCIE"), 1513e12 / 2),
    (("H100",), 1979e12 / 2),  # SXM5 ("NVIDIA H100 80GB HBM3") and any other H100 name
    (("H200", "NVL"), 1671e12 / 2),
    (("H200",), 1979e12 / 2),  # SXM ("NVIDIA H200")
    (("GH200",), 1979e12 / 2),
    (("GB200",), 5000e12 / 2),
    (("B200",), 4500e12 / 2),
    (("A100",), 312e12),
    (("A10G",), 70e12),
    (("A10",), 125e12),
    (("L40S",), 362.05e12),
    (("L40",), 181.05e12),
    (("L4",), 242e12 / 2),
    (("RTX", "4090"), 165.2e12),
    (("RTX", "3090"), 71e12),
)


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


# the allocator settings a user may give (PyTorch reads the first, and the second as its old name)
ALLOC_CONF_ENVS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def use_expandable_segments(device: torch.device) -> bool:
    """CUDA's caching allocator grows segments in place instead of adding fixed blocks: less
    fragmentation, so a lower peak at the same batch. Upstream sets it (PYTORCH_ALLOC_CONF,
    expandable_segments:True); a user's own allocator settings are left alone. True when set."""
    if device.type != "cuda" or any(os.environ.get(name) for name in ALLOC_CONF_ENVS):
        return False
    # torch >= 2.11 deprecates torch.cuda.memory._set_allocator_settings (a FutureWarning each run) for this,
    # which it calls; the older name where this one is missing
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    setter("expandable_segments:True")
    return True


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


def peak_flops_of(name: str) -> float | None:
    """Peak dense bf16 FLOP/s of the GPU a device name describes, else None. A MIG slice
    (its name ends in e.g. "MIG 1g.10gb") has a fraction of the GPU's units: no peak."""
    words = set(name.upper().replace("-", " ").replace("_", " ").split())
    if "MIG" in words:
        return None
    for required, peak in _PEAK_BF16_RULES:
        if words.issuperset(required):
            return peak
    return None


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of a known GPU, else None (MFU is then not reported)."""
    if device.type != "cuda":
        return None
    return peak_flops_of(torch.cuda.get_device_name(device))


def mfu_percent(flops_per_token: float, tokens: float, seconds: float, peak_per_device: float | None,
                world_size: int) -> float | None:
    """Model FLOPs utilisation in percent: `tokens` (the global batch, every rank's together)
    trained in `seconds`, over the peak of all `world_size` devices that trained them (upstream's
    formula, which has one GPU). None without a peak or a duration."""
    if not peak_per_device or seconds <= 0:
        return None
    return 100 * flops_per_token * tokens / seconds / (peak_per_device * world_size)


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


@contextlib.contextmanager
def one_intra_op_thread():
    """One intra-op thread inside, the previous count restored after: threads buy nothing on small
    matrices, and MKL's LAPACK threads cost ~100x when the CPU is oversubscribed (measured: svdvals
    of 4 x 128 x 128 float64 0.85 s on 2 threads of a loaded 2-core machine, 0.005 s on 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def machine_memory_bytes() -> int | None:
    """This machine's physical memory (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
