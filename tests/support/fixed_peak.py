"""A plug-in (`--plugin tests/support/fixed_peak.py`) for runs in tests: every device, the CPU
included, reports the peak FLOP/s in $MUONLAB_TEST_PEAK_FLOPS, so a run computes MFU where no
GPU is there to have a peak. Loaded by the runs it is given to, never imported by the tests."""

import os

import muonlab.train.loop as loop
import muonlab.train.run as run

REGISTERS_NOTHING = "it patches the peak FLOP/s lookup for tests"
PEAK = float(os.environ["MUONLAB_TEST_PEAK_FLOPS"])


def _peak(device):
    return PEAK


loop.peak_flops = run.peak_flops = _peak
