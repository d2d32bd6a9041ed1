"""The WebGPU int8 kernels (QUANTIZE, DEQUANTIZE, QGEMM, QCONV, QADD, QMAXPOOL, QLUT) bit-exact against the ops'
reference (``torch_ir.ops.npu_quant``) on the same tensors, on both dot-product paths; the exact f32 helpers against
numpy; and onnxruntime QDQ models compiled for WebGPU giving the reference executor's and the CPU backend's codes."""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import npu_compiler
from npu_compiler.errors import CompileError
from npu_runtime import Device, Executor, NPUBuffer, load_weights
from npu_runtime.backends.webgpu import gpu as webgpu_gpu
from npu_runtime.backends.webgpu.contraction.qcontraction import MAX_K
from npu_runtime.backends.webgpu.quant import EXACT_F32
from npu_runtime.device import RuntimeInputError
from tests.webgpu.kernels import needs_gpu, run_kernel
from torch_ir import IRExecutor

pytestmark = needs_gpu

_RANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


@pytest.fixture(params=["dot4", "emulated"])
def dot_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both dot-product paths: WGSL's dot4I8Packed where the device has it, and the emulation (forced)."""
    if request.param == "emulated":
        monkeypatch.setattr(webgpu_gpu, "USE_PACKED_DOT4", False)
    elif not webgpu_gpu.has_packed_dot4(webgpu_gpu.get_gpu()):
        pytest.skip("this adapter's WGSL has no packed 4x8-bit dot products")
    return request.param


def codes(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, extreme: bool = False) -> torch.Tensor:
    lo, hi = _RANGE[dtype]
    if extreme:  # only the two ends of the range: the largest products and corrections
        return torch.where(torch.rand(shape, generator=g) < 0.5, lo, hi).to(dtype)
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32).to(dtype)


def assert_exact(name: str, values: list[torch.Tensor], params: dict[str, Any], weights: tuple[int, ...] = ()) -> Any:
    got, expected, program = run_kernel(name, values, params, weights)
    assert got[0].dtype == expected[0].dtype
    mismatched = (got[0] != expected[0]).sum().item()
    assert mismatched == 0, f"{mismatched} of {expected[0].numel()} differ: {got[0].flatten()[:8]} vs " \
                            f"{expected[0].flatten()[:8]}"
    return program


def shader_code(program: Any) -> str:
    """The WGSL of a one-dispatch program's kernel as this device generates it now."""
    return Executor(program, Device("webgpu")).kernels[0].shaders[0].code


# -- the exact f32 helpers against numpy (correctly rounded division and int -> float conversion) ---------------

def _run_wgsl(body: str, a: np.ndarray, b: np.ndarray, out_type: str) -> np.ndarray:
    gpu = webgpu_gpu.get_gpu()
    wgpu, device = gpu.wgpu, gpu.device
    n = len(a)
    code = (f"@group(0) @binding(0) var<storage, read_write> a: array<{'i32' if a.dtype == np.int32 else 'f32'}>;\n"
            "@group(0) @binding(1) var<storage, read_write> b: array<f32>;\n"
            f"@group(0) @binding(2) var<storage, read_write> o: array<{out_type}>;\n{EXACT_F32}\n"
            f"@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) {{\n"
            f"  let i = id.x; if (i >= {n}u) {{ return; }} o[i] = {body}; }}")
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    bufs = [device.create_buffer_with_data(data=a.tobytes(), usage=usage),
            device.create_buffer_with_data(data=b.tobytes(), usage=usage),
            device.create_buffer(size=4 * n, usage=usage)]
    pipeline = device.create_compute_pipeline(layout="auto", compute={
        "module": device.create_shader_module(code=code), "entry_point": "main"})
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
        {"binding": i, "resource": {"buffer": buf}} for i, buf in enumerate(bufs)])
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(-(-n // 64))
    compute.end()
    device.queue.submit([encoder.finish()])
    return np.frombuffer(device.queue.read_buffer(bufs[2]), dtype=np.float32 if out_type == "f32" else np.int32)


def test_div_rne_is_the_correctly_rounded_quotient() -> None:
    rng = np.random.default_rng(0)
    b = np.exp2(rng.uniform(-20, 20, 20000)).astype(np.float32) * rng.choice([-1, 1], 20000).astype(np.float32)
    k = rng.integers(-300, 300, 20000).astype(np.float32)
    mid = ((k + 0.5) * b).astype(np.float32)  # quotients at and next to the halfway points of round()
    a = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf)),
                        (rng.standard_normal(20000) * 1e3).astype(np.float32), np.float32([0.0, -0.0, 1.0, 3.0])])
    b = np.concatenate([b, b, b, b, np.float32([3.0, 7.0, 3.0, 3.0])])
    got = _run_wgsl("div_rne(a[i], b[i])", a, b, "f32")
    want = a / b  # numpy's float32 division is IEEE's, correctly rounded
    assert np.array_equal(got.view(np.int32), want.view(np.int32)), np.flatnonzero(got != want)[:5]


