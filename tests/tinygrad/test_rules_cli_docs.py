"""Rule sets one by one (before/after op lists, then numbers), conv parameters, the CLI and the generated docs."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from tinygrad.nn import Conv2d
from tinygrad.tensor import Tensor

import torch_ir
from torch_ir.frontends.tinygrad import import_tinygrad
from torch_ir.frontends.tinygrad.rules import shape_rules, simplify_ir

from ..helpers import assert_outputs_close
from .models import realize_weights

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(1)


def _ops(ir: torch_ir.NPU_IR) -> list[str]:
    return [n.op_type.split(".")[1] for n in ir.nodes]


def _same_numbers(ir_a: torch_ir.NPU_IR, ir_b: torch_ir.NPU_IR, inputs: list[torch.Tensor], weights=None) -> None:
    run = lambda ir: torch_ir.IRExecutor(ir, weights).run(inputs)  # noqa: E731
    assert_outputs_close(run(ir_a), run(ir_b))


def test_shape_chains_collapse():
    def views(x):  # (2, 3, 4): a reshape of a reshape, a permute of a permute, a broadcast operand
        y = x.reshape(6, 4).reshape(2, 12).reshape(2, 3, 4)
        y = y.permute(2, 0, 1).permute(1, 2, 0)
        return y + x[:, :1, :].expand(2, 3, 4)

    x = Tensor(RNG.standard_normal((2, 3, 4)).astype(np.float32))
    literal, _ = import_tinygrad(views, [x], simplify=False)
    simple = simplify_ir(literal, shape_rules())
    assert _ops(simple) == ["slice", "add"]
    assert _ops(literal).count("reshape") >= 3 and "permute" in _ops(literal)
    _same_numbers(literal, simple, [torch.from_numpy(x.numpy())])
    assert_outputs_close(torch_ir.IRExecutor(simple).run([torch.from_numpy(x.numpy())]),
                         [torch.from_numpy(views(x).numpy())])


def test_batched_matmul_and_einsum_layouts():
    def f(a, b):  # (2, 3, 5) @ (2, 5, 4), and a contraction with the batch axis last
        return a @ b, Tensor.einsum("ikb,kjb->ijb", a.permute(1, 2, 0), b.permute(1, 2, 0))

    a = Tensor(RNG.standard_normal((2, 3, 5)).astype(np.float32))
    b = Tensor(RNG.standard_normal((2, 5, 4)).astype(np.float32))
    ir, _ = import_tinygrad(f, [a, b])
    assert ir.op_histogram()["aten.matmul.default"] == 2 and "aten.sum.dim_IntList" not in ir.op_histogram()
    expected = [torch.from_numpy(o.numpy()) for o in f(a, b)]
    assert_outputs_close(torch_ir.IRExecutor(ir).run([torch.from_numpy(a.numpy()), torch.from_numpy(b.numpy())]),
                         expected)


@pytest.mark.parametrize("kwargs", [dict(padding=1), dict(stride=2), dict(padding=2, dilation=2), dict(groups=2)])
def test_conv_layer_is_one_conv2d_with_its_parameters(kwargs):
    conv = realize_weights(Conv2d(4, 6, 3, **kwargs))
    x = Tensor(RNG.standard_normal((2, 4, 9, 9)).astype(np.float32))
    ir, weights = import_tinygrad(conv, [x])
    assert _ops(ir) == ["conv2d"]
    node = ir.nodes[0]
    assert [t.name for t in node.inputs] == ["w_weight", "w_bias"] or node.inputs[1].name == "w_weight"
    for key, value in kwargs.items():
        assert node.attrs[key] == (value if key == "groups" else [value, value])
    actual = torch_ir.IRExecutor(ir, {k: torch.from_numpy(v) for k, v in weights.items()}).run(
        [torch.from_numpy(x.numpy())])
    assert_outputs_close(actual, [torch.from_numpy(conv(x).numpy())])


def test_cli_import_tinygrad_writes_ir_and_weights(tmp_path, capsys):
    from npu_tools.commands.import_tinygrad import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command", required=True))
    out, weights = tmp_path / "mlp.json", tmp_path / "mlp.safetensors"
    args = parser.parse_args(["import-tinygrad", "tests.tinygrad.models:mlp_factory", "-o", str(out),
                              "--weights", str(weights), "--input-names", "x"])
    assert args.func(args) == 0
    ir = torch_ir.load_ir(str(out))
    assert _ops(ir) == ["linear", "relu", "linear"] and ir.graph_inputs[0].name == "x"
    (y,) = torch_ir.IRExecutor(ir, str(weights)).run([torch.ones(3, 4)])
    from .models import mlp_factory

    model, inputs = mlp_factory()
    assert_outputs_close([y], [torch.from_numpy(model(*inputs).numpy())])


def test_cli_names_a_bad_factory():
    from npu_tools.commands.import_tinygrad import load_factory
    from torch_ir.errors import TorchIRError

    with pytest.raises(TorchIRError, match="package.module:factory"):
        load_factory("tests.tinygrad.models")
    with pytest.raises(TorchIRError, match="must return \\(model, example_inputs\\)"):
        load_factory("tests.tinygrad.models:MLP")  # a model, not (model, inputs)


def test_docs_are_generated_and_their_example_runs():
    from torch_ir.frontends.tinygrad.docs import tinygrad_markdown

    text = (ROOT / "docs" / "tinygrad.md").read_text()
    assert text == tinygrad_markdown(), "docs/tinygrad.md is stale: run `torch-ir tinygrad-docs > docs/tinygrad.md`"
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    namespace: dict = {}
    exec(compile(block, "docs/tinygrad.md", "exec"), namespace)  # noqa: S102 - our own docs
    assert _ops(namespace["ir"]) == ["linear", "relu", "linear"]
