"""SIGTERM at every phase of a run (issue 32 item 3): it stops within seconds, exits 130 with one line,
and the run is recorded as `interrupted` with the phase it was in.

- data: while the corpus is still being built (Python takes the signal between operations); the
  half-built corpus folder, its lock included, is removed, and the run gets its directory and line;
- train, first step: the step that compiles the model stops at once, not after the step (there is
  nothing yet a checkpoint would keep);
- train, later steps: the loop stops after its step and checkpoints (tests/train/test_checkpoint.py);
- evaluate: the final evaluation stops at once; the final checkpoint makes the run resumable;
- a signal whose KeyboardInterrupt C code discards still stops the data phase, and the first step after it ends
  (muonlab.stop_request)."""

from __future__ import annotations

import json
import os
import signal

import pytest
from support.warm_run import WarmMuonlab

from muonlab.train.run import StopSignals


def _interrupt(tmp_path, marker: str, *args: str, then=lambda runs: True):
    """Start `muonlab train --preset cpu-tiny ARGS` (a process of its own: support.warm_run), send SIGTERM once
    a line of its output holds `marker` and `then(runs folder)` holds (each phase is long enough to be still
    under way: no wait of a guessed length); (exit code, its output, the ledger's lines, the runs folder)."""
    runs = tmp_path / "runs"
    argv = ["train", "--preset", "cpu-tiny", "--runs-dir", str(runs), *args]
    with WarmMuonlab(argv, {**os.environ, "MUONLAB_CACHE": str(tmp_path / "cache")}, tmp_path / "run.log") as run:
        run.wait_for_line(marker)
        run.wait_until(f"the condition after {marker!r}", lambda: then(runs))
        assert run.process.poll() is None, f"the run ended before the signal (after {marker!r})"
        run.process.send_signal(signal.SIGTERM)
        state = run.signal_state()  # in a failure's message: was the signal held, ignored or handled?
        code = run.process.wait(timeout=120)
    if code != 130:
        print(f"the run's signals just after SIGTERM was sent: {state}")
    ledger = runs / "ledger.jsonl"
    lines = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.is_file() else []
    return code, run.output(), lines, runs


def test_sigterm_while_the_corpus_is_built_stops_cleans_the_cache_and_records_the_run(tmp_path):
    # the line is printed under the corpus folder's lock: the folder is half built (200 MB take seconds)
    code, out, lines, runs = _interrupt(tmp_path, "data: building synthetic corpus", "--synthetic-bytes",
                                        "200000000", "--num-steps", "2")
    assert code == 130, out
    assert out.strip().splitlines()[-1].startswith("error: interrupted: the run is recorded interrupted; where its "
                                                   "ledger line says resumable, `muonlab train --resume RUN_DIR`")
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    [line] = lines
    assert (line["status"], line["phase"], line["resumable"]) == ("interrupted", "data", False)
    assert line["provenance"]["corpus_hash"] is None  # the data was never made
    run_dir = runs / line["run_id"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["phase"]) == ("interrupted", "data")
    assert (run_dir / "config.json").is_file()


def test_sigterm_while_the_first_step_compiles_stops_at_once(tmp_path, monkeypatch):
    # the signal once Inductor has written its first file into an empty cache: the first step is compiling (its
    # C++ kernels, each a compiler run, cold)
    inductor = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    code, out, lines, runs = _interrupt(tmp_path, "compile True", "--compile", "on", "--num-steps", "3",
                                        then=lambda runs: inductor.is_dir() and any(inductor.rglob("*")))
    assert code == 130, out
    [line] = lines
    assert (line["status"], line["phase"], line["resumable"]) == ("interrupted", "train", False)
    assert line["error"] == "interrupted (SIGTERM)"
    assert (runs / line["run_id"] / "metrics.jsonl").read_text() == ""  # stopped inside the step, not after it