def test_i2f_rounds_to_nearest_even() -> None:
    rng = np.random.default_rng(1)
    wide = rng.integers(-2 ** 31, 2 ** 31, 20000, dtype=np.int64)
    ties = (rng.integers(2 ** 24, 2 ** 30, 2000) | 1) * 1  # odd values past 2**24: halfway ones at 2**25 and up
    v = np.concatenate([wide, ties, -ties, [2 ** 31 - 1, -2 ** 31, 16777217, -16777217, 33554435, 0]]).astype(np.int32)
    # "+ b[i]" (zeros, exact) keeps binding 1 in the pipeline's automatic layout
    got = _run_wgsl("i2f(a[i]) + b[i]", v, np.zeros(len(v), np.float32), "f32")
    assert np.array_equal(got, v.astype(np.float32))


# -- QUANTIZE and DEQUANTIZE ----------------------------------------------------------------------------------

def _halfway(scale: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """x = (k + 0.5) · scale and its float32 neighbours, beside random values and ones far out of range."""
    k = torch.randint(-200, 200, (n,), generator=g).float()
    mid = (k + 0.5) * scale
    up, down = torch.nextafter(mid, torch.tensor(1e30)), torch.nextafter(mid, torch.tensor(-1e30))
    return torch.cat([mid, up, down, torch.randn(n, generator=g) * 50, torch.tensor([1e9, -1e9, 0.0, -0.0])])


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("method", ["divide", "multiply_inverse"])
def test_quantize_per_tensor_at_halfway_values(dtype: str, method: str) -> None:
    g = torch.Generator().manual_seed(2)
    for scale in (0.1, 0.037, 1 / 3, 2.5e-3):
        s = torch.tensor(scale)
        x = _halfway(s, 300, g).reshape(4, -1)
        zp = torch.tensor(3 if dtype == "int8" else 128, dtype=getattr(torch, dtype))
        assert_exact("QUANTIZE", [x, s, zp], {"dtype": dtype, "method": method})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_channel(axis: int) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 7, generator=g) * 4
    n = x.shape[axis]
    s = torch.rand(n, generator=g) * 0.1 + 0.01
    x = x + 0.5 * s.reshape([-1 if d == axis % 3 else 1 for d in range(3)])  # near halfway points
    assert_exact("QUANTIZE", [x, s, codes((n,), torch.int8, g)],
                 {"dtype": "int8", "axis": axis, "qmin": -127, "qmax": 127})
    assert_exact("QUANTIZE", [x.to(torch.bfloat16), s], {"dtype": "uint8", "axis": axis})


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32"])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
def test_dequantize(dtype: str, out_dtype: str) -> None:
    g = torch.Generator().manual_seed(4)
    if dtype == "int32":  # a bias: values past 2**24, where the conversion to float32 rounds
        q = torch.randint(-2 ** 31, 2 ** 31 - 1, (4, 9), generator=g, dtype=torch.int64).to(torch.int32)
        zp = torch.zeros(9, dtype=torch.int32)
    else:
        q, zp = codes((4, 9), getattr(torch, dtype), g), codes((9,), getattr(torch, dtype), g)
    s = torch.rand(9, generator=g) * 0.1
    assert_exact("DEQUANTIZE", [q, s, zp], {"dtype": dtype, "axis": 1, "out_dtype": out_dtype})
    assert_exact("DEQUANTIZE", [q, s[:1].reshape(()), zp[:1].reshape(())], {"dtype": dtype, "out_dtype": out_dtype})


