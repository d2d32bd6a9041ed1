"""``bench/llm/decode_attention.py``: the table's rows for each dtype, the kernel checked against float64 before it is
timed, and a wrong result stopping it."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from npu_runtime.backends import cpu_decode_ops

BENCH_LLM = Path(__file__).resolve().parents[2] / "bench" / "llm"


@pytest.fixture(scope="module")
def bench():
    if cpu_decode_ops._kernel.load() is None:
        pytest.skip(f"no native decode ops here: {cpu_decode_ops.native_status()}")
    sys.path.insert(0, str(BENCH_LLM))
    try:
        return importlib.import_module("decode_attention")
    finally:
        sys.path.remove(str(BENCH_LLM))


def test_every_dtype_and_count_is_a_row(bench, capsys):
    assert bench.main(["--positions", "3", "40", "--reps", "1", "--no-floor"]) == 0
    out = capsys.readouterr().out
    for dtype in ("float32", "bfloat16", "float16"):
        for positions in (3, 40):
            assert re.search(rf"\| {dtype} \| {positions} \| \d+ \| \d+ \| \d+\.\d\d \| - \| [\d.e+-]+ \|", out), out


def test_a_wrong_kernel_is_not_timed(bench, monkeypatch):
    real = cpu_decode_ops.attention

    def off_by_one_step(q, k, v, mask, out, scale, *rest):
        made = real(q, k, v, mask, out, scale, *rest)
        out.add_(2.0**-5)
        return made

    monkeypatch.setattr(cpu_decode_ops, "attention", off_by_one_step)
    with pytest.raises(SystemExit, match="off by"):
        bench.main(["--positions", "8", "--reps", "1", "--no-floor", "--dtypes", "float32"])
