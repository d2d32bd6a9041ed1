"""The rewrite engine: patterns, shared inputs, checks that reject with a reason, splicing, dead code."""

from __future__ import annotations

import dataclasses

import torch

import torch_ir
from npu_compiler.passes import Op, Rule, Var, eliminate_dead_code, select
from torch_ir.rewrite import rewrite

from .helpers import assert_outputs_close

RELU = "aten.relu.default"
MUL = "aten.mul.Tensor"


def _relu_of_relu() -> Rule:
    return Rule("relu_of_relu", "cleanup", Op(RELU, Op(RELU, Var("x"))),
                replace=lambda m: [dataclasses.replace(m.node(), inputs=[m["x"]])], doc="relu(relu(x)) -> relu(x)")


def _square() -> Rule:
    def replace(m):
        root = m.node()
        return [dataclasses.replace(root, op_type="aten.pow.Tensor_Scalar", inputs=[m["x"]], attrs={"exponent": 2})]

    return Rule("mul_self_to_square", "canonical", Op(MUL, Var("x"), Var("x")), replace=replace)


class Chain(torch.nn.Module):
    def forward(self, x, y):
        a = torch.relu(torch.relu(x))
        return a * a + y * x, torch.relu(torch.relu(y)).exp()


def _ir():
    return torch_ir.extract_ir(Chain(), (torch.randn(3), torch.randn(3)))


def _ops(ir):
    return [n.op_type.split(".")[1] for n in ir.nodes]


def test_before_and_after_op_lists_and_numerics():
    ir = _ir()
    assert _ops(ir) == ["relu", "relu", "mul", "mul", "add", "relu", "relu", "exp"]
    result = rewrite(ir, [_relu_of_relu(), _square()])
    assert _ops(result.ir) == ["relu", "pow", "mul", "add", "relu", "exp"]
    assert result.applied == {"relu_of_relu": 2, "mul_self_to_square": 1}
    x, y = torch.randn(3), torch.randn(3)
    assert_outputs_close(torch_ir.IRExecutor(result.ir).run([x, y]), torch_ir.IRExecutor(ir).run([x, y]))
    assert _ops(ir) == ["relu", "relu", "mul", "mul", "add", "relu", "relu", "exp"]  # the input IR is untouched


def test_shared_input_must_bind_the_same_tensor():
    result = rewrite(_ir(), [_square()])
    squared = [n for n in result.ir.nodes if n.op_type == "aten.pow.Tensor_Scalar"]
    assert len(squared) == 1  # y * x is not a square


def test_check_rejects_with_a_reason_and_interior_reads_are_respected():
    never = dataclasses.replace(_relu_of_relu(), check=lambda m: "the NPU has no relu")
    result = rewrite(_ir(), [never])
    assert not result.changed
    assert ("relu_of_relu", "relu_1", "the NPU has no relu") in result.rejected

    class Reused(torch.nn.Module):
        def forward(self, x):
            inner = torch.relu(x)
            return torch.relu(inner) + inner

    result = rewrite(torch_ir.extract_ir(Reused(), (torch.randn(3),)), [_relu_of_relu()])
    assert not result.changed
    assert "also read outside the pattern" in result.rejected[0][2]


def test_families_and_dead_code():
    rules = [_relu_of_relu(), _square()]
    assert [r.name for r in select(rules, ["canonical"])] == ["mul_self_to_square"]
    assert [r.name for r in select(rules, disabled=["mul_self_to_square"])] == ["relu_of_relu"]

    class Dead(torch.nn.Module):
        def forward(self, x):
            torch.sin(x)  # noqa: B018 - computed and dropped
            return x.cos()

    ir = torch_ir.extract_ir(Dead(), (torch.randn(3),))
    assert _ops(ir) == ["sin", "cos"]  # export keeps the unused op
    assert _ops(eliminate_dead_code(ir)) == ["cos"]