def test_quantize_and_dequantize_per_group() -> None:
    g = torch.Generator().manual_seed(8)
    x, s, zp = torch.randn(4, 8, generator=g) * 3, torch.rand(4, 2, generator=g) + 0.1, codes((4, 2), torch.uint8, g)
    assert_exact("QUANTIZE", [x, s, zp], {"dtype": "uint8", "axis": 1, "group_size": 4})
    q = codes((4, 8), torch.int8, g)
    assert_exact("DEQUANTIZE", [q, s, zp.to(torch.int8) // 2], {"dtype": "int8", "axis": 1, "group_size": 4})


def test_compile_for_webgpu_refuses_codes_it_has_no_kernel_for() -> None:
    x, s = torch.randn(4, 8), torch.rand(4, 2) + 0.1
    with pytest.raises(CompileError, match="int4"):
        run_kernel("QUANTIZE", [x, s], {"dtype": "int4", "axis": 1, "group_size": 4})
    g = torch.Generator().manual_seed(10)
    values = [codes((2, 8), torch.uint8, g), codes((3, 8), torch.int8, g), torch.tensor(0.1),
              torch.tensor(3, dtype=torch.int64), torch.tensor(0.1), torch.tensor(0, dtype=torch.int8)]
    with pytest.raises(CompileError, match="zero point 'in3' is int64, not its codes' uint8"):
        run_kernel("QGEMM", values, {"out_dtype": "int32"}, weights=(1,))


# -- QGEMM and QCONV ------------------------------------------------------------------------------------------

def _epilogue(n: int, out: str, bias: str | None, g: torch.Generator) -> list[torch.Tensor]:
    values = []
    if bias == "int32":
        values.append(torch.randint(-5000, 5000, (n,), generator=g, dtype=torch.int32))
    elif bias == "float32":
        values.append(torch.randn(n, generator=g) * 0.5)
    if out in ("int8", "uint8"):
        values += [torch.tensor(0.05), codes((), getattr(torch, out), g)]
    return values


_GEMMS = [  # x shape, w shape, trans_b, x dtype, w dtype, per-channel w, out, bias, relu
    ((5, 16), (8, 16), True, torch.int8, torch.int8, True, "int8", "int32", False),
    ((3, 13), (7, 13), True, torch.uint8, torch.int8, True, "uint8", "float32", True),
    ((2, 4, 12), (6, 12), True, torch.uint8, torch.uint8, False, "int32", None, False),
    ((4, 12), (12, 6), False, torch.int8, torch.uint8, True, "float32", "int32", True),
    ((2, 3, 9), (2, 9, 5), False, torch.uint8, torch.int8, False, "uint8", None, True),
    ((1, 40), (9, 40), True, torch.int8, torch.int8, True, "int8", None, True),
]


@pytest.mark.parametrize("case", _GEMMS, ids=[f"{c[0]}x{c[1]}-{c[6]}" for c in _GEMMS])
@pytest.mark.parametrize("extreme", [False, True])
def test_qgemm(case: tuple, extreme: bool, dot_path: str) -> None:
    xs, ws, trans_b, xd, wd, per_channel, out, bias, relu = case
    g = torch.Generator().manual_seed(5)
    n = ws[-2] if trans_b else ws[-1]
    k = (n if per_channel else 1,)
    values = [codes(xs, xd, g, extreme), codes(ws, wd, g, extreme), torch.tensor(0.02), codes((), xd, g),
              torch.rand(k, generator=g) * 0.01 + 1e-3, codes(k, wd, g), *_epilogue(n, out, bias, g)]
    if extreme:  # zero points at the far ends too: centred operands of magnitude 255
        values[3] = torch.tensor(_RANGE[xd][0], dtype=xd)
    params = {"trans_b": trans_b, "w_dtype": str(wd).removeprefix("torch."), "has_bias": bias is not None,
              "out_dtype": out, "activation": "relu" if relu else None}
    program = assert_exact("QGEMM", values, params, weights=(1, 4, 5, 6) if bias else (1, 4, 5))
    assert ("dot4I8Packed" in shader_code(program)) == (dot_path == "dot4")


_CONVS = [  # x shape, w shape, stride, padding, dilation, groups, x dtype, w dtype, out
    ((1, 3, 9, 9), (4, 3, 3, 3), [1, 1], [1, 1], [1, 1], 1, torch.uint8, torch.int8, "uint8"),
    ((2, 6, 7, 9), (4, 3, 3, 3), [2, 1], [1, 2], [1, 2], 2, torch.uint8, torch.uint8, "int8"),
    ((1, 8, 8, 8), (8, 1, 3, 3), [2, 2], [1, 1], [1, 1], 8, torch.int8, torch.int8, "int32"),  # depthwise
    ((1, 8, 5, 5), (12, 8, 1, 1), [1, 1], [0, 0], [1, 1], 1, torch.uint8, torch.int8, "float32"),
    ((2, 8, 1, 1), (12, 8, 1, 1), [1, 1], [0, 0], [1, 1], 1, torch.uint8, torch.int8, "int8"),  # whole words
    ((1, 5, 6, 6), (7, 5, 2, 3), [1, 2], [0, 1], [1, 1], 1, torch.int8, torch.uint8, "uint8"),  # odd channels
]


@pytest.mark.parametrize("case", _CONVS, ids=[f"{c[0]}-{c[1]}-g{c[5]}-{c[8]}" for c in _CONVS])
@pytest.mark.parametrize("per_channel", [True, False])
def test_qconv(case: tuple, per_channel: bool, dot_path: str) -> None:
    xs, ws, stride, padding, dilation, groups, xd, wd, out = case
    g = torch.Generator().manual_seed(6)
    k = (ws[0] if per_channel else 1,)
    values = [codes(xs, xd, g), codes(ws, wd, g), torch.tensor(0.03), codes((), xd, g),
              torch.rand(k, generator=g) * 0.01 + 1e-3, codes(k, wd, g), *_epilogue(ws[0], out, "int32", g)]
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
              "w_dtype": str(wd).removeprefix("torch."), "has_bias": True, "out_dtype": out, "activation": "relu"}
    assert_exact("QCONV", values, params, weights=(1, 4, 5, 6))


@pytest.mark.parametrize(("k", "whole"), [(16, True), (13, False)])
def test_aligned_rows_are_read_as_whole_words(k: int, whole: bool) -> None:
    """K a multiple of 4: x's and w's bytes are read a word at a time (the fast path the cases above cover), else
    put together byte by byte (the tail lanes holding x's zero point)."""
    g = torch.Generator().manual_seed(9)
    values = [codes((3, k), torch.uint8, g), codes((5, k), torch.int8, g), torch.tensor(0.1),
              codes((), torch.uint8, g), torch.tensor(0.1), torch.tensor(0, dtype=torch.int8)]
    program = assert_exact("QGEMM", values, {"out_dtype": "int32"}, weights=(1,))
    code = shader_code(program)
    assert ("return in0[(base + 4u * j) / 4u]" in code and "return in1[(base + 4u * j) / 4u]" in code) == whole


def test_qgemm_refuses_a_reduction_that_could_leave_int32() -> None:
    g = torch.Generator().manual_seed(7)
    k = MAX_K + 1
    values = [codes((1, k), torch.int8, g), codes((2, k), torch.int8, g), torch.tensor(0.1),
              torch.tensor(0, dtype=torch.int8), torch.tensor(0.1), torch.tensor(0, dtype=torch.int8)]
    with pytest.raises(RuntimeInputError, match="may leave i32"):
        run_kernel("QGEMM", values, {"out_dtype": "int32"}, weights=(1,))


# -- end to end: onnxruntime QDQ models -----------------------------------------------------------------------

def _qdq_model(tmp: Path, model: torch.nn.Module, xs: list[torch.Tensor]) -> Path:
    quantization = pytest.importorskip("onnxruntime.quantization")

    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter([{"x": x.numpy()} for x in xs])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (xs[0],), buffer, input_names=["x"], dynamo=False, opset_version=17)
    (tmp / "float.onnx").write_bytes(buffer.getvalue())
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on pre-processing
    quantization.quantize_static(tmp / "float.onnx", tmp / "qdq.onnx", Reader(),
                                 quant_format=quantization.QuantFormat.QDQ, per_channel=True,
                                 activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8)
    return tmp / "qdq.onnx"


