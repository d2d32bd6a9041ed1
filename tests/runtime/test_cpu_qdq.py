"""QUANTIZE and DEQUANTIZE on the CPU backend (``npu_runtime.backends.cpu_qelementwise``: Quantize, Dequantize; the
C kernel ``qelementwise.c``): bit for bit ``torch_ir.quant.numerics`` on every ISA this CPU runs (ties, saturation,
-0, inf, NaN, subnormals, odd sizes, per channel, bfloat16/float16 inputs, bfloat16 outputs), on every layout the
arena hands it, and through the executor; the reference itself is checked against torch's quantized tensors and
onnxruntime's QuantizeLinear / DequantizeLinear where their arithmetic is the same."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from npu_program.program import Dispatch, TensorSpec
from npu_runtime.backends import cpu_qelementwise
from npu_runtime.backends.cpu_kernels import Reference, make_kernel
from tests.native import isa_fixtures
from torch_ir.quant import numerics as qn

CODES = {"uint8": torch.uint8, "int8": torch.int8, "int32": torch.int32}
FLOATS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TINY = torch.finfo(torch.float32).tiny


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


qlib, isa = isa_fixtures(cpu_qelementwise, cpu_qelementwise.ISAS, "TORCH_IR_QDQ_ISA")


def _kernel(op: str, ins: list[torch.Tensor], out_dtype: torch.dtype, params: dict, weights: bool = True):
    names = ["x", "scale", "zp"][:len(ins)]
    specs = {n: TensorSpec(n, list(t.shape), _name(t.dtype)) for n, t in zip(names, ins)}
    specs["y"] = TensorSpec("y", list(ins[0].shape), _name(out_dtype))
    k = make_kernel(Dispatch(kernel=op, node="n", inputs=names, outputs=["y"], params=params), specs,
                    set(names[1:]) if weights else set())
    k.prepare(dict(zip(names[1:], ins[1:])))
    return k


def _special(n: int, scale: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """``n`` float32 values: random ones over and past the codes' range, exact ties (x / scale = k + 0.5), ±0,
    ±inf, NaN and subnormals, in random places."""
    s = float(scale.reshape(-1)[0])  # per channel: ties of the first channel's scale (all of them with "halves")
    x = torch.randn(n, generator=g) * 200 * s
    picks = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), TINY / 8, -TINY / 3, TINY,
                          *(s * (k + 0.5) for k in range(-140, 260, 7)), 1e30, -1e30])
    where = torch.randint(0, n, (min(n, len(picks) * 2),), generator=g)
    x[where] = picks[torch.randint(0, len(picks), (len(where),), generator=g)]
    return x


# odd sizes (vector tails); the last spans four parallel chunks (64 Ki elements each: QDQ_CHUNK), with channel runs
# that straddle their edges
SHAPES = [(1,), (7,), (3, 37), (1, 5, 7, 9), (2, 17, 31, 33), (1, 3, 257, 263)]


def _params(shape: tuple, dtype: str, axis: int | None, scale_kind: str, g: torch.Generator) -> tuple:
    channels = 1 if axis is None else shape[axis]
    if scale_kind == "halves":  # x / scale lands on ties for the ties' picks, exactly
        scale = torch.full((channels,), 0.5)
    else:
        scale = torch.rand(channels, generator=g) * 0.05 + 1e-3
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    zp = torch.randint(lo, hi, (channels,), generator=g).to(CODES[dtype])
    return (scale.reshape(()), zp.reshape(())) if axis is None else (scale, zp)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_is_the_reference_bit_for_bit(shape: tuple, dtype: str, per_channel: bool, isa: str) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, dtype, per_channel)).encode()))
    axis = len(shape) // 2 if per_channel else None
    for method, scale_kind, x_dtype, bounds in (
            ("divide", "random", "float32", {}), ("divide", "halves", "float32", {}),
            ("multiply_inverse", "random", "float32", {"qmin": -127, "qmax": 127} if dtype == "int8" else {}),
            ("divide", "random", "bfloat16", {}), ("multiply_inverse", "halves", "float16", {})):
        scale, zp = _params(shape, dtype, axis, scale_kind, g)
        n = int(torch.tensor(shape).prod())
        x = _special(n, scale, g).reshape(shape).to(FLOATS[x_dtype])
        params = {"dtype": dtype, "axis": axis, "method": method, **bounds}
        want = qn.quantize(x, scale, zp, **params)
        k = _kernel("QUANTIZE", [x, scale, zp], CODES[dtype], params)
        assert isinstance(k, cpu_qelementwise.Quantize) and k.native
        y = torch.full(shape, 99, dtype=CODES[dtype])
        k.run([x, scale, zp], [y])
        assert torch.equal(y, want), (method, scale_kind, x_dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32"])
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_dequantize_is_the_reference_bit_for_bit(shape: tuple, dtype: str, out: str, isa: str) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, dtype, out)).encode()))
    for axis, zp_kind in ((None, "random"), (len(shape) - 1, "random"), (0, "none")):
        channels = 1 if axis is None else shape[axis]
        if dtype == "int32":  # a bias: codes past float32's 24 bits, to its rounding; zero points to int32's wrap
            q = torch.randint(-2 ** 31, 2 ** 31, shape, generator=g, dtype=torch.int64).to(torch.int32)
            zp = torch.randint(-2 ** 31, 2 ** 31, (channels,), generator=g, dtype=torch.int64).to(torch.int32)
        else:
            lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
            q = torch.randint(lo, hi, shape, generator=g).to(CODES[dtype])
            zp = torch.randint(lo, hi, (channels,), generator=g).to(CODES[dtype])
        # scales with subnormal products, and ones whose bfloat16 rounding meets ties
        scale = torch.tensor([1e-40, 3.0e38, 2.0 ** -8 * (1 + 2 ** -8)])[torch.randint(0, 3, (channels,),
                                                                                          generator=g)]
        scale = torch.where(torch.rand(channels, generator=g) < 0.5, scale, torch.rand(channels, generator=g))
        if axis is None:
            scale, zp = scale.reshape(()), zp.reshape(())
        ins = [q, scale] if zp_kind == "none" else [q, scale, zp]
        params = {"dtype": dtype, "axis": axis, "out_dtype": out}
        want = qn.dequantize(*ins, *[None] * (3 - len(ins)), **{**params, "out_dtype": FLOATS[out]})
        k = _kernel("DEQUANTIZE", ins, FLOATS[out], params)
        assert isinstance(k, cpu_qelementwise.Dequantize) and k.native
        y = torch.full(shape, 99.0, dtype=FLOATS[out])
        k.run(ins, [y])
        assert torch.equal(y, want) and torch.equal(y.isinf(), want.isinf()), (axis, zp_kind)


def test_nan_is_code_zero_as_torch_converts_it_and_every_special_value_is_covered(qlib) -> None:
    """The reference's NaN code is torch's float-to-integer conversion of NaN (0 on x86-64 and AArch64); the kernel
    writes it explicitly (a C cast of NaN is undefined), here checked against torch directly."""
    x = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0, TINY / 4, 2.5, 3.5, -2.5])
    for dtype, zp in (("uint8", torch.tensor(128, dtype=torch.uint8)), ("int8", torch.tensor(-3, dtype=torch.int8))):
        want = qn.quantize(x, torch.tensor(1.0), zp, dtype=dtype)
        assert want[:2].tolist() == [0, 0]  # torch's conversion, which the kernel follows
        assert want[2:].tolist() == [255 if dtype == "uint8" else 127, 0 if dtype == "uint8" else -128,
                                     *(int(zp) + v for v in (0, 0, 2, 4, -2))]
        y = torch.empty(x.shape, dtype=CODES[dtype])
        _kernel("QUANTIZE", [x, torch.tensor(1.0), zp], y.dtype, {"dtype": dtype}).run([x, torch.tensor(1.0), zp],
                                                                                      [y])
        assert torch.equal(y, want)


def test_pt2e_constants_float64_scale_int64_zero_point(isa: str) -> None:
    """PT2E's QUANTIZE: a Python-float scale as a float64 constant, an int64 zero point, qmin/qmax; the kernel reads
    them as the reference does (the scale rounded to float32, its inverse from float64)."""
    g = torch.Generator().manual_seed(11)
    scale, zp = torch.tensor(0.0123456789, dtype=torch.float64), torch.tensor(-3, dtype=torch.int64)
    x = _special(5000, scale.float(), g)
    params = {"dtype": "int8", "method": "multiply_inverse", "qmin": -127, "qmax": 127}
    want = qn.quantize(x, scale, zp, **params)
    k = _kernel("QUANTIZE", [x, scale, zp], torch.int8, params)
    assert isinstance(k, cpu_qelementwise.Quantize) and k.native
    y = torch.empty(x.shape, dtype=torch.int8)
    k.run([x, scale, zp], [y])
    assert torch.equal(y, want) and int(y.min()) >= -127


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as the CPU arena holds a 4-D NHWC tensor: a strided NCHW view of NHWC bytes."""
    return t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


