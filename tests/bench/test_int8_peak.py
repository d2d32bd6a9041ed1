"""``bench/runtime/int8_peak.py``: the int8 dot-product probes do the products they are asked for, run where the
CPU has their instructions (read from /proc/cpuinfo here, not from the probe), and the MAC count of a model is its
convolutions' and linear layers' fan-in times their outputs (issue 30: the compute floor beside each int8 row)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from tests.ort_oracle import bench_runtime


@pytest.fixture(scope="module")
def peak():
    return bench_runtime("int8_peak")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo to read the CPU's instruction sets from")
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def test_each_probe_runs_where_the_cpu_has_its_instructions(peak):
    if platform.machine() != "x86_64":
        pytest.skip("the probes are x86 ones")
    flags = _cpu_flags()
    result = peak.measure_int8_peak(threads=1, iters=200_000, reps=1)
    want = set()
    if "avx2" in flags:
        want |= {"exact_avx2", "saturating_avx2"}
        if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
            want.add("exact_vnni")
    assert set(result.rates) == want, (result.rates, sorted(flags & {"avx2", "avx512f", "avx512_vnni"}))
    assert all(rate > 0 for rate in result.rates.values()), result.rates
    assert ("no probe" in result.line()) == (not want), result.line()


def test_a_probe_whose_checksum_is_not_its_products_is_refused(peak):
    """The rate is of work done: a loop that returned another sum (skipped work) raises instead of a peak."""
    class Short:  # the C library's interface, answering one product short of what was asked
        @staticmethod
        def int8_peak_run(kind: int, iters: int) -> int:
            return iters * peak.ACCS * peak.KINDS[kind][1] * peak.PRODUCT + 6

    with pytest.raises(RuntimeError, match="checksums"):
        peak._rate(Short(), 0, 10, threads=1)


def test_iters_beyond_the_int32_lanes_are_refused(peak):
    with pytest.raises(ValueError, match="iters"):
        peak.measure_int8_peak(iters=60_000_000)


def test_contraction_macs_counts_conv_and_linear_fan_in(peak):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1, groups=2), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 5 * 5, 10))
    macs = peak.contraction_macs(model, (torch.zeros(1, 3, 10, 10),))
    # conv1: 8x5x5 outputs x 27; grouped conv2: 8x5x5 outputs x (4 x 9); linear: 10 outputs x 200
    assert macs == 200 * 27 + 200 * 36 + 10 * 200
