"""QMAXPOOL, the quantized max pool: its reference is the QDQ chain DEQUANTIZE, max_pool2d, QUANTIZE bit for bit and
onnxruntime's QDQ max pool; the CPU kernel (``npu_runtime.backends.cpu_qpool``, ``qpool.c``), which pools the codes,
is the reference bit for bit on every ISA this CPU runs, for negative and zero scales too and every layout the arena
hands it; the normalize rule fuses an onnxruntime QDQ ResNet-18's stem pool without changing a code, and leaves the
chain where it does not apply, saying why."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from onnx import TensorProto, helper, numpy_helper

from npu_program.program import Dispatch, TensorSpec
from npu_runtime.backends import cpu_qpool
from npu_runtime.backends.cpu_kernels import Reference, make_kernel
from tests.native import isa_fixtures
from tests.runtime.test_cpu_qconv import resnet18_qdq_import  # noqa: F401  (a fixture, used by name)
from torch_ir.ops.npu_quant import dequantize, qmaxpool, quantize

DTYPES = {"uint8": torch.uint8, "int8": torch.int8}
RULE = "qdq_maxpool"
# (kernel, stride, padding, dilation, ceil_mode): the ResNet stem's, a plain 2x2, every option at once, a 1x1
WINDOWS = [([3, 3], [2, 2], [1, 1], [1, 1], False), ([2, 2], [2, 2], [0, 0], [1, 1], False),
           ([3, 2], [1, 3], [1, 1], [2, 1], True), ([1, 1], [1, 1], [0, 0], [1, 1], False),
           ([5, 5], [3, 3], [2, 2], [1, 1], True)]


def _codes(shape: tuple, dtype: str, g: torch.Generator) -> torch.Tensor:
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return torch.randint(lo, hi, shape, generator=g).to(DTYPES[dtype])


def _params(window: tuple, out: str, method: str = "divide") -> dict:
    k, s, p, d, ceil = window
    return {"kernel_size": k, "stride": s, "padding": p, "dilation": d, "ceil_mode": ceil, "out_dtype": out,
            "method": method}


def _chain(x: torch.Tensor, scales: list, params: dict) -> torch.Tensor:
    """What the unfused QDQ chain computes: DEQUANTIZE's reference, torch's max_pool2d, QUANTIZE's reference."""
    v = dequantize(x, scales[0], scales[1], dtype=str(x.dtype)[6:])
    pooled = F.max_pool2d(v, params["kernel_size"], params["stride"], params["padding"], params["dilation"],
                          params["ceil_mode"])
    return quantize(pooled, scales[2], scales[3], dtype=params["out_dtype"], method=params["method"])


def _scales(x_dtype: str, out: str, sign: str, same: bool, g: torch.Generator) -> list[torch.Tensor]:
    """x_scale x_zero_point y_scale y_zero_point: x's scale positive, negative or zero; y's the same as x's or not."""
    s = {"positive": 0.02, "negative": -0.02, "zero": 0.0}[sign]
    xs, xz = torch.tensor(s), _codes((), x_dtype, g)
    if same and x_dtype == out:
        return [xs, xz, xs.clone(), xz.clone()]
    return [xs, xz, torch.tensor(0.031), _codes((), out, g)]


def test_the_reference_is_the_qdq_chain_and_onnxruntimes_pool(tmp_path) -> None:
    """Against onnxruntime running DequantizeLinear -> MaxPool -> QuantizeLinear: with one scale and zero point (its
    optimizer pools the codes) and with another y scale (it pools the floats)."""
    ort = pytest.importorskip("onnxruntime")
    g = torch.Generator().manual_seed(3)
    x = _codes((2, 5, 17, 23), "uint8", g)
    for scales in ([0.02, 7, 0.02, 7], [0.02, 7, 0.031, 120]):
        path = tmp_path / f"pool{scales[2]}.onnx"
        onnx.save(_pool_model(x.shape, scales, window=WINDOWS[0]), path)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (theirs,) = session.run(None, {"x": x.numpy()})
        t = [torch.tensor(scales[0]), torch.tensor(scales[1], dtype=torch.uint8), torch.tensor(scales[2]),
             torch.tensor(scales[3], dtype=torch.uint8)]
        ours = qmaxpool(x, *t, **_params(WINDOWS[0], "uint8"))
        assert torch.equal(ours, torch.from_numpy(theirs)) and torch.equal(ours, _chain(x, t, _params(WINDOWS[0],
                                                                                                     "uint8")))


# ------------------------------------------------------------------------------------------------ the CPU kernel


qlib, isa = isa_fixtures(cpu_qpool, cpu_qpool.ISAS, "TORCH_IR_QPOOL_ISA")


def _kernel(x: torch.Tensor, scales: list, params: dict, out_shape: tuple) -> object:
    names = ["x", "xs", "xz", "ys", "yz"]
    specs = {n: TensorSpec(n, list(t.shape), str(t.dtype)[6:]) for n, t in zip(names, [x, *scales])}
    specs["y"] = TensorSpec("y", list(out_shape), params["out_dtype"])
    k = make_kernel(Dispatch(kernel="QMAXPOOL", node="n", inputs=names, outputs=["y"], params=params), specs,
                    set(names[1:]))
    k.prepare(dict(zip(names[1:], scales)))
    return k