@pytest.mark.parametrize("layout", ["nhwc", "nhwc_in", "nhwc_out", "transposed_out", "sliced_in"])
@pytest.mark.parametrize("op", ["QUANTIZE", "DEQUANTIZE"])
def test_every_layout_the_arena_hands_it(layout: str, op: str, isa: str) -> None:
    g = torch.Generator().manual_seed(zlib.crc32((layout + op).encode()))
    shape = (2, 24, 7, 5)
    scale, zp = torch.rand(24, generator=g) + 0.01, torch.randint(0, 256, (24,), generator=g).to(torch.uint8)
    if op == "QUANTIZE":
        x, out_dtype, params = torch.randn(shape, generator=g) * 50, torch.uint8, {"dtype": "uint8", "axis": 1}
        want = qn.quantize(x, scale, zp, **params)
    else:
        x = torch.randint(0, 256, shape, generator=g).to(torch.uint8)
        out_dtype, params = torch.float32, {"dtype": "uint8", "axis": 1}
        want = qn.dequantize(x, scale, zp, **params)
    k = _kernel(op, [x, scale, zp], out_dtype, params)
    run_x, y = x, torch.full(shape, 99, dtype=out_dtype)
    if layout in ("nhwc", "nhwc_in"):
        run_x = _nhwc(x)
    if layout == "sliced_in":  # not dense: read through a copy
        run_x = torch.cat([x, x], dim=3)[..., ::2]
        want = (qn.quantize if op == "QUANTIZE" else qn.dequantize)(run_x, scale, zp, **params)
    if layout in ("nhwc", "nhwc_out"):
        y = _nhwc(y)
    if layout == "transposed_out":
        y = torch.full(shape[::-1], 99, dtype=out_dtype).permute(3, 2, 1, 0)
    k.run([run_x, scale, zp], [y])
    assert torch.equal(y, want)


