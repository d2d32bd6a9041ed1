"""``bench/gemv/prefill.py``: every method of a small shape checked against the float64 product and timed, the table
printed with the FMA peak, and the FMA probe's rate a plausible one (its loop does the FMAs it is asked for)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from npu_runtime.backends import cpu_gemv
from tests.runtime.test_gemv import at_most

BENCH_GEMV = Path(__file__).resolve().parents[2] / "bench" / "gemv"


@pytest.fixture(scope="module")
def prefill():
    sys.path.insert(0, str(BENCH_GEMV))
    try:
        return importlib.import_module("prefill")
    finally:
        sys.path.remove(str(BENCH_GEMV))


def test_the_table_has_every_method(prefill, native, request, capsys):
    at_most(request, "avx2")
    assert prefill.main(["--shapes", "BERT qkv", "--rows", "7", "--reps", "1", "--dtypes", "float16", "float32"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"FMA peak \d+\.\d GMAC/s", out), out
    half = re.search(r"\| BERT qkv \(768 -> 2304\) \| 7 \|(( [\d.]+ \|){5}) \d+% \| \d\.\d\d \|", out)
    full = re.search(r"\| BERT qkv \(768 -> 2304\) \| 7 \|(( [\d.]+ \|){2,3}) \d+% \| \d\.\d\d \|", out)
    assert half and full, out
    assert "| ours | widened tiles | oneDNN fp32 | torch.mm fp32 | torch half |" in out or \
        "| ours | widened tiles | torch.mm fp32 | torch half |" in out  # a torch without oneDNN


def test_the_fma_probe_measures_fmas(prefill, native):
    one = prefill.fma_peak(1, seconds=0.05)
    if one is None:
        pytest.skip("no AVX2/FMA here")
    assert 1.0 < one < 500.0  # GMAC/s of one core: 8 lanes x 2 units x a few GHz at most
    assert cpu_gemv.native_available()
