"""Provenance: every node and dispatch says which extracted nodes it computes, the module path, the frontend step
and the rewrite rules that made it, and keeps saying it through the rewrite engine, normalize, lowering and both
file formats. ``torch-ir bisect`` names faults with it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import npu_compiler
import torch_ir
from npu_compiler.passes import NormalizeOptions, normalize
from npu_program.npubin import NpubinError, decode_npubin, encode_npubin
from torch_ir.errors import IRValidationError
from torch_ir.ir import ir_from_dict, ir_to_dict, provenance_of
from torch_ir.rewrite import rewrite


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.act = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.proj(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x)) + 1.0


@pytest.fixture(scope="module")
def ir() -> torch_ir.NPU_IR:
    with torch.device("meta"):
        model = Net()
    return torch_ir.extract_ir(model, (torch.empty(2, 8, device="meta"),), model_name="net")


def test_extracted_nodes_are_their_own_source_with_module_path(ir):
    by_name = {n.name: n.provenance for n in ir.nodes}
    assert by_name["linear"].nodes == ["linear"] and by_name["linear"].module == "block.proj"
    assert by_name["relu"].module == "block.act" and by_name["relu"].origin == "torch.export"
    assert by_name["add"].module is None  # computed in the model's own forward
    assert all(p.rules == [] for p in by_name.values())


def test_a_fused_node_lists_every_source_node_the_common_module_and_the_rules(ir):
    fused = normalize(ir)
    gemm = next(n for n in fused.nodes if n.op_type == "GEMM" and "relu" in n.name)
    p = gemm.provenance
    assert sorted(p.nodes) == ["linear", "relu"]
    assert p.module == "block"  # block.proj and block.act
    assert p.rules[-1] == "gemm_activation" and p.origin == "torch.export"
    # the input IR is untouched
    assert next(n for n in ir.nodes if n.name == "relu").provenance.rules == []


def test_rewrite_logs_each_application_and_stops_at_the_limit(ir):
    from npu_compiler.passes.pipeline import STAGES

    rules = dict(STAGES)["canonicalize"]
    whole = rewrite(ir, rules)
    assert len(whole.log) == sum(whole.applied.values()) >= 2
    first = rewrite(ir, rules, limit=1)
    assert first.log == whole.log[:1]
    assert sum(first.applied.values()) == 1
    assert rewrite(ir, rules, limit=0).ir.nodes == ir.nodes


def test_normalize_stop_after_gives_the_ir_part_way(ir):
    full = normalize(ir)
    assert normalize(ir, NormalizeOptions(stop_after=("late_fuse", None))).nodes == full.nodes
    part = normalize(ir, NormalizeOptions(stop_after=("fuse", 0)))
    stages = part.metadata["normalize"]["stages"]
    assert [s["stage"] for s in stages] == ["cleanup", "canonicalize", "fuse"]
    assert stages[-1]["log"] == [] and stages[1]["log"]
    with pytest.raises(ValueError, match="unknown stage 'fusion'.*cleanup, canonicalize, fuse, late_fuse"):
        NormalizeOptions(stop_after=("fusion", None))


def test_the_ir_file_keeps_provenance_and_refuses_a_malformed_one(ir, tmp_path):
    fused = normalize(ir)
    path = tmp_path / "ir.json"
    fused.save(path)
    assert [n.provenance for n in torch_ir.load_ir(path).nodes] == [n.provenance for n in fused.nodes]
    doc = ir_to_dict(fused)
    doc["nodes"][0]["provenance"] = {"nodes": "linear"}
    with pytest.raises(IRValidationError, match=r"nodes\[0\]\.provenance\.nodes: expected a list of strings"):
        ir_from_dict(doc)
    doc["nodes"][0]["provenance"] = {"nodes": [], "eval": "os.system"}
    with pytest.raises(IRValidationError, match=r"unknown keys \['eval'\]"):
        ir_from_dict(doc)


def test_a_node_without_provenance_is_its_own_source(ir):
    doc = ir_to_dict(ir)
    for node in doc["nodes"]:
        del node["provenance"]
    old = ir_from_dict(json.loads(json.dumps(doc)))
    assert provenance_of(old.nodes[0]).nodes == [old.nodes[0].name]


def test_dispatches_carry_their_node_provenance_through_the_npubin(ir):
    program = npu_compiler.compile(ir)
    loaded = decode_npubin(encode_npubin(program))
    gemms = [d for d in loaded.dispatches if d.kernel == "GEMM"]
    assert {d.provenance.module for d in gemms} == {"block", "head"}
    assert all(d.provenance.rules for d in gemms)
    assert loaded.dispatches == program.dispatches


def test_a_program_with_a_malformed_provenance_is_refused(ir):
    program = npu_compiler.compile(ir)
    program.dispatches[0].provenance = {"nodes": 7}  # what a hostile file can hold: written as it is
    with pytest.raises(NpubinError, match=r"dispatches\[0\]\.provenance"):
        decode_npubin(encode_npubin(program))


def test_onnx_and_tinygrad_nodes_name_their_converter_or_mapping():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from torch_ir.frontends.onnx import import_onnx

    graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["y"], name="/act/Sigmoid")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ir, _ = import_onnx(model)
    (p,) = [n.provenance for n in ir.nodes]
    assert p.module == "/act/Sigmoid"
    assert p.origin == "onnx:Sigmoid torch_ir.frontends.onnx.converters.elementwise.Sigmoid"

    pytest.importorskip("tinygrad")
    from tinygrad import Tensor

    from torch_ir.frontends.tinygrad import import_tinygrad_traced

    x = Tensor(np.ones((2, 3), dtype=np.float32))
    ir, _, uops = import_tinygrad_traced(lambda t: (t * 2.0).exp2(), [x])
    origins = {n.provenance.origin for n in ir.nodes}
    assert {"tinygrad:MUL", "tinygrad:EXP2"} <= origins
    out = ir.graph_outputs[0].name
    np.testing.assert_allclose(Tensor(uops[out]).numpy(), np.exp2(2.0 * np.ones((2, 3))), rtol=1e-6)