def test_an_output_overlapping_its_input_is_written_through_a_temporary(isa: str) -> None:
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 256, (4096,), generator=g).to(torch.uint8)
    buf = torch.zeros(4096 * 4 + 64, dtype=torch.uint8)
    buf[:4096] = codes  # the float32 result starts on the codes and runs past them
    scale, zp = torch.tensor(0.1), torch.tensor(3, dtype=torch.uint8)
    want = qn.dequantize(codes, scale, zp, dtype="uint8")
    y = buf[:4096 * 4].view(torch.float32)
    _kernel("DEQUANTIZE", [codes, scale, zp], torch.float32, {"dtype": "uint8"}).run([buf[:4096], scale, zp], [y])
    assert torch.equal(y, want)


@pytest.mark.parametrize("case", ["runtime_scale", "group", "int4", "int16", "float64_x", "zero_scale",
                                  "crossed_bounds"])
def test_what_it_does_not_run_exactly_keeps_the_reference(case: str, qlib) -> None:
    x, scale, zp = torch.randn(4, 8), torch.tensor(0.1), torch.tensor(3, dtype=torch.uint8)
    params, weights = {"dtype": "uint8"}, True
    if case == "runtime_scale":
        weights = False
    elif case == "group":
        scale, zp, params = torch.full((4, 2), 0.1), torch.zeros(4, 2, dtype=torch.uint8), \
            {"dtype": "uint8", "axis": 1, "group_size": 4}
    elif case in ("int4", "int16"):
        zp, params = torch.tensor(0, dtype=torch.int8 if case == "int4" else torch.int16), {"dtype": case}
    elif case == "float64_x":
        x = x.double()
    elif case == "zero_scale":
        scale = torch.tensor(0.0)
    else:
        params = {"dtype": "uint8", "qmin": 200, "qmax": 100}
    out = qn.storage_dtype(params["dtype"])
    k = _kernel("QUANTIZE", [x, scale, zp], out, params, weights=weights)
    want = qn.quantize(x, scale, zp, **params)
    assert isinstance(k, Reference) or not k.native
    y = torch.empty(want.shape, dtype=want.dtype)
    k.run([x, scale, zp], [y])
    assert torch.equal(y, want)


# ------------------------------------------------------------------ the reference against torch and onnxruntime


