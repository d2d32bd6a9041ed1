"""ONNX's quantized ops import as the NPU's quantized ops, with their specs, and compute what onnxruntime does.

Integer results are compared bit-exactly with onnxruntime on the same model; float results (DequantizeLinear's,
MatMulNBits') at float32 rounding. Unsupported combinations are one error naming the node and the rule.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from tests.ort_oracle import skip_if_u8s8_saturates
from torch_ir import IRExecutor
from torch_ir.errors import UnsupportedOpError
from torch_ir.frontends.onnx import backend, import_onnx
from torch_ir.frontends.onnx.dtypes import to_torch
from torch_ir.ops.npu import NPU_OPS
from torch_ir.quant import QuantSpec
from torch_ir.quant.numerics import unpack4

ort = pytest.importorskip("onnxruntime")
TP = onnx.TensorProto

QUANT_OPS = {"QuantizeLinear": "QUANTIZE", "DequantizeLinear": "DEQUANTIZE", "QLinearConv": "QCONV",
             "QLinearMatMul": "QGEMM", "ConvInteger": "QCONV", "MatMulInteger": "QGEMM",
             "DynamicQuantizeLinear": "QUANTIZE"}
_NO_TORCH_TYPE = ("int2", "uint2", "float4e2m1")  # ONNX types the IR has no form of (backend_xfail.txt)


def _model(nodes: list, inputs: list, outputs: list, inits: list = (), opset: int = 21,
           ms: bool = False) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _ours(model: onnx.ModelProto, feeds: dict) -> tuple[list[torch.Tensor], object, dict]:
    ir, weights = import_onnx(model, reference_fallback=False)
    tensors = [to_torch(feeds[t.name], t.dtype) for t in ir.graph_inputs]
    return IRExecutor(ir, weights, check_shapes=True).run(tensors), ir, weights


def _vi(name: str, elem: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


@pytest.mark.parametrize("case", [c for c in backend.list_cases() if c.op in QUANT_OPS and c.plain
                                  and not any(t in c.name for t in _NO_TORCH_TYPE)], ids=lambda c: c.name)
def test_backend_case_becomes_npu_ops(case: backend.Case) -> None:
    """Every backend case of these ops imports as NPU ops (no ONNX op kept) and gives ONNX's result."""
    model, inputs, expected = backend.load_data(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actual = backend.run_ours(model, inputs, reference_fallback=False)
    assert backend.compare(actual, expected) is None
    ir, _ = import_onnx(model, reference_fallback=False)
    assert QUANT_OPS[case.op] in {n.op_type for n in ir.nodes}
    for node in (n for n in ir.nodes if n.op_type in NPU_OPS):  # the IR's shapes are the ops' own rules'
        assert NPU_OPS[node.op_type].shape(node.inputs, node.attrs) == [node.outputs[0].shape], node


def test_qdq_weight_spec_names_its_scale_and_zero_point() -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.integers(-128, 128, (8, 4, 3, 3), dtype=np.int8), "w")
    scale = numpy_helper.from_array(rng.uniform(0.01, 0.1, 8).astype(np.float32), "w_scale")
    zp = numpy_helper.from_array(np.zeros(8, np.int8), "w_zp")
    xs, xz = numpy_helper.from_array(np.float32(0.05), "x_scale"), numpy_helper.from_array(np.uint8(128), "x_zp")
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zp"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1])]
    model = _model(nodes, [_vi("x", TP.FLOAT, [1, 4, 6, 6])], [_vi("y", TP.FLOAT, [1, 8, 6, 6])],
                   [w, scale, zp, xs, xz])
    ir, weights = import_onnx(model, reference_fallback=False)
    by_name = {t.name: t for t in ir.tensors()}
    assert by_name["w"].quant == QuantSpec("int8", scale="w_scale", zero_point="w_zp", axis=0)
    assert by_name["xq"].quant == QuantSpec("uint8", scale="x_scale", zero_point="x_zp")
    assert [n.op_type for n in ir.nodes] == ["QUANTIZE", "DEQUANTIZE", "DEQUANTIZE", "aten.convolution.default"]
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    (y,) = IRExecutor(ir, weights).run([torch.from_numpy(x)])
    torch.testing.assert_close(y, torch.from_numpy(_ort(model, {"x": x})[0]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("rows", [16, 256])  # 256 x 512: a weight read from raw bytes, never unpacked
def test_int4_initializer_loads_packed_and_dequantizes_blocked(signed: bool, rows: int) -> None:
    rng = np.random.default_rng(1)
    lo, hi, t4 = (-8, 8, ml_dtypes.int4) if signed else (0, 16, ml_dtypes.uint4)
    codes = rng.integers(lo, hi, (rows, 512)).astype(t4)
    w = numpy_helper.from_array(codes, "w")
    scale = numpy_helper.from_array(rng.uniform(0.01, 0.1, (rows, 16)).astype(np.float32), "s")
    zp = numpy_helper.from_array(rng.integers(lo, hi, (rows, 16)).astype(t4), "z")
    node = helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"], axis=1, block_size=32)
    model = _model([node], [], [_vi("y", TP.FLOAT, [rows, 512])], [w, scale, zp])
    ir, weights = import_onnx(model, reference_fallback=False)
    meta = next(t for t in ir.weights if t.name == "w")
    assert meta.dtype == ("int4" if signed else "uint4") and meta.shape == [rows, 512]
    assert weights["w"].dtype == torch.uint8 and list(weights["w"].shape) == [rows, 256]
    assert torch.equal(unpack4(weights["w"], signed), torch.from_numpy(codes.astype(np.int8 if signed else np.uint8)))
    assert meta.quant == QuantSpec(meta.dtype, scale="s", zero_point=meta.quant.zero_point, axis=1, group_size=32)
    (y,) = IRExecutor(ir, weights).run([])
    assert torch.equal(y, torch.from_numpy(_ort(model, {})[0]))


def test_float8_initializer_loads_as_torch_float8() -> None:
    values = np.array([[0.5, -2.0, 448.0, 0.0]], dtype=ml_dtypes.float8_e4m3fn)
    w, s = numpy_helper.from_array(values, "w"), numpy_helper.from_array(np.float32(0.25), "s")
    model = _model([helper.make_node("DequantizeLinear", ["w", "s"], ["y"])], [], [_vi("y", TP.FLOAT, [1, 4])],
                   [w, s])
    ir, weights = import_onnx(model, reference_fallback=False)
    assert weights["w"].dtype == torch.float8_e4m3fn
    (y,) = IRExecutor(ir, weights).run([])
    assert torch.equal(y, torch.tensor([[0.125, -0.5, 112.0, 0.0]]))


def test_qlinearconv_asymmetric_padding_per_channel_matches_onnxruntime() -> None:
    skip_if_u8s8_saturates()
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(v, n) for n, v in (
        ("xs", np.float32(0.02)), ("xz", np.uint8(120)), ("w", rng.integers(-127, 128, (6, 3, 3, 3), dtype=np.int8)),
        ("ws", rng.uniform(0.005, 0.02, 6).astype(np.float32)), ("wz", np.zeros(6, np.int8)),
        ("ys", np.float32(0.1)), ("yz", np.uint8(100)), ("b", rng.integers(-2000, 2000, 6, dtype=np.int32)))]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            auto_pad="SAME_UPPER", strides=[2, 2])
    model = _model([node], [_vi("x", TP.UINT8, [1, 3, 8, 8])], [_vi("y", TP.UINT8, [1, 6, 4, 4])], inits)
    x = rng.integers(0, 256, (1, 3, 8, 8), dtype=np.uint8)
    (y,), ir, _ = _ours(model, {"x": x})
    assert torch.equal(y, torch.from_numpy(_ort(model, {"x": x})[0]))
    assert ir.graph_outputs[0].quant == QuantSpec("uint8", scale="ys", zero_point="yz")


