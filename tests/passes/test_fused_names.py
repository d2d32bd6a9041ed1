"""Fused nodes are named after what they compute (``passes/build.py``): ``conv_bn_relu``, ``gemm_relu``, never
after the last node they replaced (a profile once showed "GEMM node relu"). Unique, deterministic, numbered
per op, and a node keeps its number as more is fused into it."""

from __future__ import annotations

import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.passes import normalize
from npu_compiler.passes.build import npu_node_name
from npu_tools.zoo import get_model
from torch_ir.ir import check_integrity

from ..helpers import build_pair


class Block(nn.Module):
    """conv-bn-relu, conv-bn (+ residual, relu), then linear-relu and a plain linear."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.c2, self.b2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + y)
        return self.fc2(torch.relu(self.fc1(y.mean((2, 3)))))


def _ir() -> torch_ir.NPU_IR:
    meta, _ = build_pair(Block)
    return torch_ir.extract_ir(meta, (torch.randn(1, 3, 8, 8, device="meta"),), model_name="block")


def _npu_nodes(ir: torch_ir.NPU_IR) -> list[tuple[str, str]]:
    return [(n.op_type, n.name) for n in ir.nodes if n.op_type.isupper()]


def test_fused_nodes_read_as_what_they_compute():
    npu = normalize(_ir())
    # the second conv is CONV #1 (conv_1), batch norm folded: conv_bn_1; its relu follows the residual add
    assert _npu_nodes(npu) == [("CONV", "conv_bn_relu"), ("CONV", "conv_bn_1"), ("GEMM", "gemm_relu"),
                               ("GEMM", "gemm_1")]
    for node in npu.nodes:
        if node.op_type.isupper():  # the name says what the node's attributes say it computes
            assert node.name.rstrip("0123456789").rstrip("_") == npu_node_name(node.op_type, node.attrs)
    # outputs keep their tensor names: users and graph outputs need no renaming
    assert [n.outputs[0].name for n in npu.nodes if n.op_type.isupper()] == ["relu", "batch_norm_1", "relu_2",
                                                                               "linear_1"]


def test_names_are_unique_and_deterministic():
    first, second = normalize(_ir()), normalize(_ir())
    assert [n.name for n in first.nodes] == [n.name for n in second.nodes]
    check_integrity(first)  # unique node names among the rest
    meta, _ = build_pair(lambda: nn.Sequential(*[nn.Linear(4, 4) for _ in range(12)]))
    many = normalize(torch_ir.extract_ir(meta, (torch.randn(2, 4, device="meta"),)))
    assert [n.name for n in many.nodes] == ["gemm"] + [f"gemm_{i}" for i in range(1, 12)]


def test_llm_ops_are_named_by_op():
    entry = get_model("llama")
    args, kwargs = entry.example_inputs()
    npu = normalize(torch_ir.extract_ir(entry.build(), args, example_kwargs=kwargs))
    names = [name for _, name in _npu_nodes(npu)]
    assert len(names) == len(set(names))
    for op, name in _npu_nodes(npu):
        assert name == op.lower() or name.startswith(op.lower() + "_"), (op, name)
    assert {"embedding", "rms_norm", "qkv_proj", "rope_qk", "rope_qk_1", "attention", "attention_1", "gate_up",
            "gate_up_1"} <= set(names)


def test_a_profile_names_dispatches_by_what_they_compute():
    program = npu_compiler.compile(_ir())
    by_node = {d.node: d.kernel for d in program.dispatches}
    assert by_node["conv_bn_relu"] == "CONV" and by_node["gemm_relu"] == "GEMM" and by_node["gemm_1"] == "GEMM"
    assert "relu" not in by_node  # no dispatch named after a node it merely absorbed