def test_sigterm_during_the_final_evaluation_records_a_resumable_run(tmp_path):
    # the line comes after the final checkpoint; a model of depth 6 takes ~1 s of a core to score the
    # validation and holdout splits of a 3 MB corpus
    code, out, lines, _ = _interrupt(tmp_path, "evaluating the trained weights", "--synthetic-bytes", "3000000",
                                     "--depth", "6", "--num-steps", "1", "--eval-tokens", "100000000")
    assert code == 130, out
    [line] = lines
    assert (line["status"], line["phase"], line["resumable"]) == ("interrupted", "evaluate", True)


def test_a_signal_before_the_first_poll_interrupts_at_once_and_names_itself():
    with StopSignals(at_once=True) as stop:
        with pytest.raises(KeyboardInterrupt) as caught:
            signal.raise_signal(signal.SIGTERM)
        assert (caught.value.signal, str(caught.value)) == ("SIGTERM", "interrupted (SIGTERM)")
        assert stop.requested  # noted before the raise (the next test: when the interrupt is discarded)


def test_after_the_first_poll_a_signal_asks_for_a_stop_and_a_second_interrupts():
    with StopSignals(at_once=True) as stop:
        assert stop.poll() is False
        signal.raise_signal(signal.SIGUSR2)
        assert (stop.poll(), stop.signal) == (True, "SIGUSR2")
        with pytest.raises(KeyboardInterrupt) as caught:
            signal.raise_signal(signal.SIGINT)
        assert caught.value.signal == "SIGUSR2"  # the first signal says why the run stopped


def test_a_distributed_run_waits_for_its_step_whatever_the_phase():
    with StopSignals(at_once=False) as stop:
        signal.raise_signal(signal.SIGTERM)
        assert stop.poll() is True


def _discarding_the_interrupt(original, sig):
    """`original`, after a signal whose KeyboardInterrupt is discarded, as C code calling back into Python can
    (a suite run's SIGTERM was lost so inside numpy's Generator.choice, in the synthetic corpus's word draw)."""
    def draw(*args, **kwargs):
        try:
            signal.raise_signal(sig)  # the handler runs here and raises
        except KeyboardInterrupt:
            pass
        return original(*args, **kwargs)

    return draw


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_whose_interrupt_is_discarded_still_stops_the_corpus_build(tmp_path, monkeypatch, capsys, sig):
    from muonlab.cli import main
    from muonlab.data.synthetic import MarkovText

    monkeypatch.setattr(MarkovText, "random", _discarding_the_interrupt(MarkovText.random, sig))
    monkeypatch.setenv("MUONLAB_CACHE", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    # Ctrl-C as a terminal's process has it (a pytest-xdist worker ignores SIGINT, and the command leaves it so)
    terminal = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = main(["train", "--preset", "cpu-tiny", "--runs-dir", str(runs), "--synthetic-bytes", "300000"])
    finally:
        signal.signal(signal.SIGINT, terminal)
    assert code == 130, capsys.readouterr()
    assert capsys.readouterr().err.strip().startswith("error: interrupted")
    [line] = [json.loads(text) for text in (runs / "ledger.jsonl").read_text().splitlines()]
    assert (line["status"], line["phase"]) == ("interrupted", "data")
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # stopped before the corpus was whole


def test_a_first_signal_whose_interrupt_is_discarded_still_stops_the_loop_after_its_step():
    # at once (the first step, compiling) the handler raises; discarded, the loop's poll after the step still stops
    with StopSignals(at_once=True) as stop:
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            pass
        assert stop.poll() and stop.signal == "SIGTERM"


def test_a_run_logs_each_line_with_its_end_in_one_write(monkeypatch):
    # a signal is taken between two writes, never inside one: print() writes a line and its end apart, and a SIGTERM
    # between them joined the run's last line to the command's "error: interrupted" line
    import argparse

    from muonlab.cli.parser import _log_for

    writes = []

    class Stream:
        def write(self, text):
            writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr("sys.stdout", Stream())
    _log_for(argparse.Namespace(json=False))("data: building synthetic corpus")
    assert writes == ["data: building synthetic corpus\n"]
