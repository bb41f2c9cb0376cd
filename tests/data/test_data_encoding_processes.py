"""Tokenizing in worker processes (muonlab.data.encoding_processes): the same rows as the training
process's own encoding, an exact resume, workers that start without torch, and the setting that picks them.

The rows are compared with the loader that encodes in its own process (`encode_processes=0`), built from
the same trained BPE: a worker that rebuilt another encoding, dropped the BOS or reordered the batches
would pack different rows.
"""

from __future__ import annotations

import multiprocessing
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from muonlab.data.config import DataConfig
from muonlab.data.packing import BestFitLoader, RowPacker
from muonlab.data.prepare import encode_processes_for
from muonlab.data.tokenizer import Tokenizer
from muonlab.errors import UsageError
from muonlab.settings import validate_tree

WORDS = "muon orthogonal momentum newton schulz spectral norm adam weight decay embedding head".split()


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120))) + f" {rng.randint(0, 999)}.\n"
            for _ in range(n)]


BATCHES = [_texts(8, seed) for seed in range(300)]


def _documents(start: int):
    return iter(BATCHES[start:])


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return Tokenizer.train(_texts(200, seed=-1), vocab_size=300)


def _loader(bpe: Tokenizer, processes: int) -> BestFitLoader:
    return BestFitLoader(_documents, bpe, B=4, T=48, buffer_size=24, encode_workers=2, encode_processes=processes)


def _same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]


def test_documents_encoded_in_worker_processes_pack_the_same_rows_and_resume_exactly(bpe):
    own, workers = _loader(bpe, 0), _loader(bpe, 2)
    for _ in range(10):
        assert _same(next(own), next(workers))
    state = workers.state_dict()  # what the workers encoded ahead is dropped; the stream reads on from there
    resumed = _loader(bpe, 3)
    resumed.load_state_dict(state)
    for _ in range(6):
        assert _same(next(own), next(resumed))


