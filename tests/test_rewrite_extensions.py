"""What the tinygrad rules needed from the rewrite engine: aliases, shared view interiors, producers, long sweeps.

(These test ``torch_ir.rewrite`` itself, on IRs built by hand; they live here because the
tinygrad frontend is what asked for them.)
"""

from __future__ import annotations

import dataclasses

import torch

import torch_ir
from npu_compiler.passes import Op, Rule, Var
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.rewrite import rewrite

from .helpers import assert_outputs_close

RESHAPE, RELU = "aten.reshape.default", "aten.relu.default"


def _t(name: str, shape: list[int]) -> TensorMeta:
    return TensorMeta(name, shape, "float32")


def _reshape(name: str, x: TensorMeta, shape: list[int]) -> OpNode:
    return OpNode(name, RESHAPE, [x], [_t(name, shape)], {"shape": shape})


def _chain_ir() -> NPU_IR:
    """x (2, 3) -> r1 (6,) -> r2 (2, 3) -> relu; r1 is also read by a second relu."""
    x = _t("x", [2, 3])
    r1 = _reshape("r1", x, [6])
    r2 = _reshape("r2", r1.outputs[0], [2, 3])
    a = OpNode("a", RELU, [r2.outputs[0]], [_t("a", [2, 3])])
    b = OpNode("b", RELU, [r1.outputs[0]], [_t("b", [6])])
    return NPU_IR("chain", [x], [a.outputs[0], b.outputs[0]], [], [r1, r2, a, b])


def _merge(shared: bool) -> Rule:
    def replace(m):
        x, root = m["x"], m.node()
        if x.shape == root.outputs[0].shape:
            return x  # an identity: users read x instead
        return [dataclasses.replace(root, inputs=[x])]

    return Rule("reshape_of_reshape", "shape", Op(RESHAPE, Op(RESHAPE, Var("x"))), replace, shared_interior=shared)


def test_alias_replacement_and_shared_interior():
    ir = _chain_ir()
    assert not rewrite(ir, [_merge(shared=False)]).changed  # r1 is read elsewhere: rejected with a reason
    result = rewrite(ir, [_merge(shared=True)])
    assert [n.name for n in result.ir.nodes] == ["r1", "a", "b"]  # r2 became an alias of x; r1 stays for b
    assert result.ir.node("a").inputs[0].name == "x"
    x = torch.randn(2, 3)
    assert_outputs_close(torch_ir.IRExecutor(result.ir).run([x]), torch_ir.IRExecutor(ir).run([x]))


def test_alias_of_a_graph_output_is_refused():
    x = _t("x", [2, 3])
    r1 = _reshape("r1", x, [6])
    r2 = _reshape("r2", r1.outputs[0], [2, 3])
    ir = NPU_IR("out", [x], [r2.outputs[0]], [], [r1, r2])
    result = rewrite(ir, [_merge(shared=True)])
    assert not result.changed and "graph output" in result.rejected[0][2]


def test_producer_lookup_and_one_sweep_for_many_matches():
    x = _t("x", [4])
    nodes, prev = [], x
    for i in range(200):  # relu(relu(...)): 199 rewrites
        nodes.append(OpNode(f"r{i}", RELU, [prev], [_t(f"r{i}", [4])]))
        prev = nodes[-1].outputs[0]
    ir = NPU_IR("deep", [x], [prev], [], nodes)
    seen = []

    def replace(m):
        seen.append(m.producer(m["x"]) is None or m.producer(m["x"]).op_type == RELU)
        return [dataclasses.replace(m.node(), inputs=[m["x"]])]

    rule = Rule("relu_of_relu", "cleanup", Op(RELU, Op(RELU, Var("x"))), replace)
    result = rewrite(ir, [rule], max_rounds=3)  # one sweep goes on after each rewrite
    assert len(result.ir.nodes) == 1 and all(seen) and result.applied["relu_of_relu"] == 199
