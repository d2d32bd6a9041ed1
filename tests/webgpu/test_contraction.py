"""The WebGPU contraction kernels (``npu_runtime.backends.webgpu.contraction``: GEMM, GATE_UP, QKV_PROJ, the
ATen matrix products and the convolutions) against their references, at the shapes the tiled kernel, the
GEMV kernel and the layouts could get wrong: sizes that are no multiple of a tile, size-1 dims, odd K (no
u32 word pairs), batch dims and broadcasting, transposed operands, 16-bit dtypes, NHWC and row-major images,
every convolution kind (strided, dilated, grouped, depthwise, 1x1), a CONV's residual add written over its residual,
and NaN through the fused activations as eager torch gives it.

Each distinct shape compiles its own shaders (a second or so on lavapipe), so the cases combine features."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import npu_compiler
from npu_compiler import CompileOptions
from npu_program.kernels import KernelTest
from npu_runtime import Device, Executor, NPUBuffer, load_weights
from npu_runtime.backends.webgpu.contraction import GEMV_ROWS
from npu_runtime.backends.webgpu.gpu import GPU
from npu_runtime.device import new_tensor
from tests.kernels.test_kernel_table import one_node_ir
from tests.webgpu.kernels import assert_kernel, needs_gpu, run_kernel
from torch_ir import IRExecutor
from torch_ir.activations import ACTIVATIONS
from torch_ir.ir import NPU_IR, OpNode, TensorMeta

pytestmark = needs_gpu

BF16, F16 = torch.bfloat16, torch.float16
CONV = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "has_bias": False, "bn_eps": None,
        "activation": None}


def rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def reference32(name: str, values: list[torch.Tensor], params: dict[str, Any],
                weights: tuple[int, ...]) -> list[torch.Tensor]:
    """The reference on the same values in float32: what a kernel that accumulates in float32 and rounds once
    should give (a 16-bit reference rounds after every op)."""
    values = [v.float() for v in values]
    test = KernelTest(tuple((tuple(v.shape), "*", "normal") for v in values), dict(params), weights)
    return IRExecutor(one_node_ir(name, test, values), {f"in{i}": values[i] for i in weights}).run(
        [v for i, v in enumerate(values) if i not in weights])


def assert_half(name: str, values: list[torch.Tensor], params: dict[str, Any], weights: tuple[int, ...] = ()) -> None:
    """16-bit inputs: the output within one rounding of the float32 result."""
    got, _, _ = run_kernel(name, values, params, weights)
    rtol = 8e-3 if values[0].dtype == BF16 else 1e-3
    for g, want in zip(got, reference32(name, values, params, weights)):
        torch.testing.assert_close(g.float(), want, rtol=rtol, atol=1e-3)


# -- GEMM ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("x", "w", "params", "extra"), [
    ((1, 1), (1, 1), {"has_bias": True, "activation": "relu"}, "bias"),  # M, N, K = 1, 1, 1: GEMV
    ((3, 33), (17, 33), {"has_bias": False, "activation": "gelu"}, ""),  # odd K and N: GEMV without word pairs
    ((70, 130), (65, 130), {"has_bias": True, "has_residual": True, "activation": "silu"}, "bias residual"),
    ((2, 35, 33), (33, 20), {"trans_b": False, "has_bias": True, "activation": "gelu_tanh"}, "bias"),
    ((2, 33, 37), (19, 33), {"trans_a": True, "has_bias": False, "activation": "relu6"}, ""),  # batched x^T
    ((1, 9, 3), (5, 9), {"trans_a": True, "has_bias": False, "has_residual": True}, "residual"),  # x^T, GEMV
])
def test_gemm(x, w, params, extra):
    x_, w_ = rand(*x), rand(*w, seed=1)
    trans_a, trans_b = params.get("trans_a", False), params.get("trans_b", True)
    rows = [*x[:-2], x[-1], x[-2]] if trans_a else list(x)
    out = [*rows[:-1], w[0] if trans_b else w[1]]
    values = [x_, w_] + ([rand(out[-1], seed=2)] if "bias" in extra else []) + \
        ([rand(*out, seed=3)] if "residual" in extra else [])
    assert_kernel("GEMM", values, {"trans_b": True, **params}, weights=(1, 2) if "bias" in extra else (1,),
                  atol=1e-4)


@pytest.mark.parametrize("m", range(1, GEMV_ROWS + 1))
def test_gemv_rows(m):
    """Every row count of the GEMV kernel, K odd (the elements one by one) and N past its 8 outputs per group."""
    assert_kernel("GEMM", [rand(1, m, 257), rand(300, 257, seed=1), rand(300, seed=2)], {"trans_b": True},
                  weights=(1, 2), atol=1e-4)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("rows", [3, 70])  # GEMV (u32 word pairs of x and w), tiled
def test_gemm_half(dtype, rows):
    values = [rand(1, rows, 130, dtype=dtype), rand(66, 130, dtype=dtype, seed=1), rand(66, dtype=dtype, seed=2),
              rand(1, rows, 66, dtype=dtype, seed=3)]
    assert_half("GEMM", values, {"trans_b": True, "has_bias": True, "has_residual": True, "activation": "gelu"},
                weights=(1, 2))


@pytest.mark.parametrize("rows", [3, 70])
def test_gemm_f16_as_words(monkeypatch, rows):
    """An adapter without shader-f16: float16 tensors are u32 words (two values each, unpack2x16float)."""
    monkeypatch.setattr(GPU, "has_f16", property(lambda self: False))
    values = [rand(1, rows, 130, dtype=F16), rand(66, 130, dtype=F16, seed=1)]
    assert_half("GEMM", values, {"trans_b": True}, weights=(1,))


def test_gemm_bf16_odd_rows():
    """bf16 weights whose rows start at odd elements (K odd): no word pairs, every element read alone."""
    assert_half("GEMM", [rand(2, 2, 31, dtype=BF16), rand(40, 31, dtype=BF16, seed=1)], {"trans_b": True},
                weights=(1,))


# -- GATE_UP and QKV_PROJ -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("x", "trans_b", "bias", "dtype"), [
    ((2, 40, 48), True, True, torch.float32),  # tiled
    ((1, 1, 64), True, False, BF16),  # GEMV, word pairs
    ((1, 2, 33), False, True, torch.float32),  # GEMV over [K, N] weights
])
def test_gate_up(x, trans_b, bias, dtype):
    n, k = 36, x[-1]
    shape = (n, k) if trans_b else (k, n)
    values = [rand(*x, dtype=dtype), rand(*shape, dtype=dtype, seed=1), rand(*shape, dtype=dtype, seed=2)]
    values += [rand(n, dtype=dtype, seed=3), rand(n, dtype=dtype, seed=4)] if bias else []
    params = {"trans_b": trans_b, "has_bias": bias}
    weights = tuple(range(1, len(values)))
    if dtype == torch.float32:
        assert_kernel("GATE_UP", values, params, weights=weights, atol=1e-4)
    else:
        assert_half("GATE_UP", values, params, weights=weights)


@pytest.mark.parametrize(("x", "packed", "dtype"), [((2, 6, 32), False, torch.float32), ((1, 1, 32), True, BF16)])
def test_qkv_heads_first_gqa(x, packed, dtype):
    """Grouped-query projections (4 query heads, 2 key/value heads of 8) stored head-major by the epilogue."""
    splits, k = [32, 16, 16], x[-1]
    weights = [rand(64, k, dtype=dtype, seed=1)] if packed else \
        [rand(s, k, dtype=dtype, seed=1 + j) for j, s in enumerate(splits)]
    biases = [rand(64, dtype=dtype, seed=5)] if packed else \
        [rand(32, dtype=dtype, seed=5), rand(16, dtype=dtype, seed=6)]
    values = [rand(*x, dtype=dtype), *weights, *biases]
    params = {"splits": splits, "has_bias": [True] if packed else [True, False, True], "trans_b": True,
              "packed": packed, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "heads_first": True}
    check = assert_half if dtype != torch.float32 else assert_kernel
    check("QKV_PROJ", values, params, weights=tuple(range(1, len(values))))


# -- ATen matrix products -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "a", "b"), [
    ("aten.matmul.default", (7,), (7,)),  # a dot product
    ("aten.matmul.default", (5, 7), (7,)),  # N = 1
    ("aten.matmul.default", (7,), (7, 9)),  # GEMV of a [K, N] matrix
    ("aten.matmul.default", (2, 1, 3, 4), (3, 4, 5)),  # broadcast batch dims
    ("aten.matmul.default", (67, 5), (2, 5, 66)),  # a matrix times a batch
    ("aten.mm.default", (70, 65), (65, 33)),
    ("aten.bmm.default", (3, 66, 17), (3, 17, 65)),
])
def test_matmul(name, a, b):
    assert_kernel(name, [rand(*a), rand(*b, seed=1)], {}, atol=1e-4)


def test_matmul_int32():
    a = torch.randint(-5, 5, (6, 7), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    assert_kernel("aten.mm.default", [a, a.t().contiguous()], {})


@pytest.mark.parametrize(("self_shape", "beta"), [((1, 5), 0.5), ((2, 3, 5), 0.0)])
def test_baddbmm(self_shape, beta):
    base = torch.full(self_shape, float("nan")) if beta == 0 else rand(*self_shape)  # beta 0 ignores self
    assert_kernel("aten.baddbmm.default", [base, rand(2, 3, 4, seed=1), rand(2, 4, 5, seed=2)],
                  {"beta": beta, "alpha": 2.0}, atol=1e-4)


# -- convolutions -------------------------------------------------------------------------------------------

def conv_values(x: tuple[int, ...], w: tuple[int, ...], params: dict[str, Any], residual: bool = False,
                dtype: torch.dtype = torch.float32) -> tuple[list[torch.Tensor], tuple[int, ...]]:
    """x, w, bias?, batch norm's four?, residual? (the weights' positions too)."""
    c = w[0]
    values = [rand(*x, dtype=dtype), rand(*w, dtype=dtype, seed=1)]
    if params.get("has_bias"):
        values.append(rand(c, dtype=dtype, seed=2))
    if params.get("bn_eps") is not None:
        values += [rand(c, dtype=dtype, seed=3), rand(c, dtype=dtype, seed=4), rand(c, dtype=dtype, seed=5),
                   (torch.rand(c, generator=torch.Generator().manual_seed(6)) + 0.5).to(dtype)]
    weights = tuple(range(1, len(values)))
    if residual:
        out = torch.nn.functional.conv2d(values[0].float(), values[1].float(), None, params["stride"],
                                         params["padding"], params["dilation"], params["groups"])
        values.append(rand(*out.shape, dtype=dtype, seed=7))
    return values, weights


@pytest.mark.parametrize(("x", "w", "params"), [
    ((1, 8, 9, 9), (32, 8, 3, 3), {"has_bias": True}),  # implicit GEMM, 3x3 stride 1
    ((2, 8, 10, 11), (24, 8, 3, 3), {"stride": [2, 2], "bn_eps": 1e-5, "activation": "relu"}),  # stride 2, bn
    ((1, 20, 7, 7), (70, 20, 1, 1), {"padding": [0, 0], "has_bias": True, "activation": "relu6"}),  # 1x1: a GEMM
    ((1, 16, 9, 9), (32, 16, 1, 1), {"padding": [0, 0], "stride": [2, 2], "bn_eps": 1e-3}),  # 1x1 stride 2
    ((1, 8, 12, 12), (16, 8, 3, 3), {"padding": [2, 2], "dilation": [2, 2]}),  # dilation 2
    ((1, 8, 6, 7), (32, 4, 3, 3), {"groups": 2, "has_bias": True}),  # groups as the GEMM's batch
    ((1, 8, 6, 7), (8, 4, 3, 3), {"groups": 2, "activation": "silu"}),  # narrow groups: the direct kernel
    ((2, 12, 7, 8), (12, 1, 3, 3), {"groups": 12, "stride": [2, 1], "bn_eps": 1e-5, "activation": "relu6"}),  # dw
])
def test_conv(x, w, params):
    values, weights = conv_values(x, w, {**CONV, **params})
    assert_kernel("CONV", values, {**CONV, **params}, weights=weights, atol=1e-4)


def test_conv_half():
    params = {**CONV, "has_bias": True, "activation": "relu"}
    values, weights = conv_values((1, 8, 6, 6), (16, 8, 3, 3), params, dtype=BF16)
    assert_half("CONV", values, params, weights)


@pytest.mark.parametrize("w", [(32, 8, 3, 3), (8, 1, 3, 3)])
def test_conv_row_major(w):
    """The generators follow the specs' layout: the same convolutions with every image row-major."""
    params = {**CONV, "groups": 8 // w[1], "has_bias": True, "has_residual": True}
    values, weights = conv_values((1, 8, 5, 6), w, params, residual=True)
    test = KernelTest(tuple((tuple(v.shape), "*", "normal") for v in values), params, weights)
    ir = one_node_ir("CONV", test, values)
    program = npu_compiler.compile(ir, target="webgpu",
                                   options=CompileOptions(normalize=False, fuse=False, public_output_names=False))
    for spec in [*program.tensors.values(), *program.input_specs, *program.output_specs]:
        assert spec.layout in ("NHWC", None)
        spec.layout = None
    got = run_program(program, values, weights)
    want = IRExecutor(ir, {f"in{i}": values[i] for i in weights}).run([values[0], values[-1]])
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("w", [(16, 16, 3, 3), (16, 1, 3, 3)])
def test_conv_add(w):
    params = {**CONV, "groups": 16 // w[1], "has_bias": True, "bn_eps": 1e-5, "has_residual": True,
              "activation": "relu"}
    values, weights = conv_values((1, 16, 6, 5), w, params, residual=True)
    assert_kernel("CONV", values, params, weights=weights, atol=1e-4)


@pytest.mark.parametrize("w", [(16, 16, 3, 3), (16, 1, 3, 3)])
def test_conv_add_in_place(w):
    """A CONV whose residual dies there writes its output over it (the memory plan aliases the two): each
    output element is read as residual and written by the same invocation."""
    groups = 16 // w[1]
    params = {**CONV, "groups": groups, "has_bias": False, "has_residual": True, "activation": "relu"}
    x, w0, w1 = rand(1, 16, 6, 5), rand(16, 16, 3, 3, seed=1) * 0.3, rand(*w, seed=2)
    meta = {name: TensorMeta(name, list(shape), "float32", role=role) for name, shape, role in [
        ("x", x.shape, "input"), ("w0", w0.shape, "weight"), ("w1", w1.shape, "weight"),
        ("r", x.shape, "activation"), ("y", x.shape, "activation")]}
    ir = NPU_IR(model_name="conv_add_in_place", graph_inputs=[meta["x"]], graph_outputs=[meta["y"]],
                weights=[meta["w0"], meta["w1"]], nodes=[
                    OpNode("c0", "CONV", [meta["x"], meta["w0"]], [meta["r"]], {**CONV}),
                    OpNode("c1", "CONV", [meta["x"], meta["w1"], meta["r"]], [meta["y"]], params)])
    program = npu_compiler.compile(ir, target="webgpu",
                                   options=CompileOptions(normalize=False, fuse=False, public_output_names=False))
    assert program.dispatches[1].params.get("inplace_residual") is True
    device = Device("webgpu")
    bound = load_weights({"w0": w0, "w1": w1}, program, device)
    outputs = Executor(program, device).run({"x": x.numpy()}, weights=bound)
    got = torch.from_numpy(outputs[program.output_specs[0].name].to_numpy())
    r = torch.nn.functional.conv2d(x, w0, None, 1, 1)
    want = torch.relu(torch.nn.functional.conv2d(x, w1, None, 1, 1, 1, groups) + r)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def run_program(program: Any, values: list[torch.Tensor], weights: tuple[int, ...]) -> list[torch.Tensor]:
    device = Device("webgpu")
    inputs = {s.name: NPUBuffer(new_tensor(device, s, values[int(s.name[2:])]), s, device) for s in program.input_specs}
    bound = load_weights({f"in{i}": values[i] for i in weights}, program, device)
    outputs = Executor(program, device).run(inputs, weights=bound)
    return [torch.from_numpy(outputs[s.name].to_numpy()) for s in program.output_specs]


# -- NaN through a fused activation: as eager torch gives it ------------------------------------------------------

def with_nans(t: torch.Tensor, *where: tuple[int, ...]) -> torch.Tensor:
    t = t.clone()
    for index in where:
        t[index] = float("nan")
    return t


def assert_nans_as_eager(got: torch.Tensor, eager: torch.Tensor) -> None:
    assert torch.isnan(eager).any(), "the case must give NaN in eager torch"
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4, equal_nan=True)  # NaN exactly where eager has it