def _run(kernel: object, x: torch.Tensor, scales: list, out: torch.Tensor) -> torch.Tensor:
    kernel.run([x, *scales], [out])
    return out


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as the CPU arena holds a 4-D NHWC tensor: a strided NCHW view of NHWC bytes."""
    return t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"k{w[0][0]}{w[0][1]}s{w[1][0]}{w[1][1]}")
@pytest.mark.parametrize("types", [("uint8", "uint8"), ("int8", "int8"), ("int8", "uint8")], ids="-".join)
@pytest.mark.parametrize("sign", ["positive", "negative", "zero"])
@pytest.mark.parametrize("same", [True, False], ids=["one_scale", "requantized"])
def test_the_kernel_is_the_reference_bit_for_bit(window: tuple, types: tuple, sign: str, same: bool, isa: str) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(repr((window, types, sign, same)).encode()))
    x = _codes((2, 3, 19, 131), types[0], g)  # rows past one 64-byte vector, and not a multiple of it
    scales = _scales(*types, sign, same, g)
    params = _params(window, types[1], "multiply_inverse" if same else "divide")
    want = qmaxpool(x, *scales, **params)
    kernel = _kernel(x, scales, params, tuple(want.shape))
    assert isinstance(kernel, cpu_qpool.QMaxPool) and kernel.native
    assert kernel.identity == (same and sign != "zero" and types[0] == types[1])  # the table: Q(DQ(c)) = c
    got = _run(kernel, x, scales, torch.empty(want.shape, dtype=want.dtype))
    assert torch.equal(got, want) and torch.equal(want, _chain(x, scales, params))


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "nhwc_out", "strided"])
def test_every_layout_the_arena_hands_it(layout: str, isa: str) -> None:
    g = torch.Generator().manual_seed(5)
    x = _codes((2, 70, 23, 29), "uint8", g)  # 70 channels: a vector of 64 and a remainder
    scales = _scales("uint8", "uint8", "positive", True, g)
    params = _params(WINDOWS[0], "uint8")
    want = qmaxpool(x, *scales, **params)
    kernel = _kernel(x, scales, params, tuple(want.shape))
    xin = {"nchw": x, "nhwc": _nhwc(x), "nhwc_out": x, "strided": _codes((2, 70, 23, 58), "uint8", g)[..., ::2]}
    if layout == "strided":
        xin["strided"].copy_(x)
    out = torch.empty(want.shape, dtype=want.dtype)
    out = _nhwc(out) if layout in ("nhwc", "nhwc_out") else out
    assert torch.equal(_run(kernel, xin[layout], scales, out), want)


def test_the_stem_pool_of_resnet(isa: str) -> None:
    """64 x 112 x 112 codes, 3x3 stride 2: the shape the rule was made for, both layouts."""
    g = torch.Generator().manual_seed(6)
    x = _codes((1, 64, 112, 112), "uint8", g)
    scales = _scales("uint8", "uint8", "positive", True, g)
    params = _params(WINDOWS[0], "uint8")
    want = qmaxpool(x, *scales, **params)
    kernel = _kernel(x, scales, params, (1, 64, 56, 56))
    for xin in (x, _nhwc(x)):
        assert torch.equal(_run(kernel, xin, scales, torch.empty(want.shape, dtype=torch.uint8)), want)


def test_what_it_cannot_pool_runs_the_reference() -> None:
    """A window of padding only (pools -inf: possible with dilation) is refused when the program is made; a
    non-finite x_scale (its NaN reaches the pool) when the weights are bound."""
    g = torch.Generator().manual_seed(7)
    x = _codes((1, 2, 1, 9), "uint8", g)
    scales = _scales("uint8", "uint8", "positive", False, g)
    params = _params(([2, 1], [1, 1], [1, 0], [2, 1], False), "uint8")  # rows -1 and 1 of a 1-row image
    want = qmaxpool(x, *scales, **params)
    assert (want == 0).all()  # -inf quantized: the lowest code
    kernel = _kernel(x, scales, params, tuple(want.shape))
    assert isinstance(kernel, Reference)
    assert torch.equal(_run(kernel, x, scales, torch.empty(want.shape, dtype=torch.uint8)), want)
    x = _codes((1, 2, 9, 9), "uint8", g)
    scales[0] = torch.tensor(float("inf"))
    params = _params(WINDOWS[0], "uint8")
    want = qmaxpool(x, *scales, **params)
    kernel = _kernel(x, scales, params, tuple(want.shape))
    assert isinstance(kernel, cpu_qpool.QMaxPool) and not kernel.native
    assert torch.equal(_run(kernel, x, scales, torch.empty(want.shape, dtype=torch.uint8)), want)


# ------------------------------------------------------------------------------------------------ the rule


def _pool_model(shape: tuple, scales: list, window: tuple, per_channel: bool = False,
                pool_is_output: bool = False) -> onnx.ModelProto:
    """DequantizeLinear(x) -> MaxPool -> QuantizeLinear, uint8 codes."""
    k, s, p, d, ceil = window
    xs = np.full(shape[1], scales[0], np.float32) if per_channel else np.float32(scales[0])
    xz = np.full(shape[1], scales[1], np.uint8) if per_channel else np.uint8(scales[1])
    inits = [numpy_helper.from_array(np.asarray(v), n)
             for n, v in (("xs", xs), ("xz", xz), ("ys", np.float32(scales[2])), ("yz", np.uint8(scales[3])))]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["f"], axis=1),
             helper.make_node("MaxPool", ["f"], ["pooled"], kernel_shape=k, strides=s, pads=p + p, dilations=d,
                              ceil_mode=int(ceil)),
             helper.make_node("QuantizeLinear", ["pooled", "ys", "yz"], ["y"])]
    out = list(F.max_pool2d(torch.zeros(shape), k, s, p, d, ceil).shape)
    outputs = [helper.make_tensor_value_info("y", TensorProto.UINT8, out)]
    if pool_is_output:
        outputs.append(helper.make_tensor_value_info("pooled", TensorProto.FLOAT, out))
    graph = helper.make_graph(nodes, "qpool", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(shape))],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _rejections(ir) -> list[str]:
    return [reason for stage in ir.metadata["normalize"]["stages"] for rule, _, reason in stage["rejected"]
            if rule == RULE]


def test_qdq_resnet18_stem_pool_fuses_and_gives_the_same_codes(resnet18_qdq_import, qlib) -> None:  # noqa: F811
    from npu_compiler.passes import NormalizeOptions, normalize
    from tests.quant.test_qadd import _run_program
    from torch_ir import IRExecutor

    raw, weights, x = resnet18_qdq_import
    fused = normalize(raw)
    unfused = normalize(raw, NormalizeOptions(disabled_rules={RULE}))
    assert fused.op_histogram().get("QMAXPOOL") == 1 and "aten.max_pool2d.default" not in fused.op_histogram()
    assert unfused.op_histogram().get("aten.max_pool2d.default") == 1 and "QMAXPOOL" not in unfused.op_histogram()
    assert sum(unfused.op_histogram().get(op, 0) for op in ("QUANTIZE", "DEQUANTIZE")) \
        == sum(fused.op_histogram().get(op, 0) for op in ("QUANTIZE", "DEQUANTIZE")) + 2
    got, kernels = _run_program(raw, weights, x, set())
    assert sum(isinstance(k, cpu_qpool.QMaxPool) and k.native for k in kernels) == 1
    before, _ = _run_program(raw, weights, x, {RULE})
    (interpreted,) = IRExecutor(fused, weights).run([x])
    assert torch.equal(got, before) and torch.equal(got, interpreted)
    assert not _rejections(fused)


@pytest.mark.parametrize("window", [WINDOWS[0], WINDOWS[1], WINDOWS[4]], ids=["stem", "2x2", "ceil"])
def test_the_rule_keeps_every_code(window: tuple) -> None:
    from npu_compiler.passes import normalize
    from torch_ir import IRExecutor
    from torch_ir.frontends.onnx import import_onnx

    raw, weights = import_onnx(_pool_model((1, 4, 11, 13), [0.05, 3, 0.04, 9], window))
    fused = normalize(raw)
    assert fused.op_histogram().get("QMAXPOOL") == 1 and "aten.max_pool2d.default" not in fused.op_histogram()
    x = _codes((1, 4, 11, 13), "uint8", torch.Generator().manual_seed(8))
    assert torch.equal(IRExecutor(fused, weights).run([x])[0], IRExecutor(raw, weights).run([x])[0])


def test_a_pool_read_elsewhere_stays_for_its_other_reader() -> None:
    from npu_compiler.passes import normalize
    from torch_ir import IRExecutor
    from torch_ir.frontends.onnx import import_onnx

    raw, weights = import_onnx(_pool_model((1, 4, 9, 9), [0.05, 3, 0.05, 3], WINDOWS[0], pool_is_output=True))
    fused = normalize(raw)
    assert fused.op_histogram().get("QMAXPOOL") == 1 and fused.op_histogram().get("aten.max_pool2d.default") == 1
    x = _codes((1, 4, 9, 9), "uint8", torch.Generator().manual_seed(9))
    for got, want in zip(IRExecutor(fused, weights).run([x]), IRExecutor(raw, weights).run([x])):
        assert torch.equal(got, want)


def test_a_per_channel_input_keeps_the_chain_saying_why() -> None:
    from npu_compiler.passes import normalize
    from torch_ir.frontends.onnx import import_onnx

    ir = normalize(import_onnx(_pool_model((1, 4, 9, 9), [0.05, 3, 0.05, 3], WINDOWS[0], per_channel=True))[0])
    assert "QMAXPOOL" not in ir.op_histogram() and ir.op_histogram().get("aten.max_pool2d.default") == 1
    reasons = _rejections(ir)
    assert reasons and all("per channel" in r and "QMAXPOOL" in r for r in reasons), reasons
