"""The native int8 QCONV / QGEMM kernels of the CPU backend (``npu_runtime.backends.cpu_qconv``, ``qconv.c``):
bit-exact with the ops' reference implementations (``torch_ir.ops.npu_quant.qconv`` / ``qgemm``, called on the same
tensors) on every kernel this CPU runs (portable C, AVX2, AVX-512 VNNI), over random shapes and extreme codes; the
cases it refuses run the reference; and an onnxruntime-quantized ResNet-18 compiled for the CPU gives the same
codes with the native kernels as with the reference."""

from __future__ import annotations

import warnings
import zlib

import pytest
import torch

from npu_program.program import Dispatch, TensorSpec
from npu_runtime.backends import cpu_gemv_build, cpu_qconv
from npu_runtime.backends.cpu_kernels import Reference, make_kernel
from tests.native import isa_fixtures
from torch_ir.ops.npu_quant import qconv, qgemm

DTYPES = {"uint8": torch.uint8, "int8": torch.int8}


qlib, isa = isa_fixtures(cpu_qconv, cpu_qconv.ISAS, "TORCH_IR_QCONV_ISA")


def _codes(shape: tuple, dtype: str, g: torch.Generator) -> torch.Tensor:
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return torch.randint(lo, hi, shape, generator=g).to(DTYPES[dtype])


def _operands(x: torch.Tensor, w: torch.Tensor, n: int, g: torch.Generator, *, bias: str | None, out: str,
              x_zp: int, per_channel: bool = True) -> list[torch.Tensor]:
    """The op's inputs in order: x w x_scale x_zp w_scale w_zp bias? y_scale? y_zp?"""
    ws = torch.rand(n if per_channel else 1, generator=g) * 2e-3 + 1e-4
    ins = [x, w, torch.tensor(0.0213), torch.tensor(x_zp, dtype=x.dtype), ws,
           torch.zeros(ws.numel(), dtype=torch.int8)]
    if bias == "int32":
        ins.append(torch.randint(-20000, 20000, (n,), generator=g).to(torch.int32))
    elif bias == "float":  # PT2E's float bias, made int32 inside by int_bias
        ins.append(torch.randn(n, generator=g) * 0.3)
    if out in ("int8", "uint8"):
        ins += [torch.tensor(0.0371), torch.tensor(-7 if out == "int8" else 121, dtype=DTYPES[out])]
    return ins


