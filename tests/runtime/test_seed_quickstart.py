"""Seed 004's quick start (sections 1, 2, 3a, 3b), run as written on ResNet-18.

The snippets below are the seed's code blocks character for character, except that section 3b imports
and builds our ``CPUBackend`` where the seed had ``MetalBackend``. What the seed leaves to the reader
(the model, its example input, saving the IR and the weights, the input arrays) is the setup around
them. When the seed documents are beside the repository (``../shared/seeds``), a test checks that the
snippets still match them.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers import assert_topk_match, randomize_batch_norm
from torch_ir import save_weights
from torch_ir.weights import module_state

SEED = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "004_e58fa43ff5d9d6e9.txt"

SECTION_1 = """\
from torch_ir import extract_ir
ir = extract_ir(model, example_input, model_name="my_model")
"""

SECTION_2 = """\
import npu_compiler
program = npu_compiler.compile("model_ir.json")
program.save("model.npubin")
"""

SECTION_3A = """\
from npu_compiler.compiled_program import CompiledProgram
from npu_runtime import Device, Executor, NPUBuffer, load_weights

device = Device()
program = CompiledProgram.load("model.npubin")
executor = Executor(program, device)
weights = load_weights("model.safetensors", program, device)

input_buf = NPUBuffer.from_numpy(input_data, device, spec=program.input_specs[0])
outputs = executor.run(inputs={"input": input_buf}, weights=weights)
result = outputs["output"].to_numpy(spec=program.output_specs[0])
"""

SECTION_3B = """\
from npu_compiler import partition, is_op_supported
from npu_runtime import DAGExecutor, MetalBackend

plan = partition(ir_dict, is_op_supported)
backend = MetalBackend()
dag = DAGExecutor(plan, backend)
dag.load_weights(weights_dict)
result = dag.execute(inputs={"x": input_array})
"""

OUR_BACKEND = {"MetalBackend": "CPUBackend"}


def _ours(snippet: str) -> str:
    for theirs, ours in OUR_BACKEND.items():
        snippet = snippet.replace(theirs, ours)
    return snippet


def _resnet18() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(ResNetConfig(
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic",
        num_labels=1000))


class ResNet18(nn.Module):
    """ResNet-18 taking its image as ``input`` (the name section 3a runs it by) and returning the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _resnet18()

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - the seed's input name
        return self.net(pixel_values=input).logits


class ResNet18X(ResNet18):
    """The same model taking ``x`` (the name section 3b runs it by)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def _pair(cls: type[nn.Module]) -> tuple[nn.Module, nn.Module]:
    with torch.device("meta"):
        meta = cls().eval()
    torch.manual_seed(0)
    real = randomize_batch_norm(cls().eval(), seed=1)  # so that folding batch norm is tested
    return meta, real


def _image() -> np.ndarray:
    return torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2)).numpy()


def _check(result: np.ndarray, real: nn.Module, image: np.ndarray) -> None:
    with torch.no_grad():
        expected = real(torch.from_numpy(image)).numpy()
    assert result.shape == expected.shape == (1, 1000)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    assert_topk_match(torch.from_numpy(result), torch.from_numpy(expected), k=5, atol=1e-4)


def test_sections_1_2_3a_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, real = _pair(ResNet18)
    example_input = (torch.randn(1, 3, 224, 224, device="meta"),)
    scope = {"model": model, "example_input": example_input}
    exec(SECTION_1, scope)
    scope["ir"].save("model_ir.json")  # the step between sections 1 and 2
    exec(SECTION_2, scope)
    save_weights(module_state(real), "model.safetensors")  # the weights section 3a loads
    scope["input_data"] = _image()
    exec(SECTION_3A, scope)
    _check(scope["result"], real, scope["input_data"])
    # 20 convolutions, 8 of them fused with their block's residual add and relu; max pool, mean, GEMM
    assert scope["program"].kernel_histogram() == {
        "CONV": 20, "GEMM": 1, "aten.max_pool2d.default": 1, "aten.mean.dim": 1}
    assert sum(bool(d.params.get("has_residual")) for d in scope["program"].dispatches) == 8


def test_section_3b_runs_as_written_with_our_backend(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, real = _pair(ResNet18X)
    from torch_ir import extract_ir

    extract_ir(model, (torch.randn(1, 3, 224, 224, device="meta"),), model_name="my_model").save("model_ir.json")
    scope = {
        "ir_dict": json.loads(Path("model_ir.json").read_text()),
        "weights_dict": real.state_dict(),
        "input_array": _image(),
    }
    exec(_ours(SECTION_3B), scope)
    assert set(scope["result"]) == {"output"}
    _check(scope["result"]["output"], real, scope["input_array"])
    assert [p.device for p in scope["plan"].partitions] == ["npu"]


def _code_blocks(text: str) -> list[str]:
    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)]


@pytest.mark.skipif(not SEED.exists(), reason="the seed documents are not beside the repository")
def test_snippets_are_the_seeds_code_blocks():
    blocks = _code_blocks(SEED.read_text(encoding="utf-8"))
    assert blocks[:4] == [SECTION_1, SECTION_2, SECTION_3A, SECTION_3B]
