"""The data path off the step's critical path, and the step's host reads pinned.

- PrefetchLoader hands out the wrapped loader's batches in its order, and its state is that of the batches
  handed out (not of those made ahead), so a checkpoint resumes exactly;
- a step whose loader keeps ahead never waits for data: counted, not timed (the step waits on the condition
  "the prefetch queue is full" before it takes its next batch);
- one device->host read a training step (the losses and the gradient norm together), counted in the loop.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from muonlab.data import prefetch
from muonlab.data.packing import BestFitLoader
from muonlab.data.prefetch import PrefetchLoader


class WordTokenizer:
    """Documents of integers as text: "3 1 4" -> [BOS, 3, 1, 4]."""

    def encode_batch(self, docs, prepend_bos=True):
        return [[0, *map(int, d.split())] for d in docs]


def _docs(start: int):
    rng = np.random.default_rng(0)
    batches = [[" ".join(map(str, rng.integers(1, 50, rng.integers(3, 40)))) for _ in range(8)] for _ in range(400)]
    return iter(batches[start:])


def _loader() -> BestFitLoader:
    return BestFitLoader(_docs, WordTokenizer(), B=4, T=32, buffer_size=16)


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[:2], b[:2])) and a[2] == b[2]


def test_prefetched_batches_are_the_loaders_and_its_state_is_that_of_the_batches_handed_out():
    plain, ahead = _loader(), PrefetchLoader(_loader(), depth=3)
    for _ in range(7):
        assert _same(next(plain), next(ahead))
    state = ahead.state_dict()  # the worker is ahead by up to 3 batches; the state is at batch 7
    resumed = _loader()
    resumed.load_state_dict(state)
    for _ in range(5):
        assert _same(next(plain), next(resumed))
    ahead.close()  # the worker stops; the wrapped loader goes back to the last batch handed out
    again = _loader()
    again.load_state_dict(state)
    for _ in range(3):
        assert _same(next(again), next(ahead))  # the thread restarts where the consumer was
    ahead.close()


def test_closing_a_loader_whose_worker_waits_on_a_full_queue_does_not_wait_for_the_put(monkeypatch):
    """The worker, blocked putting into a full queue, is released by close() at once: with the put's timeout made
    an hour, close() still returns (a run's end used to wait out the timeout)."""
    import threading

    monkeypatch.setattr(prefetch, "_PUT_TIMEOUT_S", 3600.0)
    ahead = PrefetchLoader(_loader(), depth=2)
    next(ahead)
    deadline = time.monotonic() + 120  # a bound for the failure only
    while not ahead._queue.full() and time.monotonic() < deadline:  # two batches made ahead, a third waiting
        time.sleep(0.01)
    assert ahead._queue.full()
    closing = threading.Thread(target=ahead.close, daemon=True)
    closing.start()
    closing.join(timeout=120)  # a bound for the failure only
    assert not closing.is_alive(), "close() waited for the worker's put to time out"


def test_a_loader_error_reaches_the_consumer():
    def broken():
        yield from [(torch.zeros(1), torch.zeros(1), 1)]
        raise ValueError("corrupt shard")

    class Loader:
        def __init__(self):
            self.it = broken()

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.it)

        def state_dict(self):
            return {}

    ahead = PrefetchLoader(Loader(), depth=2)
    next(ahead)
    with pytest.raises(ValueError, match="corrupt shard"):
        next(ahead)


