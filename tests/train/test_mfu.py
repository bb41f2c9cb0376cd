"""MFU: the global batch's model FLOPs per second over the peak of every device that trained it."""

import pytest

from muonlab.device import mfu_percent


def test_mfu_is_upstreams_formula_on_one_device():
    # upstream: 100 * num_flops_per_token * TOTAL_BATCH_SIZE / dt / H100_BF16_PEAK_FLOPS
    assert mfu_percent(3e8, 2**19, 0.5, 989.5e12, world_size=1) == pytest.approx(
        100 * 3e8 * 2**19 / 0.5 / 989.5e12)


def test_two_ranks_are_measured_against_two_devices():
    one = mfu_percent(3e8, 2**19, 0.5, 1e15, world_size=1)
    two = mfu_percent(3e8, 2**19, 0.5, 1e15, world_size=2)  # the same global batch over 2 GPUs
    assert two == pytest.approx(one / 2)
    # each of the 2 ranks did half the batch in that time: as busy as one GPU doing half the work
    assert two == pytest.approx(mfu_percent(3e8, 2**18, 0.5, 1e15, world_size=1))


@pytest.mark.parametrize(("peak", "seconds"), [(None, 1.0), (0.0, 1.0), (1e15, 0.0)])
def test_no_mfu_without_a_peak_or_a_duration(peak, seconds):
    assert mfu_percent(3e8, 2**19, seconds, peak, world_size=1) is None
