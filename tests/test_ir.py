"""The IR format: round trip, JSON Schema, the validator's messages, atomic saves."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_ir
from torch_ir.ir import IRValidationError, ir_from_dict, ir_to_dict
from torch_ir.ir.core import NPU_IR, OpNode, TensorMeta

SCHEMA = json.loads((Path(torch_ir.__file__).parent / "ir" / "schema.json").read_text())


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.ln = torch.nn.LayerNorm(8)

    def forward(self, x, y):
        h = torch.cat([self.fc(x), y], dim=0)
        return self.ln(h).relu(), h.max(dim=-1)


@pytest.fixture(scope="module")
def small_ir() -> NPU_IR:
    with torch.device("meta"):
        model = Small()
    return torch_ir.extract_ir(model, (torch.randn(2, 8), torch.randn(3, 8)), model_name="small")


def test_round_trip_is_lossless(small_ir, tmp_path):
    path = tmp_path / "ir.json"
    small_ir.save(path)
    loaded = torch_ir.load_ir(path)
    assert ir_to_dict(loaded) == ir_to_dict(small_ir)
    assert str(loaded) == str(small_ir)


def test_saved_file_matches_json_schema(small_ir, tmp_path):
    path = tmp_path / "ir.json"
    small_ir.save(path)
    jsonschema.validate(json.loads(path.read_text()), SCHEMA)


def test_schema_rejects_what_the_validator_rejects(small_ir):
    doc = ir_to_dict(small_ir)
    doc["nodes"][0]["inputs"][0]["shape"] = ["x", 1.5]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)
    with pytest.raises(IRValidationError, match=r"nodes\[0\]\.inputs\[0\]\.shape: expected list of int or str"):
        ir_from_dict(doc)


def test_text_form_has_one_node_a_line(small_ir):
    text = str(small_ir)
    for node in small_ir.nodes:
        assert sum(line.strip().startswith(f"{node.name}:") for line in text.splitlines()) == 1
    assert "aten.linear.default(%x, %p_fc_weight, %p_fc_bias)" in text


# -- property test: any well-formed IR survives the round trip -------------------------------------

names = st.text("abcdefgh_", min_size=1, max_size=6)
dims = st.one_of(st.integers(0, 64), st.sampled_from(["s0", "s1", "2*s0"]))
attr_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=5), st.just({"dtype": "float16"}), st.just({"float": "inf"}), st.just({"sym": "s0"})),
    lambda inner: st.lists(inner, max_size=3), max_leaves=6,
)


@st.composite
def irs(draw) -> NPU_IR:
    n_nodes = draw(st.integers(0, 5))
    inp = TensorMeta("in0", draw(st.lists(dims, max_size=4)), "float32", role="input")
    weight = TensorMeta("w0", draw(st.lists(st.integers(0, 8), max_size=3)), "bfloat16", role="weight")
    defined, nodes = [inp, weight], []
    for i in range(n_nodes):
        ins = draw(st.lists(st.sampled_from(defined), min_size=1, max_size=3))
        out = TensorMeta(f"t{i}", draw(st.lists(dims, max_size=4)), draw(st.sampled_from(["float32", "int64", "bool"])),
                         layout=draw(st.none() | st.just("NCHW")), bits=draw(st.none() | st.just(8)))
        attrs = draw(st.dictionaries(names, attr_values, max_size=3))
        nodes.append(OpNode(f"n{i}", draw(st.sampled_from(["aten.add.Tensor", "npu.GEMM"])), list(ins), [out], attrs))
        defined.append(out)
    return NPU_IR("prop", [inp], [defined[-1]], [weight], nodes, weight_name_mapping={"w0": "layer.w"},
                  symbols={"s0": {"min": 2, "max": None}}, producer={"name": "test"})


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(irs())
def test_round_trip_property(ir):
    doc = json.loads(json.dumps(ir_to_dict(ir)))
    jsonschema.validate(doc, SCHEMA)
    assert ir_to_dict(ir_from_dict(doc)) == ir_to_dict(ir)


# -- bad files -------------------------------------------------------------------------------------

def test_truncated_json_names_file_and_position(small_ir, tmp_path):
    path = tmp_path / "ir.json"
    small_ir.save(path)
    path.write_text(path.read_text()[:-40])
    with pytest.raises(IRValidationError, match=r"ir\.json: not valid JSON \(line 1, column \d+"):
        torch_ir.load_ir(path)


def test_binary_garbage_is_refused(tmp_path):
    path = tmp_path / "ir.json"
    path.write_bytes(b"\x89PNG\x00\xff\xfe")
    with pytest.raises(IRValidationError, match="ir.json"):
        torch_ir.load_ir(path)


def test_wrong_ir_version(small_ir, tmp_path):
    doc = ir_to_dict(small_ir)
    doc["ir_version"] = "7.0"
    path = tmp_path / "ir.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(IRValidationError, match=r"ir_version: version '7.0' is not supported .*re-extract"):
        torch_ir.load_ir(path)


def test_undefined_tensor_is_named_with_its_node(small_ir):
    doc = ir_to_dict(small_ir)
    doc["nodes"][2]["inputs"][0]["name"] = "ghost"
    expected = r"nodes\[2\]\.inputs\[0\]: tensor 'ghost' is used before it is defined"
    with pytest.raises(IRValidationError, match=expected):
        ir_from_dict(doc)


def test_use_before_definition(small_ir):
    doc = ir_to_dict(small_ir)
    doc["nodes"][0], doc["nodes"][1] = doc["nodes"][1], doc["nodes"][0]
    with pytest.raises(IRValidationError, match="used before it is defined"):
        ir_from_dict(doc)


def test_inconsistent_shape_is_caught(small_ir):
    doc = ir_to_dict(small_ir)
    doc["nodes"][1]["inputs"][0]["shape"] = [99]
    with pytest.raises(IRValidationError, match=r"was defined as float32\[2, 8\]"):
        ir_from_dict(doc)


def test_duplicate_and_missing_outputs(small_ir):
    doc = ir_to_dict(small_ir)
    doc["nodes"][1]["outputs"][0]["name"] = doc["nodes"][0]["outputs"][0]["name"]
    with pytest.raises(IRValidationError, match="defined twice"):
        ir_from_dict(doc)
    doc = ir_to_dict(small_ir)
    doc["graph_outputs"][0]["name"] = "nowhere"
    with pytest.raises(IRValidationError, match=r"graph_outputs\[0\]: output 'nowhere' is never produced"):
        ir_from_dict(doc)


def test_undeclared_weight_mapping(small_ir):
    doc = ir_to_dict(small_ir)
    doc["weight_name_mapping"]["p_nope"] = "nope.weight"
    with pytest.raises(IRValidationError, match="not a declared weight or constant"):
        ir_from_dict(doc)


def test_save_into_missing_directory(small_ir, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; create it first"):
        small_ir.save(tmp_path / "no" / "such" / "ir.json")
    assert not (tmp_path / "no").exists()


def test_interrupted_save_leaves_old_file_and_no_partial(small_ir, tmp_path, monkeypatch):
    path = tmp_path / "ir.json"
    path.write_text("previous")

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        small_ir.save(path)
    assert path.read_text() == "previous"
    assert os.listdir(tmp_path) == ["ir.json"]


def test_saving_an_invalid_ir_writes_nothing(small_ir, tmp_path):
    broken = ir_from_dict(ir_to_dict(small_ir))
    # a new object: the loaded output is the very TensorMeta its node defines, so renaming it in place would
    # rename the value everywhere and leave the IR valid
    broken.graph_outputs[0] = dataclasses.replace(broken.graph_outputs[0], name="missing")
    with pytest.raises(IRValidationError):
        broken.save(tmp_path / "ir.json")
    assert not (tmp_path / "ir.json").exists()