def test_integer_ops_match_onnxruntime() -> None:
    """ConvInteger (no zero point for w: zeros) and MatMulInteger with a per-column b zero point: int32, exact."""
    skip_if_u8s8_saturates()
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.integers(0, 256, (4, 2, 3, 3), dtype=np.uint8), "w")
    b = numpy_helper.from_array(rng.integers(-128, 128, (16, 5), dtype=np.int8), "b")
    bz = numpy_helper.from_array(rng.integers(-5, 5, 5, dtype=np.int8), "bz")
    az = numpy_helper.from_array(np.uint8(3), "az")
    nodes = [helper.make_node("ConvInteger", ["x", "w", "az"], ["c"], pads=[1, 0, 1, 0]),
             helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["m"])]
    model = _model(nodes, [_vi("x", TP.UINT8, [1, 2, 5, 5]), _vi("a", TP.UINT8, [2, 3, 16])],
                   [_vi("c", TP.INT32, [1, 4, 5, 3]), _vi("m", TP.INT32, [2, 3, 5])], [w, b, bz, az])
    feeds = {"x": rng.integers(0, 256, (1, 2, 5, 5), dtype=np.uint8), "a": rng.integers(0, 256, (2, 3, 16),
                                                                                         dtype=np.uint8)}
    ours, ir, _ = _ours(model, feeds)
    assert [n.op_type for n in ir.nodes if n.op_type.isupper()] == ["QCONV", "QGEMM"]
    for a, e in zip(ours, _ort(model, feeds)):
        assert torch.equal(a, torch.from_numpy(e))


def test_dynamic_quantize_of_zeros_matches_onnxruntime() -> None:
    model = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])],
                   [_vi("x", TP.FLOAT, [2, 3])], [_vi("y", TP.UINT8, [2, 3]), _vi("s", TP.FLOAT, []),
                                                  _vi("z", TP.UINT8, [])])
    for x in (np.zeros((2, 3), np.float32), np.array([[-1.5, 0.25, 3], [7, -0.01, 2]], np.float32)):
        ours, ir, _ = _ours(model, {"x": x})
        for a, e in zip(ours, _ort(model, {"x": x})):
            assert torch.equal(a, torch.from_numpy(np.asarray(e)))
    assert ir.graph_outputs[0].quant == QuantSpec("uint8", scale="s", zero_point="z")


