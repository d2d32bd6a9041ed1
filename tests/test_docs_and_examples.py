"""The README's code, the examples and the generated docs: a new user runs them as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_quick_start_runs_as_written(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the README is ours
    assert namespace["is_valid"] is True
    assert (tmp_path / "model_ir.json").is_file()


@pytest.mark.parametrize("script", ["basic_usage.py", "resnet_example.py"])
def test_example_runs(script, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / script), str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "PASSED" in result.stdout


def test_operators_doc_is_generated_from_the_registry():
    from torch_ir.ops.docs import operators_markdown

    assert (ROOT / "docs" / "operators.md").read_text() == operators_markdown(), (
        "docs/operators.md is stale: run `torch-ir ops --markdown > docs/operators.md`")


def test_npu_ops_doc_is_generated_from_the_op_table():
    from torch_ir.passes.docs import npu_docs_markdown

    assert (ROOT / "docs" / "npu_ops.md").read_text() == npu_docs_markdown(), (
        "docs/npu_ops.md is stale: run `torch-ir ops --npu --markdown > docs/npu_ops.md`")
