"""``load_subject``: every kind of source gives an IR, inputs and the trusted framework's values.

Real frameworks throughout (eager PyTorch, onnxruntime, tinygrad on its pure-Python device): the trusted
outputs must equal the IR's reference execution, and the trusted intermediates must line up with the IR's
node outputs, since bisection reads them to name the first diverging node.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import helper

from npu_tools.debug.sources import SubjectError, load_subject, subject_from_torch
from npu_tools.debug.subject import Subject
from tests.onnx.graphs import FLOAT, make_model
from torch_ir.errors import InputMismatchError, WeightsMismatchError
from torch_ir.executor import IRExecutor
from torch_ir.inputs import random_inputs
from torch_ir.weights import save_weights

# tinygrad picks its device at import: the pure-Python one needs no compiler (as tests/tinygrad/conftest.py does)
os.environ.setdefault("DEV", "CPU" if shutil.which("clang") else "PYTHON")
HAS_TINYGRAD = importlib.util.find_spec("tinygrad") is not None


class TokenMLP(torch.nn.Module):
    """Token ids through an embedding, plus a float input: the ids must stay below the vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.emb(ids) + x)))


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(y.mean((2, 3)))


def make_cnn() -> tuple[torch.nn.Module, tuple]:
    """A ``module:factory`` spec's factory (resolved by ``npu_tools.zoo.runner.resolve_spec``)."""
    return SmallCNN(), (torch.randn(1, 3, 6, 6),)


def make_tinygrad_mlp() -> tuple[object, list]:
    """A ``tinygrad:module:factory`` spec's factory: (model, example inputs)."""
    from tinygrad.tensor import Tensor

    from tests.tinygrad.models import MLP

    return MLP((4, 8, 3)), [Tensor.empty(2, 4)]


