"""The quantized NPU ops' reference implementations, bit-exact against onnxruntime (CPU).

Each case builds a one-node ONNX model with ``onnx.helper``, runs it in onnxruntime and the registered reference
(``torch_ir.ops.npu_quant``) on the same seeded codes and scales; integer outputs are compared with
``torch.equal``. Scales are realistic (activations ~1e-2, weights ~1e-3); some cases put the requantize
multiplier's products on exact .5 ties, and some accumulators past 2**24 (float32 rounds them before scaling).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tests.ort_oracle import skip_if_u8s8_saturates  # noqa: E402
from torch_ir.ops import npu_quant as nq  # noqa: E402

T = torch.from_numpy
_ELEM = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
         "int4": TensorProto.INT4, "uint4": TensorProto.UINT4, "float8_e4m3fn": TensorProto.FLOAT8E4M3FN,
         "float8_e5m2": TensorProto.FLOAT8E5M2, "int32": TensorProto.INT32, "float32": TensorProto.FLOAT}


def ort_run(op: str, inputs: list, attrs: dict | None = None, out: str = "uint8", *, domain: str = "",
            opset: int = 21, feeds: tuple[str, ...] = ("x",), cast_to: str | None = None) -> np.ndarray:
    """One ``op`` node on ``inputs`` ((name, array | TensorProto | None) in order; None: an absent optional
    input), the names in ``feeds`` fed at run time and the rest initializers; ``cast_to`` appends a Cast (for
    int4 and float8 outputs, which onnxruntime's Python API cannot return)."""
    names, inits, graph_in, feed = [], [], [], {}
    for name, v in inputs:
        names.append("" if v is None else name)
        if v is None:
            continue
        if isinstance(v, onnx.TensorProto):
            v.name = name
            inits.append(v)
        elif name in feeds:
            graph_in.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
            feed[name] = v
        else:
            inits.append(numpy_helper.from_array(v, name))
    nodes = [helper.make_node(op, names, ["y0" if cast_to else "y"], domain=domain, **(attrs or {}))]
    if cast_to:
        nodes.append(helper.make_node("Cast", ["y0"], ["y"], to=_ELEM[cast_to]))
    graph = helper.make_graph(nodes, op, graph_in, [helper.make_tensor_value_info("y", _ELEM[cast_to or out], None)],
                              initializer=inits)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def _codes(rng: np.random.Generator, dtype: str, shape: list[int], lo: int | None = None,
           hi: int | None = None) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, size=shape).astype(dtype)


def _assert_codes_equal(ours: torch.Tensor, theirs: np.ndarray) -> None:
    theirs_t = T(np.ascontiguousarray(theirs))
    assert ours.dtype == theirs_t.dtype and ours.shape == theirs_t.shape
    if not torch.equal(ours, theirs_t):
        diff = (ours.to(torch.int64) - theirs_t.to(torch.int64)).abs()
        raise AssertionError(f"{int((diff > 0).sum())} of {diff.numel()} codes differ (max {int(diff.max())})")


# -- QLinearConv ---------------------------------------------------------------------------------------------

