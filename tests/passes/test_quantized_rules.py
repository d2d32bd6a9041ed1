"""normalize's QDQ rules (``npu_compiler.passes.quantized``): hand-built QDQ graphs of ATen ops become QCONV, QGEMM
and DQGEMM, whose outputs equal the QDQ graph's within one output step (integer compute rounds once where QDQ rounds
twice) and exactly where the arithmetic is the same; where a pattern does not apply the QDQ ops stay, with the
reason recorded; and a fused QCONV equals onnxruntime's QLinearConv bit for bit."""

from __future__ import annotations

import pytest
import torch

from npu_compiler.passes import normalize
from tests.ort_oracle import skip_if_u8s8_saturates
from torch_ir.executor import IRExecutor
from torch_ir.ir import NPU_IR, OpNode, TensorMeta, check_integrity
from torch_ir.quant import QuantSpec
from torch_ir.quant import numerics as qn

from .test_rules import applied, ops, rejected


class QDQGraph:
    """A QDQ graph built node by node: weights with their values, code inputs, QUANTIZE/DEQUANTIZE helpers."""

    def __init__(self, seed: int = 0) -> None:
        self.nodes: list[OpNode] = []
        self.weights: list[TensorMeta] = []
        self.inputs: list[TensorMeta] = []
        self.values: dict[str, torch.Tensor] = {}
        self.gen = torch.Generator().manual_seed(seed)

    def weight(self, name: str, value: torch.Tensor, quant: QuantSpec | None = None) -> TensorMeta:
        packed = quant is not None and quant.dtype in ("int4", "uint4")  # the IR's shape is the codes', unpacked
        shape = [*value.shape[:-1], value.shape[-1] * 2] if packed else list(value.shape)
        meta = TensorMeta(name, shape, quant.dtype if quant else qn.dtype_name(value), quant=quant)
        self.weights.append(meta)
        self.values[name] = value
        return meta

    def scale(self, name: str, value: float | list[float]) -> TensorMeta:
        return self.weight(name, torch.tensor(value, dtype=torch.float32))

    def zp(self, name: str, value: int | list[int], dtype: str) -> TensorMeta:
        return self.weight(name, torch.tensor(value, dtype=getattr(torch, dtype)))

    def codes(self, dtype: str, shape: list[int], lo: int | None = None, hi: int | None = None) -> torch.Tensor:
        info = torch.iinfo(getattr(torch, dtype))
        lo, hi = info.min if lo is None else lo, info.max if hi is None else hi
        return torch.randint(lo, hi + 1, shape, generator=self.gen).to(getattr(torch, dtype))

    def input(self, name: str, shape: list[int], dtype: str, quant: QuantSpec | None = None) -> TensorMeta:
        meta = TensorMeta(name, list(shape), dtype, quant=quant)
        self.inputs.append(meta)
        return meta

    def op(self, op_type: str, inputs: list[TensorMeta], shape: list[int], attrs: dict | None = None,
           dtype: str = "float32", quant: QuantSpec | None = None, name: str | None = None) -> TensorMeta:
        name = name or f"{op_type.split('.')[-2 if '.' in op_type else 0].lower()}_{len(self.nodes)}"
        out = TensorMeta(name, list(shape), dtype, quant=quant)
        self.nodes.append(OpNode(name, op_type, list(inputs), [out], dict(attrs or {})))
        return out

    def dequantize(self, q: TensorMeta, scale: TensorMeta, zp: TensorMeta | None, axis: int | None = None,
                   group_size: int | None = None) -> TensorMeta:
        return self.op("DEQUANTIZE", [q, scale, *([zp] if zp is not None else [])], q.shape,
                       {"dtype": q.dtype, "axis": axis, "group_size": group_size})

    def quantize(self, x: TensorMeta, scale: TensorMeta, zp: TensorMeta, dtype: str, name: str) -> TensorMeta:
        spec = QuantSpec(dtype, scale=scale.name, zero_point=zp.name)
        return self.op("QUANTIZE", [x, scale, zp], x.shape, {"dtype": dtype}, dtype=dtype, quant=spec, name=name)

    def quantized_input(self, name: str, shape: list[int], dtype: str = "uint8",
                        scale: float = 0.02, zero_point: int = 128) -> tuple[TensorMeta, TensorMeta]:
        """A code input and its DEQUANTIZE: (codes, float)."""
        s, z = self.scale(f"{name}_scale", scale), self.zp(f"{name}_zp", zero_point, dtype)
        q = self.input(name, shape, dtype, QuantSpec(dtype, scale=s.name, zero_point=z.name))
        return q, self.dequantize(q, s, z)

    def quantized_weight(self, name: str, codes: torch.Tensor, scale: torch.Tensor, axis: int | None = 0,
                         dtype: str = "int8", group_size: int | None = None) -> tuple[TensorMeta, TensorMeta]:
        s = self.weight(f"{name}_scale", scale.float())
        zero = torch.zeros(scale.shape, dtype=torch.int8)
        z = self.weight(f"{name}_zp", zero if dtype != "uint4" else zero.to(torch.uint8) + 8)
        spec = QuantSpec(dtype, scale=s.name, zero_point=z.name, axis=axis, group_size=group_size)
        q = self.weight(name, codes, spec)
        return q, self.dequantize(q, s, z, axis=axis, group_size=group_size)

    def ir(self, outputs: list[TensorMeta]) -> NPU_IR:
        ir = NPU_IR("qdq", self.inputs, outputs, self.weights, self.nodes)
        check_integrity(ir)
        return ir

    def run(self, ir: NPU_IR, feeds: list[torch.Tensor]) -> list[torch.Tensor]:
        return IRExecutor(ir, self.values).run(feeds)


