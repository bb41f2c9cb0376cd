"""A CUDA run's allocator: expandable segments as upstream sets them, unless the user set their
own allocator settings; asked for before the run's first CUDA allocation. (The setting itself
is checked on a GPU by benchmarks/gpu_acceptance.sh.)"""

import pytest
import torch

from muonlab import device as device_module
from muonlab.cli import main
from muonlab.train import run as run_module


@pytest.fixture
def settings_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", calls.append)  # torch >= 2.11's own name

    def deprecated(env):  # the old name warns (FutureWarning) on every run; it must not be the one called
        raise AssertionError("the deprecated torch.cuda.memory._set_allocator_settings was called")

    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", deprecated)
    for name in device_module.ALLOC_CONF_ENVS:
        monkeypatch.delenv(name, raising=False)
    return calls


def test_cuda_gets_expandable_segments(settings_calls):
    assert device_module.use_expandable_segments(torch.device("cuda", 0))
    assert settings_calls == ["expandable_segments:True"]


@pytest.mark.parametrize("env", device_module.ALLOC_CONF_ENVS)
def test_the_users_own_allocator_settings_win(settings_calls, monkeypatch, env):
    monkeypatch.setenv(env, "max_split_size_mb:128")
    assert not device_module.use_expandable_segments(torch.device("cuda"))
    assert settings_calls == []


def test_other_devices_are_left_alone(settings_calls):
    assert not device_module.use_expandable_segments(torch.device("cpu"))
    assert settings_calls == []


def test_a_run_asks_before_it_joins_a_group(monkeypatch, capsys):
    order = []
    real_init = run_module.init_from_env
    monkeypatch.setattr(run_module, "use_expandable_segments", lambda device: order.append(("allocator", device.type)))
    monkeypatch.setattr(run_module, "init_from_env", lambda device: (order.append(("init", device.type)),
                                                                     real_init(device))[1])
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "1", "--json"]) == 0
    assert order == [("allocator", "cpu"), ("init", "cpu")]
