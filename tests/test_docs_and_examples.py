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


@pytest.mark.slow
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
    from npu_compiler.passes.docs import npu_docs_markdown

    assert (ROOT / "docs" / "npu_ops.md").read_text() == npu_docs_markdown(), (
        "docs/npu_ops.md is stale: run `torch-ir ops --npu --markdown > docs/npu_ops.md`")


def test_kernels_doc_is_generated_from_the_kernel_table():
    from npu_program.docs import kernels_markdown

    assert (ROOT / "docs" / "kernels.md").read_text() == kernels_markdown(), (
        "docs/kernels.md is stale: run `torch-ir ops --kernels --markdown > docs/kernels.md`")


@pytest.mark.slow
def test_extending_walkthrough_runs_as_written(tmp_path):
    """docs/extending.md section 3 (a new NPU op: op record, rule, kernel record), its code blocks run in a
    fresh process (the records it adds must not leak into the other tests' tables)."""
    import re
    import subprocess
    import sys

    text = (ROOT / "docs" / "extending.md").read_text()
    section = text[text.index("## 3. A new NPU op"):]
    code = "\n\n".join(re.findall(r"```python\n(.*?)```", section, flags=re.S))
    script = tmp_path / "walkthrough.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "{'SCALE_SHIFT': 1, 'aten.relu.default': 1}" in result.stdout


def test_usage_hugging_face_recipe_runs_the_program_with_the_models_own_state_dict():
    """docs/usage.md's Hugging Face recipe, as written: built under build_on_meta, compiled, run with
    ``trained.state_dict()``, which lacks the non-persistent buffers (position_ids, token_type_ids) the program
    rebuilds itself."""
    pytest.importorskip("transformers")
    import numpy as np
    import torch

    text = (ROOT / "docs" / "usage.md").read_text()
    section = text[text.index("### Hugging Face models"):]
    recipe = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    assert "build_on_meta()" in recipe and "trained.state_dict()" in recipe
    namespace: dict = {}
    exec(compile("import torch\nimport torch_ir\n" + recipe, "docs/usage.md", "exec"), namespace)  # noqa: S102
    with torch.no_grad():
        expected = namespace["trained"](input_ids=namespace["ids"], attention_mask=namespace["mask"])
    np.testing.assert_allclose(namespace["hidden"], expected.last_hidden_state.numpy(), rtol=1e-4, atol=1e-4)