def _nbits_model(n: int, k: int, block: int, zero_points: bool, rng: np.random.Generator) -> onnx.ModelProto:
    blocks = k // block
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8).reshape(n, blocks, block // 2)
    inits = [numpy_helper.from_array(packed, "B"),
             numpy_helper.from_array(rng.uniform(0.01, 0.1, n * blocks).astype(np.float32), "scales"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    ins = ["A", "B", "scales", "", "", "bias"]
    if zero_points:
        z = rng.integers(0, 16, (n, blocks), dtype=np.uint8)
        inits.append(numpy_helper.from_array((z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8).reshape(-1), "zp"))
        ins[3] = "zp"
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=block)
    return _model([node], [_vi("A", TP.FLOAT, [2, 3, k])], [_vi("Y", TP.FLOAT, [2, 3, n])], inits, ms=True)


@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize(("n", "k"), [(24, 128), (264, 512)])  # B of 67584 bytes: a weight of the file, retyped
def test_matmulnbits_becomes_dqgemm_and_matches_onnxruntime(zero_points: bool, n: int, k: int) -> None:
    rng = np.random.default_rng(4)
    model = _nbits_model(n, k, 32, zero_points, rng)
    a = rng.standard_normal((2, 3, k)).astype(np.float32)
    (y,), ir, weights = _ours(model, {"A": a})
    dq = next(n for n in ir.nodes if n.op_type == "DQGEMM")
    assert dq.inputs[1].dtype == "uint4" and dq.inputs[1].quant.group_size == 32
    assert list(weights[dq.inputs[1].name].shape) == [n, k // 2]
    assert not any(w.dtype == "uint8" and len(w.shape) == 3 for w in ir.weights)  # B is not kept twice
    # float32 sums of 128 products of O(1) terms, in another order than MLAS: a few ulps of the sum
    torch.testing.assert_close(y, torch.from_numpy(_ort(model, {"A": a})[0]), rtol=1e-5, atol=1e-5)


# -- one clear error per unsupported combination ------------------------------------------------------------------

def _refused(model: onnx.ModelProto, *words: str) -> None:
    with pytest.raises(UnsupportedOpError) as info:
        import_onnx(model, reference_fallback=False)
    text = str(info.value)
    assert "'bad'" in text and all(w in text for w in words), text


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def test_refuses_float8_without_saturation() -> None:
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="bad", saturate=0)
    model = _model([node], [_vi("x", TP.FLOAT, [4])], [_vi("y", TP.FLOAT8E4M3FN, [4])],
                   [_const("s", np.float32(1)), _const("z", np.array(0, ml_dtypes.float8_e4m3fn))])
    _refused(model, "saturate=0", "set saturate=1")


def test_refuses_a_nonzero_float8_zero_point() -> None:
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], name="bad")
    model = _model([node], [_vi("x", TP.FLOAT8E4M3FN, [4])], [_vi("y", TP.FLOAT, [4])],
                   [_const("s", np.float32(1)), _const("z", np.array(2, ml_dtypes.float8_e4m3fn))])
    _refused(model, "zero point must be 0")


def test_refuses_a_block_that_does_not_divide() -> None:
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], name="bad", axis=1, block_size=4)
    model = _model([node], [_vi("x", TP.INT8, [2, 6])], [_vi("y", TP.FLOAT, [2, 6])],
                   [_const("s", np.ones((2, 2), np.float32))])
    _refused(model, "block_size 4 does not divide")


def test_refuses_per_axis_activation_scales() -> None:
    inits = [_const("xs", np.ones(2, np.float32)), _const("xz", np.uint8(0)), _const("w", np.ones((2, 4), np.int8)),
             _const("ws", np.float32(1)), _const("wz", np.int8(0)), _const("ys", np.float32(1)),
             _const("yz", np.uint8(0))]
    node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="bad")
    model = _model([node], [_vi("x", TP.UINT8, [2, 2])], [_vi("y", TP.UINT8, [2, 4])], inits)
    _refused(model, "a_scale", "per-tensor")


def test_refuses_per_row_matmulinteger_zero_point() -> None:
    node = helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"], name="bad")
    model = _model([node], [_vi("a", TP.UINT8, [3, 4]), _vi("b", TP.UINT8, [4, 2])], [_vi("y", TP.INT32, [3, 2])],
                   [_const("az", np.zeros(3, np.uint8))])
    _refused(model, "a_zero_point", "per-tensor")


@pytest.mark.parametrize("what", ["bits", "g_idx"])
def test_refuses_matmulnbits_other_than_4bit_in_order(what: str) -> None:
    model = _nbits_model(8, 64, 32, False, np.random.default_rng(5))
    node = model.graph.node[0]
    node.name = "bad"
    if what == "bits":
        next(a for a in node.attribute if a.name == "bits").i = 8
    else:
        model.graph.initializer.append(_const("g", np.zeros(64, np.int32)))
        node.input[4] = "g"
    _refused(model, "bits=4, no g_idx" if what == "bits" else "g_idx")
