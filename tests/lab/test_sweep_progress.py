"""What a local sweep prints as its runs go (lab/progress.py): "k of N", durations, the elapsed time,
an ETA from the finished runs' mean duration, and the live status of the runs in flight read from
their metrics.jsonl; and the training line's percentage (steps done) and smoothed ETA."""

from __future__ import annotations

import json

from muonlab.lab.progress import SweepProgress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_each_run_is_k_of_n_with_elapsed_time_and_an_eta_from_finished_runs():
    lines, clock = [], Clock()
    shown = SweepProgress(4, slots=2, log=lines.append, interactive=False, clock=clock)
    shown.start("a", "CPU")
    shown.start("b", "CPU")
    clock.t = 10.0
    shown.done("a", 0)  # 3 runs left at 10 s each, b 10 s underway, 2 at a time: (30 - 10) / 2
    shown.start("c", "CPU")
    clock.t = 14.0
    shown.done("b", 1)
    assert lines[0] == "start [1 of 4] a on CPU" and lines[1] == "start [2 of 4] b on CPU"
    assert lines[2] == "done  [1 of 4] a: ok in 0m10s; 1 of 4 finished, elapsed 0m10s, ETA 0m10s"
    assert lines[4].startswith("done  [2 of 4] b: exit 1 in 0m14s; 2 of 4 finished, elapsed 0m14s, ETA")
    clock.t = 30.0
    shown.start("d", "CPU")
    shown.done("c", 0)
    shown.done("d", 0)
    assert lines[-1] == "done  [4 of 4] d: ok in 0m00s; 4 of 4 finished, elapsed 0m30s"  # no ETA at the end


def test_the_live_line_reads_the_runs_metrics_every_so_often(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(10):
            f.write(json.dumps({"step": step, "loss": 5.0 - step / 10, "smooth_loss": 4.5, "dt": 2.0}) + "\n")
    lines, clock = [], Clock()
    shown = SweepProgress(1, slots=1, log=lines.append, every_s=30, interactive=False, clock=clock)
    shown.start("a", "CPU")
    clock.t = 10.0
    shown.live([("a", str(run), 100)])
    assert lines == ["start [1 of 1] a on CPU"]  # not yet: every 30 s
    clock.t = 31.0
    shown.live([("a", str(run), 100)])
    assert lines[-1] == "running 1: a step 10/100, loss 4.5000, ETA 3m00s"


def test_the_training_line_shows_steps_done_and_an_eta_from_recent_steps(capsys):
    from collections import deque

    from muonlab.arms import resolve_config
    from muonlab.train.loop import LoopState, _print_progress

    cfg = resolve_config("baseline", "cpu-tiny", {"num_steps": 12})
    rec = dict(step=5, progress=0.45, lrm=1.0, dt=9.0, tok_per_sec=1.0, mfu=None)
    _print_progress(cfg, LoopState(step=6, smooth_loss=3.0, epoch=1), rec, False, deque([1.0, 1.0, 1.0, 3.0]))
    line = capsys.readouterr().out
    assert "(50.0%)" in line  # 6 of 12 steps, not the schedule's progress
    assert line.rstrip().endswith("eta 0m09s")  # 6 steps left x the recent mean 1.5 s, not the last step's 9 s
