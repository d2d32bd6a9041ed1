"""Quantized tensors in the IR: the spec round-trips through save/load and the JSON Schema, every rule it breaks
is one clear error on load, and the reference numerics do what ONNX's formulas say (hand-computed values)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torch_ir.errors import IRValidationError
from torch_ir.executor import IRExecutor
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.ir.serialize import ir_from_dict, ir_to_dict, load_ir, save_ir
from torch_ir.quant import QuantSpec
from torch_ir.quant import numerics as qn

SCHEMA = Path(__file__).resolve().parents[2] / "src" / "torch_ir" / "ir" / "schema.json"


def _weight_only_ir(w_dtype: str = "int4", spec: dict | None = None, w_shape=(8, 256), scale_shape=(8, 2)) -> NPU_IR:
    """x[2,256] · dequantize(w)ᵀ: w of ``w_dtype`` per group of 128 along K, scales a weight tensor."""
    spec = spec or {"dtype": w_dtype, "axis": 1, "group_size": 128, "scale": "w_scale"}
    x = TensorMeta("x", [2, w_shape[1]], "float32")
    w = TensorMeta("w", list(w_shape), w_dtype, quant=QuantSpec.from_dict(spec))
    s = TensorMeta("w_scale", list(scale_shape), "float32")
    wf = TensorMeta("wf", list(w_shape), "float32")
    y = TensorMeta("y", [2, w_shape[0]], "float32")
    deq = OpNode("deq", "DEQUANTIZE", [w, s], [wf], {"dtype": w_dtype, "axis": 1, "group_size": 128})
    mm = OpNode("mm", "GEMM", [x, wf], [y], {})
    return NPU_IR("wq", [x], [y], [w, s], [deq, mm])


def _activation_ir() -> NPU_IR:
    x = TensorMeta("x", [4], "float32")
    q = TensorMeta("q", [4], "uint8", quant=QuantSpec("uint8", scale="s", zero_point="zp"))
    out = TensorMeta("out", [4], "float32")
    s, zp = TensorMeta("s", [], "float32"), TensorMeta("zp", [], "uint8")
    nodes = [OpNode("qz", "QUANTIZE", [x, s, zp], [q], {"dtype": "uint8"}),
             OpNode("dq", "DEQUANTIZE", [q, s, zp], [out], {"dtype": "uint8"})]
    return NPU_IR("act", [x], [out], [], nodes, constants=[s, zp], constant_values={"s": 0.5, "zp": 10})


def test_specs_round_trip_through_save_and_load(tmp_path: Path) -> None:
    for ir in (_weight_only_ir(), _activation_ir()):
        save_ir(ir, tmp_path / "ir.json")
        back = load_ir(tmp_path / "ir.json")
        assert [t.quant for t in back.tensors()] == [t.quant for t in ir.tensors()]
        assert any(t.quant is not None for t in back.tensors())


def test_saved_specs_match_the_json_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    for ir in (_weight_only_ir(), _activation_ir()):
        jsonschema.validate(ir_to_dict(ir), schema)
    doc = ir_to_dict(_weight_only_ir())
    doc["weights"][0]["quant"]["dtype"] = "int7"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def _everywhere(name: str, **fields):
    """An edit of tensor ``name`` at its definition and every use (the file writes it at each)."""
    def edit(doc: dict) -> None:
        tensors = doc["weights"] + [t for n in doc["nodes"] for t in n["inputs"] + n["outputs"]]
        for t in tensors:
            if t["name"] == name:
                t.update(fields)
    return edit


def _load_with(edit) -> None:
    doc = ir_to_dict(_weight_only_ir())
    edit(doc)
    ir_from_dict(json.loads(json.dumps(doc)), source="model.json")


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["weights"][0]["quant"].update(dtype="int7"), ["'int7'", "int8"]),
    (lambda d: d["weights"][0]["quant"].update(group_size=100), ["group_size 100 does not divide", "256"]),
    (lambda d: d["weights"][0]["quant"].update(axis=2), ["axis 2 is out of range", "rank-2"]),
    (lambda d: d["weights"][0]["quant"].update(zero_point=9), ["zero point 9 is outside int4's range [-8, 7]"]),
    (lambda d: d["weights"][0]["quant"].update(scale="nowhere"), ["'nowhere'", "no tensor of the IR"]),
    (lambda d: d["weights"][0]["quant"].update(scale=-0.5, axis=None, group_size=None), ["finite numbers > 0"]),
    (lambda d: d["weights"][0]["quant"].update(method="floor"), ["method 'floor'", "divide"]),
    (lambda d: d["weights"][0]["quant"].update(colour="red"), ["unknown field", "colour"]),
    (_everywhere("w_scale", shape=[8, 3]), ["scale tensor 'w_scale' has shape [8, 3]", "[8, 2]"]),
    (_everywhere("w", dtype="int8"), ["the tensor is int8", "spec says int4"]),
    (lambda d: d["weights"][0]["quant"].update(dtype="float8_e4m3fn", zero_point=0), ["no zero point"]),
])
def test_a_spec_that_does_not_fit_is_one_clear_error(edit, words) -> None:
    with pytest.raises(IRValidationError) as e:
        _load_with(edit)
    message = str(e.value)
    assert "model.json" in message and ("'w'" in message or "weights[0]" in message), message
    for w in words:
        assert w in message, message


def test_a_packed_4_bit_tensor_needs_an_even_last_dim() -> None:
    ir = _weight_only_ir(spec={"dtype": "int4", "scale": 0.1}, w_shape=(8, 255), scale_shape=())
    with pytest.raises(IRValidationError, match="two per byte along the last dim, which must be even"):
        ir_from_dict(ir_to_dict(ir))


def test_a_pre_1_3_planned_width_loads_as_bits() -> None:
    doc = ir_to_dict(_activation_ir())
    doc["graph_inputs"][0]["quant"] = {"bits": 8, "scheme": "symmetric", "from": "default"}
    ir = ir_from_dict(doc)
    assert ir.graph_inputs[0].bits == 8 and ir.graph_inputs[0].quant is None


def test_packed_int4_weights_run_and_a_wrong_storage_is_named() -> None:
    torch.manual_seed(0)
    w = torch.randint(-8, 8, (8, 256), dtype=torch.int8)
    scale = torch.rand(8, 2) / 10 + 0.01
    x = torch.randn(2, 256)
    weights = {"w": qn.pack4(w), "w_scale": scale}
    (y,) = IRExecutor(_weight_only_ir(), weights).run([x])
    expected = x @ (w.float() * scale.repeat_interleave(128, dim=1)).t()  # ONNX's (q - 0) · scale, per group
    torch.testing.assert_close(y, expected)
    with pytest.raises(Exception, match=r"\[8, 128\]"):  # int8 codes where packed bytes belong
        IRExecutor(_weight_only_ir(), {"w": w, "w_scale": scale}).run([x])


def test_quantize_rounds_half_to_even_saturates_and_dequantizes() -> None:
    x = torch.tensor([1.25, 1.75, -1.25, 100.0, -100.0, 0.0])
    q = qn.quantize(x, torch.tensor(0.5), torch.tensor(3), dtype="int8")
    # x / 0.5 = 2.5, 3.5, -2.5, 200, -200, 0 -> round half even 2, 4, -2 -> + 3; saturated at 127 / -128
    assert q.tolist() == [5, 7, 1, 127, -128, 3]
    assert qn.dequantize(q, torch.tensor(0.5), torch.tensor(3), dtype="int8").tolist() == [1.0, 2.0, -1.0, 62.0,
                                                                                            -65.5, 0.0]
    assert qn.quantize(x, torch.tensor(0.5), None, dtype="int8", qmin=-127, qmax=127).tolist()[4] == -127


def test_4_bit_codes_pack_low_nibble_first() -> None:
    codes = torch.tensor([[1, -2, 7, -8]], dtype=torch.int8)
    packed = qn.pack4(codes)
    assert packed.tolist() == [[0xE1, 0x87]]  # ONNX: first element in the low nibble
    assert torch.equal(qn.unpack4(packed, signed=True), codes)
    assert qn.unpack4(torch.tensor([[0xE1]], dtype=torch.uint8), signed=False).tolist() == [[1, 14]]


def test_a_dequantize_that_says_another_granularity_than_its_tensor_is_refused() -> None:
    doc = ir_to_dict(_weight_only_ir())
    doc["nodes"][0]["attrs"]["group_size"] = 64  # the spec says 128: one of the two would be silently wrong
    with pytest.raises(IRValidationError, match=r"DEQUANTIZE says group_size=64 of tensor 'w'.*spec says 128"):
        ir_from_dict(doc, source="model.json")


@pytest.mark.parametrize("scale, group, words", [
    (torch.rand(8, 2), 10 ** 9, "needs a group size that divides 256"),  # would size a repeat from the file
    (torch.rand(8, 3), 128, "needs [8, 2], got shape [8, 3]"),
    (torch.rand(7), None, "needs 256 values, got shape [7]"),
])
def test_a_scale_that_does_not_fit_is_refused_before_anything_is_sized(scale, group, words) -> None:
    q = torch.zeros(8, 256, dtype=torch.int8)
    with pytest.raises(ValueError) as e:
        qn.dequantize(q, scale, None, dtype="int8", axis=1, group_size=group)
    assert words in str(e.value)