def _run(ir: Any, weights: dict[str, torch.Tensor], x: torch.Tensor, target: str) -> tuple[torch.Tensor, Any]:
    program = npu_compiler.compile(ir, target=target)  # no fallback: every dispatch runs on the target
    device = Device(target)
    bound = load_weights({k: v.contiguous() for k, v in weights.items()}, program, device)
    feeds = {spec.name: NPUBuffer.from_numpy(x.numpy(), device, spec=spec) for spec in program.input_specs}
    out = Executor(program, device).run(feeds, weights=bound)
    return torch.from_numpy(out[program.output_specs[0].name].to_numpy()), program


class _Residual(torch.nn.Module):
    """A ResNet basic block: its add of two quantized tensors becomes QADD (relu fused)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.body = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(8, 8, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        return torch.relu(h + self.body(h))


_MODELS = {
    "residual": (_Residual, (1, 3, 12, 12)),
    "cnn": (lambda: torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), torch.nn.ReLU(),  # depthwise
        torch.nn.Conv2d(8, 12, 1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(12 * 8 * 8, 10)),
        (1, 3, 16, 16)),
    "mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(20, 33), torch.nn.ReLU(), torch.nn.Linear(33, 7)), (3, 20)),
    "pooled": (lambda: torch.nn.Sequential(  # a ResNet stem: its pool between a DEQUANTIZE and a QUANTIZE
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU()), (1, 3, 15, 15)),
}


@pytest.mark.parametrize("name", list(_MODELS))
def test_qdq_model_on_webgpu_gives_the_reference_codes(name: str, tmp_path: Path) -> None:
    """quantize_static's QDQ model, imported and normalized into QCONV/QGEMM, compiled for WebGPU: the output (a
    DEQUANTIZE of the last codes) equals the reference executor's and the CPU backend's exactly."""
    from npu_compiler.passes import normalize
    from torch_ir.frontends.onnx import import_onnx

    make, shape = _MODELS[name]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(*shape, generator=g) for _ in range(4)]
    ir, weights = import_onnx(_qdq_model(tmp_path, make().eval(), xs[:3]))
    ir = normalize(ir)
    ops = ir.op_histogram()
    assert ops.get("QCONV", 0) + ops.get("QGEMM", 0) >= {"cnn": 4, "mlp": 2, "residual": 3, "pooled": 2}[name], ops
    assert ops.get("QADD", 0) == (1 if name == "residual" else 0), ops
    assert ops.get("QMAXPOOL", 0) == (1 if name == "pooled" else 0), ops
    (expected,) = IRExecutor(ir, weights).run([xs[3]])
    got, program = _run(ir, weights, xs[3], "webgpu")
    kernels = {d.kernel for d in program.dispatches}
    assert {"QUANTIZE", "DEQUANTIZE", "QGEMM" if name in ("cnn", "mlp") else "QCONV"} <= kernels
    assert not any(d.host for d in program.dispatches)
    cpu, _ = _run(ir, weights, xs[3], "cpu")
    assert torch.equal(got, expected) and torch.equal(got, cpu)


def test_a_bias_that_could_overflow_the_sum_is_refused_when_bound() -> None:
    """The reference raises where bias + Σ leaves int32; the WGSL kernel would wrap, so a bias within K · 255² of
    int32's end is refused when the weights are bound (conservatively: these codes' own sum is 0), naming the fix."""
    g = torch.Generator().manual_seed(9)
    bias = torch.full((4,), 2 ** 31 - 1000, dtype=torch.int32)
    values = [torch.zeros(2, 16, dtype=torch.int8), codes((4, 16), torch.int8, g), torch.tensor(0.02),
              torch.tensor(0, dtype=torch.int8), torch.full((4,), 0.01), torch.zeros(4, dtype=torch.int8), bias]
    params = {"trans_b": True, "w_dtype": "int8", "has_bias": True, "out_dtype": "int32", "activation": None}
    with pytest.raises(RuntimeInputError, match=r"QGEMM .*int32 sum could overflow.*run the program on the CPU"):
        run_kernel("QGEMM", values, params, weights=(1, 4, 5, 6))
    values[6] = torch.full((4,), 2 ** 31 - 1 - 16 * 255 * 255, dtype=torch.int32)  # the largest bias that fits
    got, want, _ = run_kernel("QGEMM", values, params, weights=(1, 4, 5, 6))
    assert torch.equal(got[0], want[0])


# -- QADD, the quantized residual add ---------------------------------------------------------------------------

def _qadd_values(a_shape: tuple, b_shape: tuple, a_dtype: torch.dtype, b_dtype: torch.dtype, out: torch.dtype,
                 g: torch.Generator, scales: tuple[float, float, float]) -> list[torch.Tensor]:
    zps = [codes((), dt, g) for dt in (a_dtype, b_dtype, out)]
    return [codes(a_shape, a_dtype, g), torch.tensor(scales[0]), zps[0], codes(b_shape, b_dtype, g),
            torch.tensor(scales[1]), zps[1], torch.tensor(scales[2]), zps[2]]


@pytest.mark.parametrize("method", ["divide", "multiply_inverse"])
@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("types", [(torch.uint8, torch.uint8, torch.uint8), (torch.int8, torch.uint8, torch.int8),
                                   (torch.int8, torch.int8, torch.uint8)])
def test_qadd(types: tuple, activation: str | None, method: str) -> None:
    """Bit-exact with the reference QDQ chain, scales chosen so many sums land on halfway quotients (y's scale the
    sum of a's and b's: (ka·sa + kb·sb) / (sa + sb) is k + 0.5 whenever ka - kb is odd and sa = sb), broadcast b."""
    g = torch.Generator().manual_seed(11)
    params = {"out_dtype": str(types[2]).removeprefix("torch."), "activation": activation, "method": method}
    for scales in ((0.05, 0.05, 0.1), (0.031, 0.017, 0.043), (1 / 3, 0.2, 0.7)):
        values = _qadd_values((2, 3, 5, 7), (2, 3, 5, 7), *types, g, scales)
        assert_exact("QADD", values, params, weights=(1, 2, 4, 5, 6, 7))
    values = _qadd_values((2, 3, 5, 7), (3, 1, 7), *types, g, (0.05, 0.02, 0.04))
    assert_exact("QADD", values, params, weights=(1, 2, 4, 5, 6, 7))


def test_qadd_refuses_scales_outside_its_exact_range_when_bound() -> None:
    """Scales whose float32 steps could reach subnormal numbers (where WGSL may flush) are refused at bind, with the
    fix; a zero input scale is exact and runs."""
    g = torch.Generator().manual_seed(12)
    values = _qadd_values((4, 8), (4, 8), torch.uint8, torch.uint8, torch.uint8, g, (1e-35, 0.02, 0.04))
    with pytest.raises(RuntimeInputError, match=r"QADD .*a's scale is 1e-35.*run the program on the CPU backend"):
        run_kernel("QADD", values, {"out_dtype": "uint8"}, weights=(1, 2, 4, 5, 6, 7))
    values[1] = torch.tensor(0.0)
    assert_exact("QADD", values, {"out_dtype": "uint8"}, weights=(1, 2, 4, 5, 6, 7))


# -- QMAXPOOL, the quantized max pool ----------------------------------------------------------------------------

@pytest.mark.parametrize("types", [(torch.uint8, torch.uint8), (torch.int8, torch.int8), (torch.int8, torch.uint8)])
@pytest.mark.parametrize("method", ["divide", "multiply_inverse"])
def test_qmaxpool(types: tuple, method: str) -> None:
    """Bit-exact with the reference QDQ chain: x's scale positive (the largest code), negative (the smallest) and 0,
    y's the same or another; windows with padding, dilation and ceil_mode's partial ones."""
    g = torch.Generator().manual_seed(13)
    out = str(types[1]).removeprefix("torch.")
    windows = [([3, 3], [2, 2], [1, 1], [1, 1], False), ([3, 2], [2, 3], [1, 1], [2, 1], True)]
    for (k, s, p, d, ceil) in windows:
        params = {"kernel_size": k, "stride": s, "padding": p, "dilation": d, "ceil_mode": ceil, "out_dtype": out,
                  "method": method}
        for x_scale, y_scale in ((0.02, 0.02), (-0.02, 0.031), (0.0, 0.031), (0.017, 0.043)):
            values = [codes((2, 3, 9, 11), types[0], g), torch.tensor(x_scale), codes((), types[0], g),
                      torch.tensor(y_scale), codes((), types[1], g)]
            assert_exact("QMAXPOOL", values, params, weights=(1, 2, 3, 4))


def test_qmaxpool_refuses_scales_outside_its_exact_range_when_bound() -> None:
    g = torch.Generator().manual_seed(14)
    params = {"kernel_size": [2, 2], "stride": [2, 2], "padding": [0, 0], "dilation": [1, 1], "out_dtype": "uint8"}
    values = [codes((1, 2, 4, 4), torch.uint8, g), torch.tensor(1e-35), codes((), torch.uint8, g),
              torch.tensor(0.02), codes((), torch.uint8, g)]
    with pytest.raises(RuntimeInputError, match=r"QMAXPOOL .*x's scale is 1e-35.*run the program on the CPU backend"):
        run_kernel("QMAXPOOL", values, params, weights=(1, 2, 3, 4))


# -- QLUT, a quantized elementwise chain as a table --------------------------------------------------------------

@pytest.mark.parametrize("types", [(torch.uint8, torch.uint8), (torch.int8, torch.int8), (torch.int8, torch.uint8)])
@pytest.mark.parametrize("chain", [("mul erf", [0.7071067932881648]), ("gelu_tanh add sigmoid", [-0.5])])
def test_qlut(types: tuple, chain: tuple) -> None:
    """Bit-exact with the reference: the table is made on the host when the weights are bound; every code of x
    (its bytes as the shader reads them: int8 sign-extended, masked back to a byte) finds its entry."""
    g = torch.Generator().manual_seed(15)
    out = str(types[1]).removeprefix("torch.")
    for method in ("divide", "multiply_inverse"):
        values = [codes((2, 3, 7, 11), types[0], g), torch.tensor(0.043), codes((), types[0], g),
                  torch.tensor(0.0071), codes((), types[1], g)]
        params = {"functions": chain[0], "numbers": chain[1], "out_dtype": out, "method": method}
        assert_exact("QLUT", values, params, weights=(1, 2, 3, 4))


def test_qlut_needs_its_scales_bound() -> None:
    g = torch.Generator().manual_seed(16)
    values = [codes((4, 8), torch.uint8, g), torch.tensor(0.02), codes((), torch.uint8, g), torch.tensor(0.01),
              codes((), torch.uint8, g)]
    with pytest.raises(RuntimeInputError, match=r"QLUT .*bound before the first run.*CPU backend"):
        run_kernel("QLUT", values, {"functions": "erf", "numbers": [], "out_dtype": "uint8"}, weights=())


# -- QMUL, the quantized product ---------------------------------------------------------------------------------

@pytest.mark.parametrize("types", [(torch.uint8, torch.uint8, torch.uint8), (torch.int8, torch.uint8, torch.int8)])
@pytest.mark.parametrize("method", ["divide", "multiply_inverse"])
def test_qmul(types: tuple, method: str) -> None:
    """Bit-exact with the reference QDQ chain, y's shape and a broadcast operand; scales that put products on ties."""
    g = torch.Generator().manual_seed(17)
    params = {"out_dtype": str(types[2]).removeprefix("torch."), "method": method}
    for scales in ((0.05, 0.02, 0.04), (0.5, 0.25, 1.0)):
        values = _qadd_values((2, 3, 5, 7), (2, 3, 5, 7), *types, g, scales)
        assert_exact("QMUL", values, params, weights=(1, 2, 4, 5, 6, 7))
    values = _qadd_values((2, 3, 5, 7), (3, 1, 7), *types, g, (0.05, 0.02, 0.04))
    assert_exact("QMUL", values, params, weights=(1, 2, 4, 5, 6, 7))


def test_qmul_refuses_input_scales_whose_product_could_overflow() -> None:
    g = torch.Generator().manual_seed(18)
    values = _qadd_values((4, 8), (4, 8), torch.uint8, torch.uint8, torch.uint8, g, (2.0 ** 60, 0.02, 0.04))
    with pytest.raises(RuntimeInputError, match=r"QMUL .*a's scale is 1.15e\+18.*2\*\*-50, 2\*\*50"):
        run_kernel("QMUL", values, {"out_dtype": "uint8"}, weights=(1, 2, 4, 5, 6, 7))
