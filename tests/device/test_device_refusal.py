"""A preset made for a GPU on a machine without one is refused before anything runs; `--device cpu`
insists; the CPU presets run where they are."""

from __future__ import annotations

import pytest
import torch

from muonlab.arms import resolve_config
from muonlab.config import all_presets
from muonlab.errors import UsageError
from muonlab.train.run import cpu_presets, training_device

GPU_HERE = torch.cuda.is_available() or torch.backends.mps.is_available()
GPU_PRESETS = sorted(name for name, values in all_presets().items() if values.get("runtime.device") != "cpu")


def test_the_gpu_presets_are_the_papers_protocols_and_the_cpu_ones_pin_the_cpu():
    assert {"gpu-d8", "gpu-d6", "upstream", "nanogpt-124m", "smollm2-135m"} <= set(GPU_PRESETS)
    assert {"cpu-demo", "cpu-tiny", "tied-cpu", "hf-cpu"} <= set(cpu_presets())
    assert not set(GPU_PRESETS) & set(cpu_presets())


@pytest.mark.skipif(GPU_HERE, reason="a GPU exists here")
@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_every_gpu_preset_is_refused_on_a_machine_without_one_unless_the_cpu_is_asked_for(preset):
    arm = "baseline" if all_presets()[preset].get("family", "autoresearch") == "autoresearch" else "t1_hybrid"
    with pytest.raises(UsageError, match="add --device cpu to run it on the CPU anyway.*cpu-tiny"):
        training_device(resolve_config(arm, preset))
    assert training_device(resolve_config(arm, preset, {"device": "cpu"})) == torch.device("cpu")


@pytest.mark.parametrize("preset", ["cpu-tiny", "tied-cpu"])
def test_a_cpu_preset_trains_on_the_cpu_anywhere(preset):
    arm = "baseline" if preset == "cpu-tiny" else "t1_hybrid"
    assert training_device(resolve_config(arm, preset)) == torch.device("cpu")