@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("rows", [2, 15], ids=["gemv", "tiled"])
def test_gemm_with_a_fused_activation_keeps_nan_as_eager(rows, act):
    """WGSL's max, min and clamp may return either operand for NaN; the fused forms must not (relu(NaN) = NaN)."""
    x, w, b = with_nans(rand(1, rows, 16), (0, 0, 3)), rand(8, 16, seed=1), rand(8, seed=2)
    got, _, _ = run_kernel("GEMM", [x, w, b], {"trans_b": True, "has_bias": True, "activation": act}, weights=(1, 2))
    assert_nans_as_eager(got[0], ACTIVATIONS[act].reference(torch.nn.functional.linear(x, w, b)))


@pytest.mark.parametrize("act", ["relu", "relu6"])
@pytest.mark.parametrize("w", [(16, 16, 3, 3), (16, 1, 3, 3)], ids=["implicit_gemm", "direct"])
def test_conv_with_a_fused_clamp_keeps_nan_as_eager(w, act):
    groups = 16 // w[1]
    x, weight = with_nans(rand(1, 16, 6, 5), (0, 2, 3, 1)), rand(*w, seed=1)
    got, _, _ = run_kernel("CONV", [x, weight], {**CONV, "groups": groups, "activation": act}, weights=(1,))
    eager = ACTIVATIONS[act].reference(torch.nn.functional.conv2d(x, weight, None, 1, 1, 1, groups))
    assert_nans_as_eager(got[0], eager)


def test_conv_with_a_residual_and_relu_keeps_a_nan_residual_as_eager():
    """The NaN arrives only in the epilogue (the residual), so nothing but the activation decides it."""
    x, weight = rand(1, 16, 6, 5), rand(16, 16, 3, 3, seed=1)
    residual = with_nans(rand(1, 16, 6, 5, seed=2), (0, 0, 0, 0), (0, 5, 2, 3))
    params = {**CONV, "has_residual": True, "activation": "relu"}
    got, _, _ = run_kernel("CONV", [x, weight, residual], params, weights=(1,))
    assert_nans_as_eager(got[0], torch.relu(torch.nn.functional.conv2d(x, weight, None, 1, 1) + residual))
