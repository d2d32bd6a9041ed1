"""The hostile-input tests' hang guard fails a block that outlives its bound, and leaves a quick one alone."""

from __future__ import annotations

import time

import pytest

from tests.hang_guard import HangError, no_hang


def test_a_block_past_its_bound_fails_naming_it():
    with pytest.raises(HangError, match=r"sleeper: not finished within 0.05 s \(a hang\)"):
        with no_hang(0.05, "sleeper"):
            time.sleep(2)


def test_a_quick_block_passes_and_the_alarm_is_cleared():
    with no_hang(1, "quick"):
        pass
    time.sleep(1.2)  # an alarm left armed would raise here