def test_the_reference_is_torchs_quantize_ops() -> None:
    """multiply_inverse is PyTorch's quantized_decomposed quantize_per_tensor (PT2E) on every value, NaN and inf
    included, and torch.quantize_per_tensor's quantized tensors on finite ones with a zero point of 0 (FBGEMM fuses
    ``x · inv + zp`` into one fma before rounding, which differs at ties when zp is not 0); dequantize is
    (q - zp) · scale in float32 in all."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

    g = torch.Generator().manual_seed(7)
    for dtype, qdtype in (("uint8", torch.quint8), ("int8", torch.qint8)):
        lo, hi, zp = (0, 255, 100) if dtype == "uint8" else (-128, 127, -7)
        for scale in (0.5, 0.0123, 0.1, 3.0):
            s = torch.tensor(scale)
            x = _special(4099, s, g)
            ours = qn.quantize(x, s, torch.tensor(zp), dtype=dtype, method="multiply_inverse")
            pt2e = torch.ops.quantized_decomposed.quantize_per_tensor(x, float(s), zp, lo, hi, CODES[dtype])
            assert torch.equal(pt2e, ours)
            x = x[x.isfinite()]
            q = torch.quantize_per_tensor(x, float(s), 0, qdtype)
            assert torch.equal(q.int_repr(), qn.quantize(x, s, torch.tensor(0), dtype=dtype,
                                                         method="multiply_inverse"))
            assert torch.equal(q.dequantize(), qn.dequantize(q.int_repr(), s, torch.tensor(0), dtype=dtype))


def test_the_reference_is_onnxruntimes_quantize_and_dequantize_linear() -> None:
    import onnxruntime as ort

    g = torch.Generator().manual_seed(8)
    scale, zp = np.float32(0.0173), np.uint8(131)
    x = _special(8191, torch.tensor(scale), g)
    x = x[x.isfinite()].numpy()
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(x)])],
                              [helper.make_tensor_value_info("q", TensorProto.UINT8, [len(x)]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [len(x)])],
                              [numpy_helper.from_array(np.array(scale), "s"),
                               numpy_helper.from_array(np.array(zp), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    q, y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    ours = qn.quantize(torch.from_numpy(x), torch.tensor(scale), torch.tensor(zp), dtype="uint8")
    assert torch.equal(torch.from_numpy(q), ours)
    assert torch.equal(torch.from_numpy(y), qn.dequantize(ours, torch.tensor(scale), torch.tensor(zp), dtype="uint8"))


# ----------------------------------------------------------------------------------------------- the executor


def _qdq_model() -> onnx.ModelProto:
    """x -> Q (uint8, per tensor) -> DQ -> Mul -> Q (int8, per channel, axis 1) -> DQ: QUANTIZE and DEQUANTIZE as
    the importer makes them, one of them per channel on an NCHW tensor (stored NHWC by the CPU arena)."""
    c = 6
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s0"),
             numpy_helper.from_array(np.array(121, np.uint8), "z0"),
             numpy_helper.from_array(np.linspace(0.01, 0.2, c).astype(np.float32), "s1"),
             numpy_helper.from_array(np.arange(-3, 3).astype(np.int8), "z1"),
             numpy_helper.from_array(np.array(1.7, np.float32), "k")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             helper.make_node("DequantizeLinear", ["q0", "s0", "z0"], ["d0"]),
             helper.make_node("Mul", ["d0", "k"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "s1", "z1"], ["q1"], axis=1),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 9, 11])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 9, 11])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_a_compiled_qdq_program_equals_the_reference_executor_bit_for_bit(qlib, monkeypatch) -> None:
    import npu_compiler
    from npu_runtime import Device, Executor, NPUBuffer, load_weights
    from torch_ir import IRExecutor
    from torch_ir.frontends.onnx import import_onnx

    calls = {"QUANTIZE": 0, "DEQUANTIZE": 0}
    native_call = cpu_qelementwise._QuantizeOrDequantize._call

    def counted(self, *args):
        calls[self.kind] += 1
        return native_call(self, *args)

    monkeypatch.setattr(cpu_qelementwise._QuantizeOrDequantize, "_call", counted)
    ir, weights = import_onnx(_qdq_model())
    g = torch.Generator().manual_seed(9)
    x = _special(6 * 9 * 11, torch.tensor(0.05), g).reshape(1, 6, 9, 11)
    (want,) = IRExecutor(ir, weights).run([x])
    program = npu_compiler.compile(ir, target="cpu")
    device = Device()
    bound = load_weights(weights, program, device)
    spec = program.input_specs[0]
    out = Executor(program, device).run({spec.name: NPUBuffer.from_numpy(x.numpy(), device, spec=spec)},
                                        weights=bound)
    got = torch.from_numpy(out[program.output_specs[0].name].to_numpy())
    assert calls["QUANTIZE"] >= 2 and calls["DEQUANTIZE"] >= 1, calls
    assert torch.equal(got, want)
