"""``bench/llm/prefill_ab.py`` on a tiny Q8_0 GGUF file: every arm run and printed, the module switches it flips
restored afterwards."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from npu_runtime.backends import cpu_blocks

from ..gguf.test_config import make_model, write_model

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "llm" / "prefill_ab.py"


@pytest.mark.slow
def test_the_prefill_ab_bench_runs_every_arm(tmp_path: Path) -> None:
    path = write_model(make_model("qwen2"), "qwen2", tmp_path / "q.gguf", {"blk.": "Q8_0"})
    out = subprocess.run([sys.executable, str(SCRIPT), str(path), "--prompt", "16", "--rounds", "2"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    for arm in ("integer, GGUF layout", "integer, groups", "float, rounded x", "as shipped"):
        assert re.search(rf"\| {re.escape(arm)} \| \d+\.\d\d \[\d+\.\d\d-\d+\.\d\d\] \|", out.stdout), arm


def test_the_arms_are_the_switches_cpu_blocks_reads() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import prefill_ab
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert {prefill for prefill, _ in prefill_ab.ARMS.values()} == {None, "native", "rounded"}
    assert cpu_blocks.INT8_GROUPS is True and cpu_blocks.INT8_PREFILL is None  # the shipped defaults