def test_a_tokenizing_worker_starts_without_torch():
    """A spawned worker imports the module that holds its function: with torch it would take seconds."""
    code = ("import sys, muonlab.data.encoding_processes; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_snapshot_is_the_state_when_it_was_taken(bpe):
    """The prefetching worker takes a snapshot after every batch and the state dict is made from it later:
    the buffer has changed by then, the snapshot has not."""
    packer = RowPacker(_documents, bpe, T=48, buffer_size=24)
    packer.skip_rows(7)
    snapshot, expected = packer.snapshot(), packer.state_dict()
    packer.skip_rows(9)
    state = snapshot()
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(state[key], value) if isinstance(value, torch.Tensor) else state[key] == value
    assert state["rows_produced"] != packer.rows_produced


@pytest.mark.parametrize(("cores", "processes"), [(1, 0), (2, 0), (3, 0), (4, 2), (6, 4), (16, 8), (128, 8)])
def test_left_to_none_a_rank_keeps_two_cores_and_encodes_on_the_rest(cores, processes):
    assert encode_processes_for(cores) == processes
    assert encode_processes_for(cores, spawn_safe=False) == 0  # a script a worker would run again: threads


def test_a_script_that_trains_at_its_top_level_would_run_again_in_each_worker(tmp_path):
    """Why `none` starts no worker under a researcher's unguarded script: a spawned worker imports the main
    module first. The script below counts its own starts; the detector says it is not safe, and a pool
    started anyway (an explicit `encode_processes`) runs the script's top level once more per worker."""
    marker, script = tmp_path / "starts.txt", tmp_path / "train_at_top_level.py"
    script.write_text(
        "import sys\n"
        f"open({str(marker)!r}, 'a').write('start\\n')\n"
        "from muonlab.data.encoding_processes import EncodingSpec, encode_with_bos, encoding_pool, main_is_spawn_safe\n"
        "if __name__ != '__mp_main__':\n"
        "    print(main_is_spawn_safe())\n"
        "    spec = EncodingSpec(r'\\S+|\\s+', [bytes([b]) for b in range(256)], {'<|bos|>': 256}, 256)\n"
        "    with encoding_pool(spec, 1) as pool:\n"
        "        print(pool.submit(encode_with_bos, ['ab']).result()[0].tolist())\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "[256,", "97,", "98]"]
    assert marker.read_text().splitlines() == ["start", "start"]  # the parent's, and the worker's again


@pytest.mark.parametrize(("main", "safe"), [
    ({"__spec__": "muonlab.__main__", "__file__": "/x/muonlab/__main__.py"}, True),  # python -m muonlab, torchrun -m
    ({"__file__": "/venv/bin/muonlab", "main": "muonlab.cli"}, True),  # the console script, its call guarded
    ({}, True),  # an interactive session or a notebook
    ({"__file__": "/home/me/train.py"}, False),  # a script: it may train at its top level
    ({"__spec__": "mylab.train", "__file__": "/home/me/mylab/train.py"}, False),  # python -m mylab.train
])
def test_the_main_modules_a_spawned_worker_can_import_harmlessly(monkeypatch, main, safe):
    import types
    from importlib.machinery import ModuleSpec

    from muonlab.data.encoding_processes import main_is_spawn_safe

    module = types.ModuleType("__main__")
    if "__spec__" in main:
        module.__spec__ = ModuleSpec(main["__spec__"], None)
    if "__file__" in main:
        module.__file__ = main["__file__"]
    if "main" in main:
        module.main = types.FunctionType((lambda: 0).__code__, {})
        module.main.__module__ = main["main"]
    monkeypatch.setitem(sys.modules, "__main__", module)
    assert main_is_spawn_safe() is safe


def test_the_setting_reaches_the_loader_and_a_negative_count_is_refused(bpe, tmp_path):
    from muonlab.data.prepare import PreparedData

    data = PreparedData(DataConfig(encode_processes=3), bpe, tmp_path, {}, "", "", None, corpus=None)
    data.documents = lambda split, start=0, one_pass=False: _documents(start)
    assert data.loader(4, 48, "train").packer.encode_processes == 3
    with pytest.raises(UsageError, match="encode_processes must be >= 0, got -1"):
        validate_tree(DataConfig(encode_processes=-1))


def test_left_to_none_processes_feed_a_gpu_and_a_cpu_run_keeps_its_cores(bpe, tmp_path, monkeypatch):
    from muonlab.data import prepare
    from muonlab.data.prepare import PreparedData

    monkeypatch.setattr(prepare, "usable_cpus", lambda: 16)
    monkeypatch.setattr(prepare, "main_is_spawn_safe", lambda: True)
    data = PreparedData(DataConfig(), bpe, tmp_path, {}, "", "", None, corpus=None)
    data.documents = lambda split, start=0, one_pass=False: _documents(start)
    assert data.loader(4, 48, "train", device="cuda").packer.encode_processes == 8  # not started until iterated
    assert data.loader(4, 48, "train", device="cuda", world_size=4).packer.encode_processes == 2
    assert data.loader(4, 48, "train", device="cpu").packer.encode_processes == 0


def test_a_tokenizer_with_no_encoding_to_rebuild_encodes_in_the_training_process():
    """A Hugging Face tokenizer.json (local data) has no tiktoken encoding: its loader encodes in process."""

    class Words:
        def encode_batch(self, docs, prepend_bos=True):
            return [np.array([0, *(len(w) for w in d.split())], dtype=np.int32) for d in docs]

    own = BestFitLoader(_documents, Words(), B=2, T=16, buffer_size=8)
    asked = BestFitLoader(_documents, Words(), B=2, T=16, buffer_size=8, encode_processes=2)
    for _ in range(5):
        assert _same(next(own), next(asked))


def test_closing_the_loader_ends_its_workers_and_iterating_again_goes_on_where_it_was(bpe):
    own, workers = _loader(bpe, 0), _loader(bpe, 2)
    for _ in range(4):
        assert _same(next(own), next(workers))
    assert len(multiprocessing.active_children()) == 2
    workers.close()  # a run's end: no tokenizing process outlives the training
    assert multiprocessing.active_children() == []
    for _ in range(4):
        assert _same(next(own), next(workers))
    workers.close()