def ir_values(subject: Subject) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The IR's outputs and every node output, run by the reference executor on the subject's inputs."""
    values: dict[str, torch.Tensor] = {}
    outs = IRExecutor(subject.ir, subject.weights).run_traced(
        subject.inputs, lambda node, o: values.update({m.name: v for m, v in zip(node.outputs, o)}))
    return outs, values


def assert_trusted_matches_ir(subject: Subject, *, all_nodes: bool) -> None:
    outs, values = ir_values(subject)
    trusted = subject.run_trusted()
    assert len(trusted) == len(outs) == len(subject.ir.graph_outputs)
    for got, want in zip(outs, trusted):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert subject.trusted_values is not None
    found = subject.trusted_values()
    node_outputs = [t.name for n in subject.ir.nodes for t in n.outputs]
    aligned = [n for n in node_outputs if n in found]
    if all_nodes:
        assert aligned == node_outputs, f"not aligned: {sorted(set(node_outputs) - set(aligned))}"
    else:
        assert aligned, "no intermediate lined up"
    for name in aligned:
        want, got = found[name], values[name]
        if want.is_floating_point():
            torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-4, atol=1e-5, msg=name)
        else:
            assert torch.equal(got, want.to(got.dtype)), name


def test_torch_model_with_token_ids() -> None:
    torch.manual_seed(0)
    subject = subject_from_torch(TokenMLP(), (torch.zeros(2, 5, dtype=torch.long), torch.randn(2, 5, 8)),
                                 name="token_mlp", seed=3)
    ids, x = subject.inputs
    assert ids.dtype == torch.long and 0 <= int(ids.min()) and int(ids.max()) < 20 and int(ids.max()) > 0
    assert x.shape == (2, 5, 8)
    assert subject.trusted == "eager PyTorch" and subject.frontend == "torch.export"
    assert_trusted_matches_ir(subject, all_nodes=True)
    again = subject_from_torch(TokenMLP(), (torch.zeros(2, 5, dtype=torch.long), torch.randn(2, 5, 8)), seed=3)
    assert all(torch.equal(a, b) for a, b in zip(subject.inputs, again.inputs))  # seeded


def test_torch_factory_spec() -> None:
    subject = load_subject("tests.debug.test_sources:make_cnn", seed=1)
    assert subject.name == "make_cnn" and subject.ir.graph_inputs[0].shape == [1, 3, 6, 6]
    assert_trusted_matches_ir(subject, all_nodes=True)


def small_onnx() -> object:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Add", ["r", "x2"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    init = {"w": rng.standard_normal((5, 4)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
    return make_model(nodes, [("x", FLOAT, ["batch", 4]), ("x2", FLOAT, ["batch", 5])],
                      [("y", FLOAT, ["batch", 5])], init)


def test_onnx_file(tmp_path: Path) -> None:
    path = tmp_path / "small.onnx"
    path.write_bytes(small_onnx().SerializeToString())
    with pytest.raises(InputMismatchError, match="input_shapes"):
        load_subject(path)  # a symbolic batch: the error says how to bind it
    subject = load_subject(path, input_shapes={"x": [3, 4], "x2": [3, 5]})
    assert subject.trusted == "onnxruntime" and subject.frontend == "onnx"
    assert subject.weights_used.text == "the ONNX model's own weights (its initializers)"
    with pytest.raises(SubjectError, match="ONNX model holds its own weights"):  # none to load weights into
        load_subject(path, weights={"w": torch.zeros(5, 4)}, input_shapes={"x": [3, 4], "x2": [3, 5]})
    assert [list(x.shape) for x in subject.inputs] == [[3, 4], [3, 5]]
    assert_trusted_matches_ir(subject, all_nodes=False)
    found = subject.trusted_values()
    assert {"h", "r", "s", "y"} <= set(found)  # every ONNX value the IR kept
    given = load_subject(path, inputs=subject.inputs, input_shapes={"x": [3, 4], "x2": [3, 5]})
    assert all(torch.equal(a, b) for a, b in zip(given.inputs, subject.inputs))


def test_ir_with_weights_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = subject_from_torch(SmallCNN(), (torch.randn(1, 3, 6, 6),))
    source.ir.save(str(tmp_path / "cnn.json"))
    save_weights(dict(source.weights), tmp_path / "cnn.safetensors")
    subject = load_subject(tmp_path / "cnn.json")  # the weights beside it
    assert subject.trusted == "the IR's reference execution" and subject.frontend is None
    assert subject.weights_used.path == str(tmp_path / "cnn.safetensors")  # the report names the file found
    assert_trusted_matches_ir(subject, all_nodes=True)
    given = load_subject(tmp_path / "cnn.json", weights=dict(source.weights))
    assert given.weights_used.kind == "given"
    (tmp_path / "cnn.safetensors").unlink()
    with pytest.raises(WeightsMismatchError, match="pass weights="):
        load_subject(tmp_path / "cnn.json")


@pytest.mark.skipif(not HAS_TINYGRAD, reason="tinygrad is an optional extra")
def test_tinygrad_factory_spec() -> None:
    subject = load_subject("tinygrad:tests.debug.test_sources:make_tinygrad_mlp", seed=2)
    assert subject.trusted == "tinygrad" and subject.frontend == "tinygrad"
    assert subject.weights_used.text == "the factory's own weights"
    assert subject.inputs[0].shape == (2, 4) and subject.inputs[0].abs().sum() > 0  # random, not empty
    # the UOps each IR tensor came from, realized: every node output of this MLP lines up
    assert_trusted_matches_ir(subject, all_nodes=True)


def test_refused_sources(tmp_path: Path) -> None:
    with pytest.raises(SubjectError, match="zoo name.*onnx"):
        load_subject(42)
    with pytest.raises(SubjectError, match="no_such_model.*zoo name"):
        load_subject("no_such_model")
    other = tmp_path / "model.txt"
    other.write_text("x")
    with pytest.raises(SubjectError, match=r"model\.txt.*suffix"):
        load_subject(other)
    with pytest.raises(SubjectError, match="subject_from_torch"):
        load_subject(SmallCNN())
    with pytest.raises(SubjectError, match="frontend="):
        load_subject("resnet", frontend="jax")


def test_random_inputs_bound_indices_and_keep_examples() -> None:
    torch.manual_seed(0)
    subject = subject_from_torch(TokenMLP(), (torch.zeros(2, 5, dtype=torch.long), torch.randn(2, 5, 8)))
    ids, _ = random_inputs(subject.ir, seed=0)
    assert int(ids.max()) < 20
    a = random_inputs(subject.ir, seed=5)
    b = random_inputs(subject.ir, seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