def _run(kernel: str, ins: list[torch.Tensor], params: dict, expected: torch.Tensor) -> tuple[object, torch.Tensor]:
    """``make_kernel`` on a dispatch of these tensors (all but x bound at prepare), run into a fresh output."""
    names = [f"in{i}" for i in range(len(ins))]
    specs = {n: TensorSpec(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in zip(names, ins)}
    specs["y"] = TensorSpec("y", list(expected.shape), str(expected.dtype).removeprefix("torch."))
    k = make_kernel(Dispatch(kernel=kernel, node="n", inputs=names, outputs=["y"], params=params), specs,
                    set(names[1:]))
    k.prepare(dict(zip(names[1:], ins[1:])))
    y = torch.full_like(expected, 99)
    k.run(ins, [y])
    return k, y


def _conv_params(stride: int, padding: int, dilation: int, bias: str | None, out: str, relu: bool) -> dict:
    return {"stride": [stride, stride], "padding": [padding, padding], "dilation": [dilation, dilation],
            "groups": 1, "w_dtype": "int8", "has_bias": bias is not None, "out_dtype": out,
            "activation": "relu" if relu else None}


# batch, C, H, W, N, k, stride, padding, dilation, x type, x_zp, bias, out, relu
CONVS = [
    (1, 3, 17, 15, 8, 7, 2, 3, 1, "uint8", 128, "float", "uint8", False),    # a stem: K = 147
    (2, 5, 9, 11, 13, 3, 1, 1, 1, "uint8", 0, "int32", "uint8", True),
    (1, 7, 10, 8, 17, 3, 2, 1, 2, "int8", 7, "int32", "int8", True),
    (1, 33, 12, 12, 35, 3, 1, 1, 1, "int8", -5, None, "uint8", True),
    (1, 64, 7, 7, 19, 1, 1, 0, 1, "uint8", 255, "int32", "int32", False),
    (2, 19, 8, 8, 9, 1, 2, 0, 1, "uint8", 77, "float", "float32", True),
    (1, 21, 9, 6, 40, 5, 1, 2, 1, "uint8", 3, "int32", "float32", False),
    (1, 130, 5, 5, 70, 3, 1, 1, 1, "int8", 0, "int32", "int8", False),
    (1, 4, 40, 40, 16, 3, 1, 0, 3, "uint8", 200, "float", "uint8", True),   # dilation 3, no padding
    (1, 6, 5, 7, 5, 1, 2, 3, 1, "int8", 100, "int32", "int8", False),       # windows wholly in the padding
    (1, 2, 9, 70, 3, 3, 1, 1, 1, "uint8", 50, "int32", "int32", False),     # a row of positions over 2 panels
    (2, 30, 6, 6, 12, 1, 1, 0, 1, "int8", -20, "int32", "uint8", True),     # int8 x read in place (no border)
]


@pytest.mark.parametrize("case", CONVS, ids=[f"c{i}" for i in range(len(CONVS))])
def test_qconv_is_the_reference_bit_for_bit(case: tuple, isa: str) -> None:
    b, c, h, w, n, k, stride, padding, dilation, xt, x_zp, bias, out, relu = case
    g = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    x, wt = _codes((b, c, h, w), xt, g), _codes((n, c, k, k), "int8", g)
    ins = _operands(x, wt, n, g, bias=bias, out=out, x_zp=x_zp)
    params = _conv_params(stride, padding, dilation, bias, out, relu)
    expected = qconv(*ins, **params)
    kernel, y = _run("QCONV", ins, params, expected)
    assert isinstance(kernel, cpu_qconv.QConv) and kernel.native
    assert y.dtype == expected.dtype and torch.equal(y, expected), (y.double() - expected.double()).abs().max()


# the im2col panels of 64 positions: long rows at stride 1 and 2 (a row over several panels, a masked tail), int8 x
# read in place at stride 2, and products big enough for the threads (a 7x7 image split by output channels)
PANELS = [
    (1, 5, 7, 150, 9, 3, 2, 1, 1, "uint8", 30, "int32", "uint8", True),
    (1, 16, 4, 141, 24, 1, 2, 0, 1, "int8", -20, "int32", "int8", False),
    (1, 32, 30, 30, 72, 3, 1, 1, 1, "uint8", 5, "float", "uint8", True),
    (2, 256, 7, 7, 256, 3, 1, 1, 1, "int8", 9, "int32", "int8", False),
    (1, 24, 31, 29, 80, 3, 2, 1, 1, "uint8", 140, "int32", "float32", False),
]


@pytest.mark.parametrize("case", PANELS, ids=[f"p{i}" for i in range(len(PANELS))])
@pytest.mark.parametrize("threads", [1, 2])
def test_qconv_panels_and_threads_are_the_reference(case: tuple, threads: int, isa: str) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        test_qconv_is_the_reference_bit_for_bit(case, isa)
    finally:
        torch.set_num_threads(before)


# x shape, N, trans_b, x type, x_zp, bias, out, relu, per channel
GEMMS = [
    ((1, 512), 10, True, "uint8", 131, "float", "uint8", False, True),
    ((2, 5, 37), 23, True, "int8", -3, "int32", "int8", True, True),
    ((3, 64), 33, False, "uint8", 0, None, "int32", False, True),
    ((40, 19), 8, True, "int8", 12, "int32", "float32", True, False),
    ((2, 37, 40), 27, False, "uint8", 200, "int32", "uint8", True, True),  # 74 rows: whole tiles of 32, then 10
    ((1, 50, 64), 16, True, "int8", -9, "float", "int8", False, True),     # 50 rows: a tile of 32, one of 18
    ((1, 130, 768), 24, False, "uint8", 128, None, "uint8", False, True),  # BERT's x: 3 panels of 64 rows
]


@pytest.mark.parametrize("case", GEMMS, ids=[f"g{i}" for i in range(len(GEMMS))])
def test_qgemm_is_the_reference_bit_for_bit(case: tuple, isa: str) -> None:
    shape, n, trans_b, xt, x_zp, bias, out, relu, per_channel = case
    g = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    k = shape[-1]
    x, wt = _codes(shape, xt, g), _codes((n, k) if trans_b else (k, n), "int8", g)
    ins = _operands(x, wt, n, g, bias=bias, out=out, x_zp=x_zp, per_channel=per_channel)
    params = {"trans_b": trans_b, "w_dtype": "int8", "has_bias": bias is not None, "out_dtype": out,
              "activation": "relu" if relu else None}
    expected = qgemm(*ins, **params)
    kernel, y = _run("QGEMM", ins, params, expected)
    assert isinstance(kernel, cpu_qconv.QGemm) and kernel.native
    assert torch.equal(y, expected)


@pytest.mark.parametrize("xt,x_code,x_zp", [("uint8", 255, 0), ("uint8", 0, 255), ("int8", 127, -128),
                                             ("int8", -128, 127)])
@pytest.mark.parametrize("w_code", [-128, 127])
def test_extreme_codes_do_not_saturate(xt: str, x_code: int, x_zp: int, w_code: int, isa: str) -> None:
    """|x - zp| = 255 against |w| = 128 over K = 2304: sums near 7.5e7, and every pair of products beyond int16
    (where maddubs would saturate); the raw int32 sums and a requantized output both."""
    g = torch.Generator().manual_seed(1)
    x = torch.full((1, 256, 6, 6), x_code, dtype=DTYPES[xt])
    wt = torch.full((12, 256, 3, 3), w_code, dtype=torch.int8)
    for out in ("int32", "uint8"):
        ins = _operands(x, wt, 12, g, bias="int32", out=out, x_zp=x_zp)
        params = _conv_params(1, 1, 1, "int32", out, False)
        expected = qconv(*ins, **params)
        if out == "int32":
            assert int(expected.to(torch.int64).abs().max()) > 7e7
        assert torch.equal(_run("QCONV", ins, params, expected)[1], expected)


def test_ties_round_to_even(isa: str) -> None:
    """m = 1 · 1 / 2 exactly: every odd sum lands on a tie, which rint sends to the even code (not away from 0)."""
    g = torch.Generator().manual_seed(6)
    x, wt = _codes((3, 9, 5, 5), "int8", g), torch.randint(-3, 4, (16, 9, 1, 1), generator=g).to(torch.int8)
    ins = _operands(x, wt, 16, g, bias=None, out="int8", x_zp=0)
    ins[2], ins[4], ins[6] = torch.tensor(1.0), torch.ones(16), torch.tensor(2.0)
    params = _conv_params(1, 0, 1, None, "int8", False)
    expected = qconv(*ins, **params)
    acc = qconv(*ins[:6], **{**params, "out_dtype": "int32"})
    assert bool((acc % 2 == 1).any()) and bool((acc.abs() < 200).any())  # ties inside the int8 range
    assert torch.equal(_run("QCONV", ins, params, expected)[1], expected)


def test_refused_cases_run_the_reference() -> None:
    g = torch.Generator().manual_seed(2)
    x, wt = _codes((1, 4, 6, 6), "uint8", g), _codes((6, 2, 3, 3), "int8", g)
    ins = _operands(x, wt, 6, g, bias="int32", out="uint8", x_zp=3)
    params = {**_conv_params(1, 1, 1, "int32", "uint8", False), "groups": 2}
    kernel, y = _run("QCONV", ins, params, qconv(*ins, **params))
    assert isinstance(kernel, Reference) and torch.equal(y, qconv(*ins, **params))
    # a nonzero weight zero point: accepted by shape, refused at prepare (the reference runs, exactly)
    wt = _codes((6, 4, 3, 3), "int8", g)
    ins = _operands(x, wt, 6, g, bias="int32", out="uint8", x_zp=3)
    ins[5] = torch.full((6,), 2, dtype=torch.int8)
    params = _conv_params(1, 1, 1, "int32", "uint8", False)
    kernel, y = _run("QCONV", ins, params, qconv(*ins, **params))
    assert isinstance(kernel, cpu_qconv.QConv) and not kernel.native and torch.equal(y, qconv(*ins, **params))


def test_a_sum_that_may_overflow_int32_runs_the_reference_which_raises() -> None:
    """255 · 128 · 66000 > 2**31: the bound refuses the kernel, and the reference raises as the op must."""
    k = 66000
    x, wt = torch.full((1, k), 255, dtype=torch.uint8), torch.full((1, k), -128, dtype=torch.int8)
    ins = _operands(x, wt, 1, torch.Generator().manual_seed(3), bias=None, out="int32", x_zp=0)
    params = {"trans_b": True, "w_dtype": "int8", "has_bias": False, "out_dtype": "int32", "activation": None}
    with pytest.raises(ValueError, match="overflowed"):
        _run("QGEMM", ins, params, torch.empty(1, 1, dtype=torch.int32))


def test_without_the_native_library_it_warns_once_and_runs_the_reference(monkeypatch) -> None:
    for name, value in (("library", None), ("failed", "no compiler (test)"), ("warned", False)):
        monkeypatch.setattr(cpu_qconv._kernel, name, value)
    monkeypatch.setattr(cpu_gemv_build.NativeKernel, "enabled", True)
    g = torch.Generator().manual_seed(4)
    x, wt = _codes((1, 5, 7, 7), "uint8", g), _codes((9, 5, 3, 3), "int8", g)
    ins = _operands(x, wt, 9, g, bias="int32", out="uint8", x_zp=9)
    params = _conv_params(1, 1, 1, "int32", "uint8", True)
    with pytest.warns(RuntimeWarning, match="reference"):
        _, y = _run("QCONV", ins, params, qconv(*ins, **params))
    assert torch.equal(y, qconv(*ins, **params))


def test_a_wrong_output_is_refused_before_the_call(qlib) -> None:
    g = torch.Generator().manual_seed(5)
    x, wt = _codes((1, 5, 7, 7), "uint8", g), _codes((9, 5, 3, 3), "int8", g)
    ins = _operands(x, wt, 9, g, bias=None, out="uint8", x_zp=9)
    params = _conv_params(1, 1, 1, None, "uint8", False)
    expected = qconv(*ins, **params)
    kernel, _ = _run("QCONV", ins, params, expected)
    with pytest.raises(ValueError, match="do not fit"):
        kernel.run(ins, [torch.empty(1, 9, 6, 7, dtype=torch.uint8)])
    with pytest.raises(TypeError, match="uint8"):
        kernel.run(ins, [torch.empty(expected.shape, dtype=torch.int8)])


# ------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def resnet18_qdq_import(tmp_path_factory: pytest.TempPathFactory):
    """onnxruntime's quantize_static (QDQ, per-channel int8 weights, uint8 activations) of a seeded ResNet-18,
    imported as it is: ``(ir, weights, x)`` (the helpers of tests/onnx/test_quant_models.py)."""
    pytest.importorskip("onnxruntime.quantization")
    pytest.importorskip("transformers")
    from transformers import ResNetConfig, ResNetForImageClassification

    from tests.onnx import test_quant_models as qm
    from torch_ir.frontends.onnx import import_onnx

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic",
        num_labels=10)).eval()
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 3, 64, 64, generator=g) for _ in range(4)]
    proto = qm.export_for_quantization(qm._Wrap(model, "logits"), (xs[0],), ["x"])
    path = qm._quantize(tmp_path_factory.mktemp("qconv_resnet18"), proto, [{"x": x.numpy()} for x in xs[:3]],
                        "static", "uint8")
    ir, weights = import_onnx(path)
    return ir, weights, xs[3]