def _wait_until(condition, what: str, limit_s: float = 120.0) -> None:
    """Wait on a condition (a generous limit only so that a broken worker fails the test, not hangs it)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.001)


def _tiny(num_steps: int, total_batch: int = 1024, **settings):
    from muonlab.arms import resolve_config
    from muonlab.device import Runtime
    from muonlab.train.build import build_model, build_optimizer

    cfg = resolve_config("baseline", "cpu-tiny", {"num_steps": num_steps, "total_batch_size": total_batch,
                                                  "quiet": True, **settings})
    runtime, vocab = Runtime(torch.device("cpu"), "fp32"), cfg.data.vocab_size
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, vocab, runtime)
    return cfg, runtime, vocab, model, build_optimizer(model, cfg, compile_step=False)


def test_a_step_whose_loader_keeps_ahead_never_waits_for_data():
    from muonlab.train.loop import train_loop
    from support.compile_check import fixed_batches

    cfg, runtime, vocab, model, optimizer = _tiny(num_steps=4)
    batches = fixed_batches(cfg, vocab)
    ahead = PrefetchLoader(iter([(x, y, 1) for x, y in batches]), depth=3)
    forward = model.forward

    def slow_step(*args, **kwargs):  # the step is slower than the loader: it waits until the queue is full
        _wait_until(lambda: ahead._queue.full() or not ahead._thread.is_alive(),
                    "the prefetch queue full (or the loader used up)")
        return forward(*args, **kwargs)

    model.forward = slow_step
    records = []
    train_loop(cfg, model, optimizer, ahead, runtime, model.estimate_flops(), on_step=records.append)
    ahead.close()
    assert ahead.waited <= 1 and ahead.handed == 4 * 4 + 1  # at most the first batch, asked as the worker starts
    assert len(records) == 4 and all(r["data_wait"] >= 0 for r in records)


def test_a_training_step_reads_the_device_once(monkeypatch):
    """The losses and the gradient norm come back in one read a step (`.tolist()`); no `.item()`, `.cpu()`,
    `.numpy()` or tensor truth value inside the loop besides."""
    from muonlab.train.loop import train_loop
    from support.compile_check import fixed_batches

    steps = 5
    # no trajectory step: seed 000 Table 4B's residual scalars are read at their own cadence (steps 0, 10, ...)
    cfg, runtime, vocab, model, optimizer = _tiny(num_steps=steps, **{"record.trajectory_steps": ""})
    batches = fixed_batches(cfg, vocab)
    reads: list[str] = []
    for name in ("item", "tolist", "cpu", "numpy", "__bool__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _real=real, **kwargs):
            reads.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    train_loop(cfg, model, optimizer, ((x, y, 1) for x, y in batches), runtime, model.estimate_flops())
    monkeypatch.undo()
    assert reads == ["tolist"] * steps, reads


def test_a_run_with_its_batches_made_ahead_is_the_run_without(tmp_path, capsys):
    """In the training thread, on a prefetching thread, with the documents tokenized in worker processes, and
    with their ids kept in the corpus's store by a first run and read back from it by a second."""
    import json

    from muonlab.cli import main

    out = {}
    ways = {"in-thread": ["--prefetch-batches", "0", "--encode-processes", "0", "--encoded-store-mb", "0"],
            "ahead": ["--prefetch-batches", "4", "--encode-processes", "0", "--encoded-store-mb", "0"],
            "processes": ["--prefetch-batches", "4", "--encode-processes", "2", "--encoded-store-mb", "0"],
            "stored": ["--prefetch-batches", "4"], "read back": ["--prefetch-batches", "4"]}
    for way, flags in ways.items():
        assert main(["train", "--preset", "cpu-tiny", "--num-steps", "4", *flags,
                     "--runs-dir", str(tmp_path / way), "--json"]) == 0
        out[way] = json.loads(capsys.readouterr().out)
    assert len({out[w]["metrics"]["val_bpb"] for w in ways}) == 1
    hashes = {json.loads((Path(out[w]["run_dir"]) / "config.json").read_text())["config_hash"] for w in ways}
    assert len(hashes) == 1  # not part of what a run is
    w0, *others = (torch.load(f"{out[w]['run_dir']}/model.pt", weights_only=True) for w in ways)
    assert all(torch.equal(w0[k], w[k]) for w in others for k in w0)


def test_document_batches_encoded_ahead_on_threads_pack_the_same_rows():
    one = BestFitLoader(_docs, WordTokenizer(), B=4, T=32, buffer_size=16, encode_workers=1)
    four = BestFitLoader(_docs, WordTokenizer(), B=4, T=32, buffer_size=16, encode_workers=4)
    for _ in range(12):
        assert _same(next(one), next(four))
    state = four.state_dict()  # resuming drops what was encoded ahead and reads on from the batch it reached
    again = BestFitLoader(_docs, WordTokenizer(), B=4, T=32, buffer_size=16, encode_workers=3)
    again.load_state_dict(state)
    for _ in range(6):
        assert _same(next(one), next(again))


def test_each_step_records_where_its_time_goes_and_the_check_reads_it(tmp_path, capsys):
    """The phases follow each other from the step's start to its end: none negative, the data wait inside the
    forward + backward phase, their sum within the step's time; the GPU check's breakdown reads them."""
    import json

    from muonlab.cli import main
    from muonlab.doctor.gpu import WARMUP_STEPS, section_line, step_breakdown

    assert main(["train", "--preset", "cpu-tiny", "--num-steps", "6", "--runs-dir", str(tmp_path), "--json"]) == 0
    run = Path(json.loads(capsys.readouterr().out)["run_dir"])
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in steps:
        phases = [r["t_forward_backward"], r["t_optimizer"], r["t_rest"]]
        assert min(phases) >= 0 and r["data_wait"] <= r["t_forward_backward"] and sum(phases) <= r["dt"]
    breakdown = step_breakdown(steps)
    assert breakdown["steps"] == len(steps) - WARMUP_STEPS
    assert breakdown["median_s"]["dt"] == sorted(r["dt"] for r in steps[WARMUP_STEPS:])[1]  # the median of 3
    line = section_line("throughput", {"status": "ok", "error": None, "seconds": 1.0, "preset": "cpu-tiny",
                                       "num_steps": 6, "tokens_per_second": 1.0, "breakdown": breakdown})
    assert "forward+backward" in line and "optimizer" in line and "data wait" in line
