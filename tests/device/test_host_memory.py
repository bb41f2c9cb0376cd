"""A CPU run's C allocator keeps the memory a freed tensor held (muonlab.host_memory): a large block allocated
again costs no page faults, where glibc's defaults map and fault it in anew each time; a user's own glibc
tunables are left alone. Measured by the kernel's count of this process's page faults, in a fresh interpreter
(the setting lasts a process's life)."""

import json
import os
import subprocess
import sys

import pytest

from muonlab import host_memory
from muonlab.cli import main
from muonlab.train import run as run_module

pytestmark = pytest.mark.skipif(not host_memory.is_glibc(), reason="glibc's malloc only")

BLOCK = 64 << 20  # over glibc's largest mmap threshold (32 MB)
PAGES = BLOCK // 4096

# allocate, touch and free a 64 MB block twice; print the page faults of the second time
_PROBE = f"""
import ctypes, json, resource, sys
from muonlab import host_memory
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
retained = host_memory.retain_freed_host_memory() if sys.argv[1] == "retain" else None

def faults_of_one_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc({BLOCK})
    ctypes.memset(block, 1, {BLOCK})
    libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults_of_one_block()
print(json.dumps({{"retained": retained, "faults": faults_of_one_block()}}))
"""


def _probe(mode: str, **env) -> dict:
    child_env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], env={**child_env, **env}, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def test_a_freed_block_is_reused_without_faulting_its_pages_in_again():
    default, retained = _probe("default"), _probe("retain")
    assert default["faults"] > PAGES // 2, default  # glibc's default: a fresh mapping, every page faulted in
    assert retained["retained"] is True and retained["faults"] < PAGES // 20, retained


def test_the_users_own_glibc_tunables_are_left_alone():
    probed = _probe("retain", MALLOC_ARENA_MAX="2")
    assert probed["retained"] is False and probed["faults"] > PAGES // 2, probed


def test_a_cpu_run_retains_freed_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(run_module, "retain_freed_host_memory", lambda: calls.append("retain"))
    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "1", "--json"]) == 0
    assert calls == ["retain"]