@pytest.fixture(scope="module")
def resnet18_qdq(resnet18_qdq_import):
    """The ResNet-18 of ``resnet18_qdq_import`` normalized into QCONV/QGEMM/QADD."""
    from npu_compiler.passes import normalize

    ir, weights, x = resnet18_qdq_import
    return normalize(ir), weights, x


def test_compiled_qdq_resnet18_gives_the_references_codes(resnet18_qdq, qlib) -> None:
    from npu_compiler import compile as npu_compile
    from npu_runtime import Device, Executor, NPUBuffer, load_weights
    from torch_ir import IRExecutor

    ir, weights, x = resnet18_qdq
    program = npu_compile(ir, target="cpu", fallback="cpu")
    device = Device()

    def run() -> tuple[torch.Tensor, list]:
        executor = Executor(program, device)
        bound = load_weights({k: v.contiguous() for k, v in weights.items()}, program, device)
        feeds = {program.input_specs[0].name: NPUBuffer.from_numpy(x.numpy(), device, spec=program.input_specs[0])}
        out = executor.run(feeds, weights=bound)
        return torch.from_numpy(out[program.output_specs[0].name].to_numpy()), executor.kernels

    native, kernels = run()
    assert sum(isinstance(k, (cpu_qconv.QConv, cpu_qconv.QGemm)) and k.native for k in kernels) >= 21
    previous = cpu_gemv_build.set_enabled(False)  # every QCONV/QGEMM through its reference
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            reference, _ = run()
    finally:
        cpu_gemv_build.set_enabled(previous)
    (interpreted,) = IRExecutor(ir, weights).run([x])
    assert torch.equal(native, reference) and torch.equal(native, interpreted)