def _within_one_step(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = (got.to(torch.int32) - want.to(torch.int32)).abs()
    assert int(diff.max()) <= 1, f"codes differ by up to {int(diff.max())}"
    assert float((diff == 0).float().mean()) > 0.9, "most codes agree"


def _conv_graph(bias: str | None = "float", activation: str | None = "relu", seed: int = 0,
                per_channel: bool = True) -> tuple[QDQGraph, NPU_IR, torch.Tensor]:
    """x_q -> DEQUANTIZE -> conv2d(., DEQUANTIZE(w_q), bias) [-> activation] -> QUANTIZE -> y_q."""
    g = QDQGraph(seed)
    x_q, x = g.quantized_input("x_q", [1, 8, 10, 10], scale=0.02, zero_point=120)
    w_scale = torch.rand(16, generator=g.gen) * 4e-3 + 1e-3 if per_channel else torch.tensor(3e-3)
    w_q, w = g.quantized_weight("w_q", g.codes("int8", [16, 8, 3, 3], lo=-127), w_scale,
                                axis=0 if per_channel else None)
    inputs = [x, w]
    if bias == "float":
        inputs.append(g.weight("b", torch.randn(16, generator=g.gen) * 0.5))
    elif bias == "int32":  # ONNX: int32 codes at x_scale · w_scale
        b_scale = g.weight("b_scale", (torch.tensor(0.02) * w_scale).float())
        axis = 0 if per_channel else None
        b_q = g.weight("b_q", g.codes("int32", [16], -5000, 5000), QuantSpec("int32", scale="b_scale", axis=axis))
        inputs.append(g.dequantize(b_q, b_scale, None, axis=axis))
    y = g.op("aten.conv2d.default", inputs, [1, 16, 10, 10], {"padding": [1, 1], "bias": None} if not bias
             else {"padding": [1, 1]})
    if activation:
        y = g.op(f"aten.{activation}.default", [y], y.shape)
    y_q = g.quantize(y, g.scale("y_scale", 0.05), g.zp("y_zp", 10 if activation else 128, "uint8"), "uint8", "y_q")
    return g, g.ir([y_q]), g.codes("uint8", [1, 8, 10, 10])


@pytest.mark.parametrize("bias", [None, "float", "int32"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["w_per_tensor", "w_per_channel"])
def test_qdq_conv_becomes_qconv(bias: str | None, per_channel: bool) -> None:
    g, before, x = _conv_graph(bias, per_channel=per_channel)
    after = normalize(before)
    assert ops(after) == ["QCONV"] and applied(after)["qdq_conv"] == 1
    qconv = after.nodes[0]
    assert qconv.attrs["activation"] == "relu" and qconv.attrs["has_bias"] == (bias is not None)
    assert [t.name for t in qconv.inputs] == ["x_q", "w_q", "x_q_scale", "x_q_zp", "w_q_scale", "w_q_zp",
                                              *({"float": ["b"], "int32": ["b_q"]}.get(bias, [])), "y_scale", "y_zp"]
    assert after.graph_outputs[0].name == "y_q" and after.graph_outputs[0].quant == before.graph_outputs[0].quant
    assert qconv.provenance is not None and "qdq_conv" in qconv.provenance.rules
    _within_one_step(g.run(after, [x])[0], g.run(before, [x])[0])


def test_qdq_linear_becomes_qgemm_and_matmul_of_activations_qgemm() -> None:
    """linear(DQ(x), DQ(w), b) -> Q and a batched matmul of two dequantized activations (attention's scores)."""
    g = QDQGraph(1)
    x_q, x = g.quantized_input("x_q", [2, 5, 32], "int8", 0.03, -3)
    w_q, w = g.quantized_weight("w_q", g.codes("int8", [24, 32], lo=-127), torch.rand(24, generator=g.gen) * 5e-3)
    y = g.op("aten.linear.default", [x, w, g.weight("b", torch.randn(24, generator=g.gen))], [2, 5, 24])
    y_q = g.quantize(y, g.scale("y_scale", 0.1), g.zp("y_zp", 0, "int8"), "int8", "y_q")
    a_q, a = g.quantized_input("a_q", [2, 4, 6, 16], scale=0.05, zero_point=128)
    b_q, b = g.quantized_input("b_q", [2, 4, 16, 7], scale=0.04, zero_point=100)
    s = g.op("aten.matmul.default", [a, b], [2, 4, 6, 7])
    s_q = g.quantize(s, g.scale("s_scale", 0.5), g.zp("s_zp", 128, "uint8"), "uint8", "s_q")
    before = g.ir([y_q, s_q])
    after = normalize(before)
    assert ops(after) == ["QGEMM", "QGEMM"] and applied(after)["qdq_gemm"] == applied(after)["qdq_matmul"] == 1
    assert [n.attrs["trans_b"] for n in after.nodes] == [True, False]
    feeds = [g.codes("int8", [2, 5, 32]), g.codes("uint8", [2, 4, 6, 16]), g.codes("uint8", [2, 4, 16, 7])]
    for got, want in zip(g.run(after, feeds), g.run(before, feeds)):
        _within_one_step(got, want)


@pytest.mark.parametrize("case", ["int8_channel", "int4_group", "matmul_int8_column"])
def test_weight_only_gemm_becomes_dqgemm(case: str) -> None:
    """linear(x, DQ(w_q)) or matmul(x, DQ(w_q)) -> relu with x float: DQGEMM (the same arithmetic: the weight
    dequantized, a float product), the relu fused."""
    g = QDQGraph(2)
    x = g.input("x", [3, 64], "float32")
    if case == "int8_channel":
        _, w = g.quantized_weight("w_q", g.codes("int8", [16, 64], lo=-127), torch.rand(16, generator=g.gen) * 0.01)
    elif case == "int4_group":
        packed = qn.pack4(g.codes("int8", [16, 64], -8, 7))
        _, w = g.quantized_weight("w_q", packed, torch.rand(16, 2, generator=g.gen) * 0.02, axis=1, dtype="int4",
                                  group_size=32)
    else:  # ONNX MatMul by a dequantized [K, N] weight, per output column
        _, w = g.quantized_weight("w_q", g.codes("int8", [64, 16], lo=-127), torch.rand(16, generator=g.gen) * 0.01,
                                  axis=1)
    product = (g.op("aten.matmul.default", [x, w], [3, 16]) if case.startswith("matmul")
               else g.op("aten.linear.default", [x, w], [3, 16], {"bias": None}))
    before = g.ir([g.op("aten.relu.default", [product], [3, 16])])
    after = normalize(before)
    assert ops(after) == ["DQGEMM"] and after.nodes[0].attrs["activation"] == "relu"
    rule = "weight_only_matmul" if case.startswith("matmul") else "weight_only_gemm"
    assert applied(after)[rule] == applied(after)["dqgemm_activation"] == 1
    assert after.nodes[0].attrs["trans_b"] == (rule == "weight_only_gemm")
    feeds = [torch.randn(3, 64, generator=g.gen)]
    torch.testing.assert_close(g.run(after, feeds)[0], g.run(before, feeds)[0], rtol=1e-6, atol=1e-6)


def test_patterns_that_do_not_apply_keep_their_qdq_ops() -> None:
    """A SiLU between CONV and QUANTIZE is not fused (QDQ stays, the reason recorded); a DEQUANTIZE that a
    residual add also reads stays for it while the QCONV reads the codes."""
    g, before, x = _conv_graph(activation="silu")
    after = normalize(before)
    assert ops(after) == ["DEQUANTIZE", "DEQUANTIZE", "CONV", "QUANTIZE"]
    assert any(r[0] == "qdq_conv" and "silu" in r[2] for r in rejected(after))
    torch.testing.assert_close(g.run(after, [x])[0], g.run(before, [x])[0], rtol=0, atol=0)

    g = QDQGraph(3)
    x_q, x = g.quantized_input("x_q", [1, 8, 6, 6])
    _, w = g.quantized_weight("w_q", g.codes("int8", [8, 8, 1, 1], lo=-127), torch.full((8,), 4e-3))
    y_scale, y_zp = g.scale("y_scale", 0.02), g.zp("y_zp", 128, "uint8")
    y_q = g.quantize(g.op("aten.conv2d.default", [x, w], [1, 8, 6, 6], {"bias": None}), y_scale, y_zp, "uint8", "y_q")
    res = g.op("aten.add.Tensor", [g.dequantize(y_q, y_scale, y_zp), x], [1, 8, 6, 6])
    before = g.ir([res])
    after = normalize(before)
    assert ops(after) == ["DEQUANTIZE", "QCONV", "DEQUANTIZE", "aten.add.Tensor"]
    feeds = [g.codes("uint8", [1, 8, 6, 6])]
    torch.testing.assert_close(g.run(after, feeds)[0], g.run(before, feeds)[0], rtol=0, atol=0.02 + 1e-6)


def test_fused_qconv_equals_onnxruntime_qlinearconv() -> None:
    """The QCONV normalize makes from a QDQ graph (int32 bias, per-channel weights), run by the IR executor, equals
    an onnxruntime QLinearConv model of the same codes and scales bit for bit."""
    skip_if_u8s8_saturates()
    pytest.importorskip("onnxruntime")
    from tests.quant.test_ops_vs_ort import ort_run

    g, before, x = _conv_graph("int32", activation=None, seed=5)
    after = normalize(before)
    assert ops(after) == ["QCONV"]
    v = {k: t.numpy() for k, t in g.values.items()}
    theirs = ort_run("QLinearConv", [("x", x.numpy()), ("xs", v["x_q_scale"]), ("xz", v["x_q_zp"]), ("w", v["w_q"]),
                                     ("ws", v["w_q_scale"]), ("wz", v["w_q_zp"]), ("ys", v["y_scale"]),
                                     ("yz", v["y_zp"]), ("b", v["b_q"])], {"pads": [1, 1, 1, 1]}, out="uint8")
    assert torch.equal(g.run(after, [x])[0], torch.from_numpy(theirs))


def test_missing_zero_points_become_zeros() -> None:
    """Symmetric int8 x and y (DEQUANTIZE/QUANTIZE without a zero point, as ONNX allows): QGEMM takes zeros."""
    g = QDQGraph(4)
    x_scale = g.scale("x_scale", 0.05)
    x_q = g.input("x_q", [4, 16], "int8", QuantSpec("int8", scale="x_scale"))
    _, w = g.quantized_weight("w_q", g.codes("int8", [8, 16], lo=-127), torch.full((8,), 6e-3))
    y = g.op("aten.linear.default", [g.dequantize(x_q, x_scale, None), w], [4, 8], {"bias": None})
    y_q = g.op("QUANTIZE", [y, g.scale("y_scale", 0.02)], [4, 8], {"dtype": "int8"}, dtype="int8",
               quant=QuantSpec("int8", scale="y_scale"), name="y_q")
    before = g.ir([y_q])
    after = normalize(before)
    assert ops(after) == ["aten.full.default", "aten.full.default", "QGEMM"]
    feeds = [g.codes("int8", [4, 16])]
    _within_one_step(g.run(after, feeds)[0], g.run(before, feeds)[0])


@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qdq_residual_add_becomes_qadd_exactly(activation: str | None, dtype: str) -> None:
    """QUANTIZE([relu](add(DEQUANTIZE(a), DEQUANTIZE(b)))) -> QADD (rules qdq_add, qdq_add_relu): the same float32
    steps, so the codes are the chain's bit for bit; a DEQUANTIZE read elsewhere keeps the chain, saying so."""
    g = QDQGraph(3)
    zp = 128 if dtype == "uint8" else 3
    a_q, a = g.quantized_input("a_q", [1, 8, 5, 5], dtype, scale=0.021, zero_point=zp)
    b_q, b = g.quantized_input("b_q", [1, 8, 5, 5], dtype, scale=0.017, zero_point=zp - 3)
    s = g.op("aten.add.Tensor", [a, b], a.shape)
    if activation:
        s = g.op("aten.relu.default", [s], s.shape)
    y_q = g.quantize(s, g.scale("y_scale", 0.03), g.zp("y_zp", zp - 7, dtype), dtype, "y_q")
    before = g.ir([y_q])
    after = normalize(before)
    rule = "qdq_add_relu" if activation else "qdq_add"
    assert ops(after) == ["QADD"] and applied(after)[rule] == 1
    qadd = after.nodes[0]
    assert [t.name for t in qadd.inputs] == ["a_q", "a_q_scale", "a_q_zp", "b_q", "b_q_scale", "b_q_zp", "y_scale",
                                             "y_zp"]
    assert qadd.attrs == {"out_dtype": dtype, "activation": activation, "method": "divide"}
    feeds = [g.codes(dtype, [1, 8, 5, 5]), g.codes(dtype, [1, 8, 5, 5])]
    assert torch.equal(g.run(after, feeds)[0], g.run(before, feeds)[0])
    # the dequantized a also a graph output: the chain stays, with the reason
    kept = normalize(g.ir([y_q, a]))
    assert "QADD" not in ops(kept) and any(r[0] == rule and "read" in r[2] for r in rejected(kept))


def _movement_graph(dtype: str, method: str = "divide", second_scale: float | None = None,
                    qmax: int | None = None) -> tuple[QDQGraph, NPU_IR]:
    """x_q -> DEQUANTIZE -> reshape -> QUANTIZE -> DEQUANTIZE -> permute -> QUANTIZE (one scale and zero point unless
    ``second_scale``), as onnxruntime's quantizer leaves an attention block's head split."""
    g = QDQGraph(5)
    zp = 128 if dtype == "uint8" else -3
    _, x = g.quantized_input("x_q", [1, 6, 8], dtype, scale=0.0173, zero_point=zp)
    h = g.op("aten.reshape.default", [x], [1, 6, 2, 4], {"shape": [1, 6, 2, 4]})
    scale, zero = g.inputs[0].quant.scale, g.inputs[0].quant.zero_point
    s_meta = next(w for w in g.weights if w.name == scale)
    z_meta = next(w for w in g.weights if w.name == zero)
    h_q = g.op("QUANTIZE", [h, s_meta, z_meta], h.shape, {"dtype": dtype, "method": method}, dtype=dtype,
               quant=QuantSpec(dtype, scale=scale, zero_point=zero), name="h_q")
    h2 = g.dequantize(h_q, s_meta, z_meta)
    t = g.op("aten.permute.default", [h2], [1, 2, 6, 4], {"dims": [0, 2, 1, 3]})
    if second_scale is not None:
        s_meta, z_meta = g.scale("t_scale", second_scale), g.zp("t_zp", zp, dtype)
    attrs = {"dtype": dtype, "method": method, **({"qmax": qmax} if qmax is not None else {})}
    t_q = g.op("QUANTIZE", [t, s_meta, z_meta], t.shape, attrs, dtype=dtype,
               quant=QuantSpec(dtype, scale=s_meta.name, zero_point=z_meta.name), name="t_q")
    return g, g.ir([t_q])


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("method", ["divide", "multiply_inverse"])
def test_reshape_and_transpose_between_qdq_pairs_move_the_codes_exactly(dtype: str, method: str) -> None:
    """QUANTIZE(move(DEQUANTIZE(q))) with one scale and zero point -> move(q) (rule qdq_movement): the codes equal
    the QDQ chain's bit for bit, for every code value (each appears in the input), and no QUANTIZE or DEQUANTIZE
    is left."""
    g, before = _movement_graph(dtype, method)
    after = normalize(before)
    assert ops(after) == ["aten.reshape.default", "aten.permute.default"] and applied(after)["qdq_movement"] == 2
    assert [t.dtype for n in after.nodes for t in n.outputs] == [dtype, dtype]
    every = torch.arange(48) * 5 % 256 + (-128 if dtype == "int8" else 0)  # codes across the whole range
    feeds = [every.to(getattr(torch, dtype)).reshape(1, 6, 8)]
    for _ in range(5):
        assert torch.equal(g.run(after, feeds)[0], g.run(before, feeds)[0])
        feeds = [g.codes(dtype, [1, 6, 8])]


@pytest.mark.parametrize("change", ["scale", "narrowed"])
def test_qdq_pairs_of_other_parameters_stay(change: str) -> None:
    """Another scale, or a QUANTIZE narrowing the range, changes the codes: that pair stays, with the reason."""
    _, before = _movement_graph("uint8", second_scale=0.02 if change == "scale" else None,
                                qmax=200 if change == "narrowed" else None)
    after = normalize(before)
    assert applied(after)["qdq_movement"] == 1 and ops(after).count("QUANTIZE") == 1
    reason = "scale or zero point" if change == "scale" else "narrows"
    assert any(r[0] == "qdq_movement" and reason in r[2] for r in rejected(after))


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("x_scale", [0.0173, -0.0173])
def test_a_max_pool_between_qdq_pairs_becomes_qmaxpool_exactly(dtype: str, x_scale: float) -> None:
    """QUANTIZE(max_pool2d(DEQUANTIZE(x))) -> QMAXPOOL (rule qdq_maxpool), whose reference is the chain: the codes
    equal it bit for bit, a negative scale included (the pool then picks the smallest code); a narrowed QUANTIZE
    keeps the chain, saying so."""
    g = QDQGraph(6)
    zp = 128 if dtype == "uint8" else -3
    _, x = g.quantized_input("x_q", [1, 3, 9, 9], dtype, scale=x_scale, zero_point=zp)
    pooled = g.op("aten.max_pool2d.default", [x], [1, 3, 5, 5], {"kernel_size": [3, 3], "stride": [2, 2],
                                                                   "padding": [1, 1]})
    y_q = g.quantize(pooled, g.scale("y_scale", 0.02), g.zp("y_zp", zp, dtype), dtype, "y_q")
    before = g.ir([y_q])
    after = normalize(before)
    assert ops(after) == ["QMAXPOOL"] and applied(after)["qdq_maxpool"] == 1
    assert after.nodes[0].attrs == {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1],
                                    "ceil_mode": False, "out_dtype": dtype, "method": "divide"}
    for _ in range(3):
        feeds = [g.codes(dtype, [1, 3, 9, 9])]
        assert torch.equal(g.run(after, feeds)[0], g.run(before, feeds)[0])
    g.nodes[-1].attrs["qmax"] = 100  # the QUANTIZE narrows the range
    kept = normalize(g.ir([y_q]))
    assert "QMAXPOOL" not in ops(kept) and any(r[0] == "qdq_maxpool" and "narrowed" in r[2] for r in rejected(kept))


# steps of one to three ops, as torch.export / the ONNX import write them, and the rule each chain takes
_LUT_CHAINS = {
    "qdq_lut1": [("aten.sigmoid.default", {})],
    "qdq_lut2": [("aten.mul.Tensor", {"other": 0.7071067932881648}), ("aten.erf.default", {})],
    "qdq_lut3": [("aten.gelu.default", {"approximate": "tanh"}), ("aten.add.Tensor", {"other": 1.0}),
                 ("aten.div.Tensor", {"other": 3.0})],
}


@pytest.mark.parametrize("rule", sorted(_LUT_CHAINS))
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_an_elementwise_chain_between_qdq_pairs_becomes_a_table_exactly(rule: str, dtype: str) -> None:
    """QUANTIZE(steps(DEQUANTIZE(x))) -> QLUT (rules qdq_lut1..3): the codes equal the chain's bit for bit for every
    code (the input holds all 256); a narrowed QUANTIZE and a step with a tensor operand keep the chain, saying so."""
    g = QDQGraph(7)
    zp = 120 if dtype == "uint8" else -5
    _, v = g.quantized_input("x_q", [4, 64], dtype, scale=0.031, zero_point=zp)
    for op, attrs in _LUT_CHAINS[rule]:
        v = g.op(op, [v], [4, 64], attrs)
    y_q = g.quantize(v, g.scale("y_scale", 0.0079), g.zp("y_zp", zp, dtype), dtype, "y_q")
    before = g.ir([y_q])
    after = normalize(before)
    assert ops(after) == ["QLUT"] and applied(after)[rule] == 1
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(getattr(torch, dtype)).reshape(4, 64)
    assert torch.equal(g.run(after, [every])[0], g.run(before, [every])[0])
    g.nodes[-1].attrs["qmax"] = 100  # the QUANTIZE narrows the range
    kept = normalize(g.ir([y_q]))
    assert "QLUT" not in ops(kept) and any(r[0] == rule and "narrowed" in r[2] for r in rejected(kept))


def test_a_step_with_alpha_is_no_table_step() -> None:
    g = QDQGraph(8)
    _, x = g.quantized_input("x_q", [2, 8], "uint8", scale=0.02, zero_point=128)
    v = g.op("aten.add.Tensor", [x], [2, 8], {"other": 1.0, "alpha": 2})
    y_q = g.quantize(v, g.scale("y_scale", 0.02), g.zp("y_zp", 0, "uint8"), "uint8", "y_q")
    kept = normalize(g.ir([y_q]))
    assert "QLUT" not in ops(kept) and any(r[0] == "qdq_lut1" and "no table step" in r[2] for r in rejected(kept))


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qdq_product_becomes_qmul_exactly(dtype: str) -> None:
    """QUANTIZE(mul(DEQUANTIZE(a), DEQUANTIZE(b))) -> QMUL (rule qdq_mul): the same float32 steps, so the codes are the
    chain's bit for bit; a DEQUANTIZE read elsewhere keeps the chain, saying so."""
    g = QDQGraph(9)
    zp = 128 if dtype == "uint8" else 3
    _, a = g.quantized_input("a_q", [1, 8, 5, 5], dtype, scale=0.021, zero_point=zp)
    _, b = g.quantized_input("b_q", [1, 8, 5, 5], dtype, scale=0.017, zero_point=zp - 3)
    p = g.op("aten.mul.Tensor", [a, b], a.shape)
    y_q = g.quantize(p, g.scale("y_scale", 0.009), g.zp("y_zp", zp - 7, dtype), dtype, "y_q")
    before = g.ir([y_q])
    after = normalize(before)
    assert ops(after) == ["QMUL"] and applied(after)["qdq_mul"] == 1
    assert after.nodes[0].attrs == {"out_dtype": dtype, "method": "divide"}
    feeds = [g.codes(dtype, [1, 8, 5, 5]), g.codes(dtype, [1, 8, 5, 5])]
    assert torch.equal(g.run(after, feeds)[0], g.run(before, feeds)[0])
    kept = normalize(g.ir([y_q, a]))
    assert "QMUL" not in ops(kept) and any(r[0] == "qdq_mul" and "read" in r[2] for r in rejected(kept))
