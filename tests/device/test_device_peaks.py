"""The peak bf16 FLOP/s behind MFU, for every GPU name the table knows (and names it must not
confuse): dense tensor-core peaks from NVIDIA's datasheets, one GPU each."""

import pytest
import torch

from muonlab.device import peak_flops, peak_flops_of

# (the name torch.cuda.get_device_name reports, dense bf16 FLOP/s written out from the datasheet)
KNOWN = [
    ("NVIDIA H100 80GB HBM3", 989.5e12),  # SXM5: 1,979 TF with sparsity
    ("NVIDIA H100 PCIe", 756.5e12),  # 1,513 with sparsity
    ("NVIDIA H100 NVL", 835.5e12),  # 1,671 with sparsity, per GPU
    ("NVIDIA H200", 989.5e12),  # SXM
    ("NVIDIA H200 NVL", 835.5e12),
    ("NVIDIA GH200 480GB", 989.5e12),
    ("NVIDIA B200", 2250e12),
    ("NVIDIA GB200", 2500e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA A100-PCIE-40GB", 312e12),
    ("NVIDIA A10G", 70e12),
    ("NVIDIA A10", 125e12),
    ("NVIDIA L40S", 362.05e12),
    ("NVIDIA L40", 181.05e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA GeForce RTX 4090", 165.2e12),
    ("NVIDIA GeForce RTX 3090", 71e12),
]
UNKNOWN = ["NVIDIA H800", "Tesla T4", "NVIDIA GeForce RTX 4080", "NVIDIA A40",
           "NVIDIA H100 80GB HBM3 MIG 1g.10gb"]  # a MIG slice has a fraction of the GPU's units


@pytest.mark.parametrize(("name", "peak"), KNOWN)
def test_each_known_gpu_gets_its_own_variant_peak(name, peak):
    assert peak_flops_of(name) == pytest.approx(peak, rel=1e-12)


@pytest.mark.parametrize("name", UNKNOWN)
def test_unknown_gpus_and_mig_slices_report_no_peak(name):
    assert peak_flops_of(name) is None


def test_peak_flops_reads_the_cuda_device_name(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: asked.append(device) or "NVIDIA L40")
    assert peak_flops(torch.device("cuda", 1)) == pytest.approx(181.05e12)
    assert asked == [torch.device("cuda", 1)]
    assert peak_flops(torch.device("cpu")) is None and peak_flops(torch.device("mps")) is None