def _qlinearconv_case(x_dt: str, per_channel: bool, bias: bool, *, groups: int = 1, stride: int = 1, pad: int = 1,
                      dilation: int = 1, rank: int = 2, channels: int = 8, kernel: int = 3, seed: int = 0,
                      scales: tuple | None = None, codes: tuple[int, int, int] | None = None) -> None:
    """``codes``: (smallest x code, smallest w code, x zero point) for accumulators of one sign and size."""
    skip_if_u8s8_saturates(x_dt)
    rng = np.random.default_rng(seed)
    out_ch = 16
    x_lo, w_lo, zp = codes or (None, -127, None)
    x = _codes(rng, x_dt, [2, channels, *[9, 11][:rank]], lo=x_lo)
    w = _codes(rng, "int8", [out_ch, channels // groups, *[kernel] * rank], lo=w_lo)
    if scales is None:
        w_scale = rng.uniform(1e-3, 1e-2, size=out_ch if per_channel else None)
        scales = (rng.uniform(5e-3, 5e-2), w_scale, rng.uniform(0.5, 4.0))
    x_scale, w_scale, y_scale = (np.asarray(s, np.float32) for s in scales)
    x_zp = np.asarray(rng.integers(100, 150) if x_dt == "uint8" else rng.integers(-20, 20), x_dt)
    x_zp = x_zp if zp is None else np.asarray(zp, x_dt)
    w_zp, y_zp = np.zeros(w_scale.shape, np.int8), np.asarray(7 if x_dt == "uint8" else -3, x_dt)
    b = rng.integers(-20000, 20000, size=out_ch).astype(np.int32) if bias else None
    spatial = dict(stride=[stride] * rank, padding=[pad] * rank, dilation=[dilation] * rank)
    theirs = ort_run("QLinearConv", [("x", x), ("xs", x_scale), ("xz", x_zp), ("w", w), ("ws", w_scale),
                                     ("wz", w_zp), ("ys", y_scale), ("yz", y_zp), ("b", b)],
                     dict(strides=spatial["stride"], pads=spatial["padding"] * 2, dilations=spatial["dilation"],
                          group=groups), out=x_dt)
    ours = nq.qconv(T(x), T(w), T(x_scale), T(x_zp), T(w_scale), T(w_zp), *([T(b)] if bias else []), T(y_scale),
                    T(y_zp), **spatial, groups=groups, has_bias=bias, out_dtype=x_dt)
    _assert_codes_equal(ours, theirs)


@pytest.mark.parametrize("x_dt", ["uint8", "int8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["w_per_tensor", "w_per_channel"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_qlinearconv(x_dt: str, per_channel: bool, bias: bool) -> None:
    _qlinearconv_case(x_dt, per_channel, bias)


@pytest.mark.parametrize("case", [
    dict(groups=8), dict(groups=2, stride=2, pad=2, dilation=2), dict(rank=1, stride=2), dict(rank=1, groups=8),
    dict(pad=0, kernel=1)], ids=["depthwise", "grouped_strided_dilated", "1d_strided", "1d_depthwise", "pointwise"])
def test_qlinearconv_geometry(case: dict) -> None:
    _qlinearconv_case("uint8", True, True, **case)


def test_qlinearconv_ties_round_half_even() -> None:
    """x_scale·w_scale/y_scale = 0.5 and 0.25 exactly: every odd accumulator lands on a tie."""
    _qlinearconv_case("uint8", False, False, channels=1, kernel=1, pad=0, scales=(1.0, 1.0, 2.0))
    _qlinearconv_case("int8", True, True, channels=1, kernel=1, pad=0, scales=(0.5, [0.5] * 16, 1.0))


def test_qlinearconv_large_accumulators() -> None:
    """2048 channels × 3×3 of codes ≥ 200 (x, zero point 0) and ≥ 100 (w): every accumulator is past 2**24
    (≥ 200·100·18432), where float32 rounds it before the multiply."""
    skip_if_u8s8_saturates()
    _qlinearconv_case("uint8", True, False, channels=2048, pad=0, scales=(1e-3, [1e-3] * 16, 2.6),
                      codes=(200, 100, 0))


def test_qlinearconv_multiplier_product_order() -> None:
    """Scales whose multiplier differs by one float32 ulp between (x_scale·w_scale)/y_scale and
    x_scale·(w_scale/y_scale); the accumulator 170·73 = 12410 rounds to 1 with the first and 2 with the second."""
    f = np.float32
    xs, ws, ys = f(0.023883488029241562), f(0.009889038279652596), f(1.9540350437164307)
    assert np.round(f(12410) * f(f(xs * ws) / ys)) != np.round(f(12410) * f(xs * f(ws / ys)))  # the case discriminates
    x = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    w = np.array([73, -73, 1, 127], np.int8).reshape(4, 1, 1, 1)
    zp8 = np.zeros(4, np.int8)
    theirs = ort_run("QLinearConv", [("x", x), ("xs", xs), ("xz", np.uint8(0)), ("w", w), ("ws", np.full(4, ws)),
                                     ("wz", zp8), ("ys", ys), ("yz", np.uint8(128))], out="uint8")
    ours = nq.qconv(T(x), T(w), T(np.array(xs)), T(np.array(0, np.uint8)), T(np.full(4, ws)), T(zp8), T(np.array(ys)),
                    T(np.array(128, np.uint8)), stride=[1, 1], padding=[0, 0], dilation=[1, 1], out_dtype="uint8")
    _assert_codes_equal(ours, theirs)



@pytest.mark.parametrize("per_channel", [False, True], ids=["w_per_tensor", "w_per_channel"])
def test_qconv_float_bias_is_quantized_half_even(per_channel: bool) -> None:
    """A float bias (PT2E's) against QLinearConv with the int32 bias round_half_even(bias / (x_scale·w_scale)),
    computed here in float32; some biases sit exactly on a .5 step."""
    skip_if_u8s8_saturates()
    rng = np.random.default_rng(7)
    x, w = _codes(rng, "uint8", [1, 4, 5, 5]), _codes(rng, "int8", [6, 4, 3, 3], lo=-127)
    x_scale = np.asarray(0.03125, np.float32)  # powers of two: bias / (x_scale·w_scale) is exact, ties are ties
    w_scale = np.asarray([2.0 ** -8] * 6 if per_channel else 2.0 ** -8, np.float32)
    steps = np.array([10.5, -10.5, 11.5, -3.25, 1000.7, 0.5])
    bias = (steps * (x_scale * w_scale)).astype(np.float32)
    int_bias = np.round(bias / (x_scale * w_scale).astype(np.float32)).astype(np.int32)
    assert int_bias.tolist() == [10, -10, 12, -3, 1001, 0]  # half to even
    x_zp, w_zp, y_scale, y_zp = np.uint8(128), np.zeros(w_scale.shape, np.int8), np.float32(0.01), np.uint8(128)
    theirs = ort_run("QLinearConv", [("x", x), ("xs", x_scale), ("xz", x_zp), ("w", w), ("ws", w_scale),
                                     ("wz", w_zp), ("ys", y_scale), ("yz", y_zp), ("b", int_bias)], out="uint8")
    ours = nq.qconv(T(x), T(w), T(x_scale), T(np.array(x_zp)), T(w_scale), T(w_zp), T(bias), T(np.array(y_scale)),
                    T(np.array(y_zp)), stride=[1, 1], padding=[0, 0], dilation=[1, 1], has_bias=True,
                    out_dtype="uint8")
    _assert_codes_equal(ours, theirs)

# -- QLinearMatMul, MatMulInteger, ConvInteger ----------------------------------------------------------------

@pytest.mark.parametrize("a_shape", [[5, 64], [3, 5, 64]], ids=["2d", "batched"])
@pytest.mark.parametrize("per_column", [False, True], ids=["b_per_tensor", "b_per_column"])
@pytest.mark.parametrize("a_dt", ["uint8", "int8"])
def test_qlinearmatmul(a_shape: list[int], per_column: bool, a_dt: str) -> None:
    skip_if_u8s8_saturates(a_dt)
    rng = np.random.default_rng(len(a_shape) + 2 * per_column)
    n = 24
    a, b = _codes(rng, a_dt, a_shape), _codes(rng, "int8", [64, n], lo=-127)
    a_scale, y_scale = np.float32(rng.uniform(5e-3, 5e-2)), np.float32(rng.uniform(0.05, 0.5))
    b_scale = np.asarray(rng.uniform(1e-3, 1e-2, size=n if per_column else None), np.float32)
    a_zp = np.asarray(rng.integers(100, 150) if a_dt == "uint8" else rng.integers(-10, 10), a_dt)
    b_zp, y_zp = np.zeros(b_scale.shape, np.int8), np.asarray(rng.integers(0, 100), a_dt)
    theirs = ort_run("QLinearMatMul", [("x", a), ("as", a_scale), ("az", a_zp), ("b", b), ("bs", b_scale),
                                       ("bz", b_zp), ("ys", y_scale), ("yz", y_zp)], out=a_dt)
    ours = nq.qgemm(T(a), T(b), T(np.array(a_scale)), T(a_zp), T(b_scale), T(b_zp), T(np.array(y_scale)), T(y_zp),
                    trans_b=False, out_dtype=a_dt)
    _assert_codes_equal(ours, theirs)


_ONE = T(np.array(1.0, np.float32))


@pytest.mark.parametrize("b_dt", ["uint8", "int8"])
@pytest.mark.parametrize("a_shape", [[7, 40], [2, 7, 40]], ids=["2d", "batched"])
def test_matmulinteger(b_dt: str, a_shape: list[int]) -> None:
    """int32 accumulators with an activation zero point and per-column weight zero points."""
    skip_if_u8s8_saturates("uint8", b_dt)
    rng = np.random.default_rng(3)
    a, b = _codes(rng, "uint8", a_shape), _codes(rng, b_dt, [40, 12])
    a_zp = np.asarray(131, np.uint8)
    b_zp = _codes(rng, b_dt, [12], lo=0 if b_dt == "uint8" else -5, hi=200 if b_dt == "uint8" else 5)
    theirs = ort_run("MatMulInteger", [("x", a), ("b", b), ("az", a_zp), ("bz", b_zp)], out="int32", opset=10)
    ours = nq.qgemm(T(a), T(b), _ONE, T(a_zp), _ONE.expand(12), T(b_zp), trans_b=False, w_dtype=b_dt,
                    out_dtype="int32")
    _assert_codes_equal(ours, theirs)


@pytest.mark.parametrize("case", [dict(), dict(groups=4, stride=2, pad=1), dict(rank=1, dilation=2)],
                         ids=["plain", "grouped_strided", "1d_dilated"])
def test_convinteger(case: dict) -> None:
    rng = np.random.default_rng(4)
    rank, groups = case.get("rank", 2), case.get("groups", 1)
    stride, pad, dilation = case.get("stride", 1), case.get("pad", 0), case.get("dilation", 1)
    x, w = _codes(rng, "uint8", [1, 8, *[10, 7][:rank]]), _codes(rng, "uint8", [6 * groups // 2, 8 // groups,
                                                                               *[3] * rank])
    x_zp, w_zp = np.asarray(120, np.uint8), np.asarray(131, np.uint8)
    theirs = ort_run("ConvInteger", [("x", x), ("w", w), ("xz", x_zp), ("wz", w_zp)],
                     dict(strides=[stride] * rank, pads=[pad] * 2 * rank, dilations=[dilation] * rank, group=groups),
                     out="int32", opset=10)
    ours = nq.qconv(T(x), T(w), _ONE, T(x_zp), _ONE, T(w_zp), stride=[stride] * rank, padding=[pad] * rank,
                    dilation=[dilation] * rank, groups=groups, w_dtype="uint8", out_dtype="int32")
    _assert_codes_equal(ours, theirs)


# -- QuantizeLinear / DequantizeLinear --------------------------------------------------------------------------

def _onnx_codes(name: str, dtype: str, codes: np.ndarray) -> onnx.TensorProto:
    """An initializer of ``dtype`` holding ``codes`` (onnx packs 4-bit ones and encodes float8 itself)."""
    return helper.make_tensor(name, _ELEM[dtype], list(codes.shape), codes.flatten().tolist())


def _packed_by_onnx(dtype: str, codes: np.ndarray) -> torch.Tensor:
    """4-bit codes as onnx packs them (two per byte, low nibble first), with the last dim halved."""
    proto = _onnx_codes("p", dtype, codes)
    return T(np.array(proto.int32_data, np.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // 2))


#: (dtype, granularity): axis, group size.
_GRANULARITY = {"tensor": (None, None), "axis": (1, None), "blocked": (1, 4)}
_Q_CASES = [("uint8", "tensor"), ("int8", "axis"), ("int8", "blocked"), ("int16", "axis"), ("int4", "tensor"),
            ("uint4", "blocked"), ("int4", "axis"), ("float8_e4m3fn", "tensor"), ("float8_e5m2", "axis")]


def _scales(rng: np.random.Generator, shape: list[int], gran: str) -> np.ndarray:
    axis, group = _GRANULARITY[gran]
    if axis is None:
        return np.asarray(rng.uniform(0.01, 0.1), np.float32)
    scale_shape = [shape[axis]] if group is None else [*shape[:axis], shape[axis] // group, *shape[axis + 1:]]
    return rng.uniform(0.01, 0.1, size=scale_shape).astype(np.float32)


def _broadcast(scale: np.ndarray, rank: int, axis: int | None, group: int | None) -> np.ndarray:
    if axis is None:
        return scale
    if group:
        return np.repeat(scale, group, axis=axis)
    return scale.reshape([-1 if d == axis else 1 for d in range(rank)])


def _zero_points(rng: np.random.Generator, dtype: str, scale: np.ndarray) -> np.ndarray | None:
    if dtype.startswith("float8"):
        return None
    lo, hi = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-3000, 3000), "int4": (-8, 7), "uint4": (0, 15)}[dtype]
    return rng.integers(lo, hi + 1, size=scale.shape).astype(np.int16 if dtype == "int16" else np.int32)


@pytest.mark.parametrize(("dtype", "gran"), _Q_CASES, ids=[f"{d}-{g}" for d, g in _Q_CASES])
def test_quantizelinear(dtype: str, gran: str) -> None:
    """Random values, exact ties at k + 0.5 steps and values past the range (saturation)."""
    rng = np.random.default_rng(5)
    shape = [3, 8, 6]
    scale = _scales(rng, shape, gran)
    zp = _zero_points(rng, dtype, scale)
    steps = rng.uniform(-300, 300, size=shape)
    steps[0] = np.round(steps[0]) + 0.5  # ties at k + 0.5 steps (most exact in float32: checked below)
    steps[1, 0] = [1e3, -1e3, 1e5, -1e5, 6e4, -6e4]  # past every type's range: saturation
    axis, group = _GRANULARITY[gran]
    x = (steps * _broadcast(scale, len(shape), axis, group)).astype(np.float32)
    divided = (x / np.broadcast_to(_broadcast(scale, len(shape), axis, group), shape))[0]
    if not dtype.startswith("float8"):  # most of row 0 are exact ties in float32
        assert (np.abs(divided - np.floor(divided)) == 0.5).mean() > 0.5
    zp_proto = None if zp is None else _onnx_codes("zp", dtype, zp)
    scale_proto = numpy_helper.from_array(scale, "s")
    attrs = {} if axis is None else {"axis": axis, **({"block_size": group} if group else {})}
    if zp is None:  # without a zero point the output type is uint8 unless told
        attrs["output_dtype"] = _ELEM[dtype]
    cast = "float32" if dtype.startswith("float8") else ("int8" if dtype in ("int4",) else
                                                          "uint8" if dtype == "uint4" else None)
    theirs = ort_run("QuantizeLinear", [("x", x), ("s", scale_proto), ("zp", zp_proto)], attrs, out=dtype,
                     cast_to=cast)
    ours = nq.quantize(T(x), T(scale), None if zp is None else T(zp), dtype=dtype, axis=axis, group_size=group)
    if dtype.startswith("float8"):
        assert torch.equal(ours.to(torch.float32), T(theirs))
    elif dtype in ("int4", "uint4"):
        assert torch.equal(ours, _packed_by_onnx(dtype, theirs))
    else:
        _assert_codes_equal(ours, theirs)


@pytest.mark.parametrize(("dtype", "gran"), _Q_CASES, ids=[f"{d}-{g}" for d, g in _Q_CASES])
def test_dequantizelinear(dtype: str, gran: str) -> None:
    rng = np.random.default_rng(6)
    shape = [3, 8, 6]
    scale = _scales(rng, shape, gran)
    zp = _zero_points(rng, dtype, scale)
    axis, group = _GRANULARITY[gran]
    if dtype.startswith("float8"):
        values = torch.randn(shape, generator=torch.Generator().manual_seed(6)).mul(40).to(getattr(torch, dtype))
        codes_np, ours_in = values.to(torch.float32).numpy(), values
    else:
        codes_np = _codes(rng, "int8" if dtype == "int4" else "uint8" if dtype == "uint4" else dtype, shape,
                          lo={"int4": -8, "uint4": 0}.get(dtype), hi={"int4": 7, "uint4": 15}.get(dtype))
        ours_in = _packed_by_onnx(dtype, codes_np) if dtype in ("int4", "uint4") else T(codes_np)
    attrs = {} if axis is None else {"axis": axis, **({"block_size": group} if group else {})}
    theirs = ort_run("DequantizeLinear", [("q", _onnx_codes("q", dtype, codes_np)), ("s", scale),
                                          ("zp", None if zp is None else _onnx_codes("zp", dtype, zp))], attrs,
                     out="float32", feeds=())
    ours = nq.dequantize(ours_in, T(scale), None if zp is None else T(zp), dtype=dtype, axis=axis, group_size=group)
    assert torch.equal(ours, T(theirs))


# -- com.microsoft MatMulNBits (weight-only 4-bit, float output) ------------------------------------------------

@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("with_zp", [False, True], ids=["no_zp", "zp"])
def test_matmulnbits(block: int, with_zp: bool) -> None:
    """DQGEMM (uint4 weight [N, K] packed, per group of ``block`` along K) against MatMulNBits; float32 results
    compared with a tolerance (onnxruntime's kernel sums in another order). Without zero points MatMulNBits
    takes 8 (the middle of uint4)."""
    rng = np.random.default_rng(block + with_zp)
    m, k, n = 4, 256, 48
    x = rng.standard_normal((m, k)).astype(np.float32)
    codes = _codes(rng, "uint8", [n, k], lo=0, hi=15)
    groups = k // block
    scale = rng.uniform(1e-3, 2e-2, size=(n, groups)).astype(np.float32)
    zp = _codes(rng, "uint8", [n, groups], lo=0, hi=15) if with_zp else np.full((n, groups), 8, np.uint8)
    packed = _packed_by_onnx("uint4", codes)  # [n, k/2]: MatMulNBits' B is the same bytes as [n, groups, block/2]
    zp_packed = _packed_by_onnx("uint4", zp).numpy().reshape(-1) if with_zp else None
    theirs = ort_run("MatMulNBits", [("x", x), ("b", packed.numpy().reshape(n, groups, block // 2)),
                                     ("s", scale.reshape(-1)), ("zp", zp_packed)],
                     dict(K=k, N=n, bits=4, block_size=block), out="float32", domain="com.microsoft")
    ours = nq.dqgemm(T(x), packed, T(scale), T(zp), w_dtype="uint4", axis=1, group_size=block, has_zero_point=True)
    reference = T(x).double() @ ((T(codes).double() - T(zp).double().repeat_interleave(block, 1))
                                 * T(scale).double().repeat_interleave(block, 1)).t()
    torch.testing.assert_close(ours, T(theirs), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.double(), reference, rtol=1e-5, atol=1e-5)
