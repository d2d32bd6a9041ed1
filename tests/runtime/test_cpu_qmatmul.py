"""The native QGEMM of two activations (``npu_runtime.backends.cpu_qmatmul``, ``qmatmul.c`` on ``qconv.c``): bit-exact
with the op's reference (``torch_ir.ops.npu_quant.qgemm``) and with onnxruntime's MatMulInteger / QLinearMatMul on
the same codes, on every kernel this CPU runs (portable C, AVX2, AVX-512 VNNI), over odd shapes, both operand
types and extreme zero points; the cases it refuses run the reference; and a QDQ attention block quantized by
onnxruntime, compiled for the CPU, gives the same codes with the native kernels as with the reference."""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest
import torch

from npu_program.program import Dispatch, TensorSpec
from npu_runtime.backends import cpu_gemv_build, cpu_qconv, cpu_qmatmul
from npu_runtime.backends.cpu_kernels import Reference, make_kernel
from tests.native import isa_fixtures
from tests.ort_oracle import skip_if_u8s8_saturates
from torch_ir.ops.npu_quant import qgemm

DTYPES = {"uint8": torch.uint8, "int8": torch.int8}


qlib, isa = isa_fixtures(cpu_qmatmul, cpu_qconv.ISAS, "TORCH_IR_QCONV_ISA")


def _codes(shape: tuple, dtype: str, g: torch.Generator) -> torch.Tensor:
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return torch.randint(lo, hi, shape, generator=g).to(DTYPES[dtype])


def _operands(x: torch.Tensor, w: torch.Tensor, n: int, x_zp: int, w_zp: int, g: torch.Generator, *,
              bias: str | None, out: str) -> list[torch.Tensor]:
    """The op's inputs in order: x w x_scale x_zp w_scale w_zp bias? y_scale? y_zp?"""
    ins = [x, w, torch.tensor(0.0213), torch.tensor(x_zp, dtype=x.dtype), torch.tensor(0.0117),
           torch.tensor(w_zp, dtype=w.dtype)]
    if bias == "int32":
        ins.append(torch.randint(-20000, 20000, (n,), generator=g).to(torch.int32))
    elif bias == "float":
        ins.append(torch.randn(n, generator=g) * 0.05)
    if out in DTYPES:
        ins += [torch.tensor(0.37), torch.tensor(-7 if out == "int8" else 121, dtype=DTYPES[out])]
    return ins


def _params(trans_b: bool, w: torch.Tensor, bias: str | None, out: str, relu: bool) -> dict:
    return {"trans_b": trans_b, "w_dtype": str(w.dtype).removeprefix("torch."), "has_bias": bias is not None,
            "out_dtype": out, "activation": "relu" if relu else None}


def _run(ins: list[torch.Tensor], params: dict, expected: torch.Tensor) -> tuple[object, torch.Tensor]:
    """``make_kernel`` on a QGEMM of these tensors, x and w activations (the rest bound at prepare), run into a
    fresh output."""
    names = [f"in{i}" for i in range(len(ins))]
    specs = {n: TensorSpec(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in zip(names, ins)}
    specs["y"] = TensorSpec("y", list(expected.shape), str(expected.dtype).removeprefix("torch."))
    k = make_kernel(Dispatch(kernel="QGEMM", node="n", inputs=names, outputs=["y"], params=params), specs,
                    set(names[2:]))
    k.prepare(dict(zip(names[2:], ins[2:])))
    y = torch.full_like(expected, 99)
    k.run(ins, [y])
    return k, y


# x shape, w shape, trans_b, x type, w type, x_zp, w_zp, bias, out, relu
CASES = [
    ((1, 12, 128, 64), (1, 12, 64, 128), False, "uint8", "uint8", 131, 120, None, "uint8", False),  # BERT's Q·Kᵀ
    ((1, 12, 128, 128), (1, 12, 128, 64), False, "uint8", "uint8", 0, 128, None, "uint8", False),   # BERT's P·V
    ((2, 3, 37, 19), (2, 3, 23, 19), True, "uint8", "int8", 255, -128, "int32", "int8", True),
    ((5, 9, 70), (5, 70, 13), False, "int8", "int8", -128, 127, None, "int32", False),
    ((3, 1, 5), (3, 5, 1), False, "int8", "uint8", 127, 255, "float", "float32", True),
    ((7, 33), (33, 100), False, "uint8", "int8", 128, 0, "int32", "uint8", True),
    ((2, 130, 7), (2, 67, 7), True, "int8", "uint8", 0, 0, None, "float32", False),
    ((1, 2, 9, 66), (1, 2, 66, 65), False, "uint8", "uint8", 255, 0, "int32", "int8", False),
]


@pytest.mark.parametrize("case", CASES, ids=[f"m{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("threads", [1, 2])
def test_qmatmul_is_the_reference_bit_for_bit(case: tuple, threads: int, isa: str) -> None:
    xs, ws, trans_b, xt, wt, x_zp, w_zp, bias, out, relu = case
    g = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    x, w = _codes(xs, xt, g), _codes(ws, wt, g)
    ins = _operands(x, w, ws[-2] if trans_b else ws[-1], x_zp, w_zp, g, bias=bias, out=out)
    params = _params(trans_b, w, bias, out, relu)
    expected = qgemm(*ins, **params)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernel, y = _run(ins, params, expected)
    finally:
        torch.set_num_threads(previous)
    assert isinstance(kernel, cpu_qconv.QGemm) and isinstance(kernel.activations, cpu_qmatmul.QMatMul)
    assert kernel.native and torch.equal(y, expected)


@pytest.mark.parametrize("xt,x_code,x_zp", [("uint8", 255, 0), ("uint8", 0, 255), ("int8", 127, -128),
                                             ("int8", -128, 127)])
@pytest.mark.parametrize("wt,w_code,w_zp", [("uint8", 255, 0), ("int8", -128, 127), ("int8", 127, -128)])
def test_extreme_codes_do_not_saturate(xt: str, x_code: int, x_zp: int, wt: str, w_code: int, w_zp: int,
                                       isa: str) -> None:
    """|x - x_zp| = |w - w_zp| = 255 over K = 2051 (a tail of 3): sums near ±1.3e8, raw and requantized."""
    x, w = torch.full((2, 9, 2051), x_code, dtype=DTYPES[xt]), torch.full((2, 2051, 17), w_code, dtype=DTYPES[wt])
    for out in ("int32", "int8"):
        ins = _operands(x, w, 17, x_zp, w_zp, torch.Generator().manual_seed(1), bias="int32", out=out)
        params = _params(False, w, "int32", out, False)
        expected = qgemm(*ins, **params)
        if out == "int32":
            assert int(expected.to(torch.int64).abs().max()) > 1.3e8
        kernel, y = _run(ins, params, expected)
        assert kernel.native and torch.equal(y, expected)


def ort_session(op: str, x: torch.Tensor, w: torch.Tensor, ins: list[torch.Tensor], threads: int = 0) -> object:
    """An onnxruntime session of one MatMulInteger (x, w, x_zp, w_zp) or QLinearMatMul (x, x_scale, x_zp, w, ...)
    node, the op's scalars as initializers, fed ``{"x", "w"}`` (bench/runtime/qmatmul.py times it too)."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, t: torch.Tensor) -> object:
        return numpy_helper.from_array(t.numpy(), name)

    x_scale, x_zp, w_scale, w_zp = ins[2:6]
    if op == "MatMulInteger":
        inits, names, out_type = [const("xz", x_zp), const("wz", w_zp)], ["x", "w", "xz", "wz"], TensorProto.INT32
    else:
        y_scale, y_zp = ins[-2:]
        inits = [const(n, t) for n, t in zip(("xs", "xz", "ws", "wz", "ys", "yz"),
                                             (x_scale, x_zp, w_scale, w_zp, y_scale, y_zp))]
        names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
        out_type = helper.np_dtype_to_tensor_dtype(y_zp.numpy().dtype)
    elem = {torch.uint8: TensorProto.UINT8, torch.int8: TensorProto.INT8}
    graph = helper.make_graph([helper.make_node(op, names, ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem[x.dtype], list(x.shape)),
                               helper.make_tensor_value_info("w", elem[w.dtype], list(w.shape))],
                              [helper.make_tensor_value_info("y", out_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads  # 0: onnxruntime's default
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _onnx_reference(op: str, x: torch.Tensor, w: torch.Tensor, ins: list[torch.Tensor]) -> np.ndarray:
    return ort_session(op, x, w, ins).run(None, {"x": x.numpy(), "w": w.numpy()})[0]


ORT_CASES = [  # x shape, w shape, x type, w type, x_zp, w_zp, out (QLinearMatMul's y type; int32: MatMulInteger)
    ((1, 12, 128, 64), (1, 12, 64, 128), "uint8", "uint8", 131, 120, "uint8"),
    ((2, 3, 37, 19), (2, 3, 19, 23), "uint8", "int8", 255, -3, "uint8"),  # y of x's type (onnxruntime's)
    ((4, 33, 70), (4, 70, 13), "int8", "int8", -128, 127, "int8"),
    ((3, 17, 5), (3, 5, 66), "uint8", "uint8", 0, 255, "int32"),
    ((2, 9, 130), (2, 130, 7), "int8", "int8", 5, -9, "int32"),
]


@pytest.mark.parametrize("case", ORT_CASES, ids=[f"o{i}" for i in range(len(ORT_CASES))])
@pytest.mark.parametrize("trans_b", [False, True])
def test_qmatmul_is_onnxruntimes_bit_for_bit(case: tuple, trans_b: bool, isa: str) -> None:
    skip_if_u8s8_saturates(case[2], case[3])
    xs, ws, xt, wt, x_zp, w_zp, out = case
    g = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    x, w = _codes(xs, xt, g), _codes(ws, wt, g)
    ins = _operands(x, w, ws[-1], x_zp, w_zp, g, bias=None, out=out)
    expected = torch.from_numpy(_onnx_reference("MatMulInteger" if out == "int32" else "QLinearMatMul", x, w, ins))
    if trans_b:  # the same product with w given as [..., N, K]
        ins[1] = w = w.transpose(-1, -2).contiguous()
    kernel, y = _run(ins, _params(trans_b, w, None, out, False), expected)
    assert kernel.native and torch.equal(y, expected)


def test_a_broadcast_or_per_column_scale_runs_the_reference() -> None:
    g = torch.Generator().manual_seed(2)
    x, w = _codes((2, 3, 5, 8), "uint8", g), _codes((3, 8, 6), "uint8", g)  # w broadcast over x's first dim
    ins = _operands(x, w, 6, 3, 9, g, bias=None, out="uint8")
    params = _params(False, w, None, "uint8", False)
    kernel, y = _run(ins, params, qgemm(*ins, **params))
    assert isinstance(kernel, Reference) and torch.equal(y, qgemm(*ins, **params))
    w = _codes((2, 3, 8, 6), "uint8", g)
    ins = _operands(x, w, 6, 3, 9, g, bias=None, out="uint8")
    ins[4] = torch.rand(6, generator=g) * 0.01 + 1e-3  # a scale per column of an activation: not this kernel's
    kernel, y = _run(ins, params, qgemm(*ins, **params))
    assert isinstance(kernel, Reference) and torch.equal(y, qgemm(*ins, **params))


def test_a_sum_that_may_overflow_int32_runs_the_reference_which_raises() -> None:
    """255 · 255 · 33100 > 2**31: the bound refuses the kernel, and the reference raises as the op must."""
    k = 33100
    x, w = torch.full((1, 1, k), 255, dtype=torch.uint8), torch.full((1, k, 2), 255, dtype=torch.uint8)
    ins = _operands(x, w, 2, 0, 0, torch.Generator().manual_seed(3), bias=None, out="int32")
    params = _params(False, w, None, "int32", False)
    with pytest.raises(ValueError, match="overflowed"):
        _run(ins, params, torch.empty(1, 1, 2, dtype=torch.int32))
    ins[0] = torch.full((1, 1, k), 1, dtype=torch.uint8)  # the same layer on small codes: the reference's result
    kernel, y = _run(ins, params, qgemm(*ins, **params))
    assert not kernel.native and torch.equal(y, qgemm(*ins, **params))


def test_a_wrong_output_is_refused_before_the_call(qlib) -> None:
    g = torch.Generator().manual_seed(5)
    x, w = _codes((2, 7, 9), "uint8", g), _codes((2, 9, 5), "int8", g)
    ins = _operands(x, w, 5, 3, 1, g, bias=None, out="uint8")
    params = _params(False, w, None, "uint8", False)
    kernel, _ = _run(ins, params, qgemm(*ins, **params))
    with pytest.raises(ValueError, match="do not fit"):
        kernel.run(ins, [torch.empty(2, 7, 6, dtype=torch.uint8)])
    with pytest.raises(TypeError, match="uint8"):
        kernel.run(ins, [torch.empty(2, 7, 5, dtype=torch.int8)])


# ------------------------------------------------------------------------------------------- end to end


class _Attention(torch.nn.Module):
    """One self-attention block (2 heads of 8): its Q·Kᵀ and P·V are matmuls of two activations."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        p = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5, dim=-1)
        return self.out((p @ v).transpose(1, 2).reshape(b, t, d))


def test_compiled_qdq_attention_gives_the_references_codes(tmp_path, qlib) -> None:
    pytest.importorskip("onnxruntime.quantization")
    pytest.importorskip("transformers")
    from npu_compiler import compile as npu_compile
    from npu_compiler.passes import normalize
    from npu_runtime import Device, Executor, NPUBuffer, load_weights
    from tests.onnx import test_quant_models as qm
    from torch_ir import IRExecutor
    from torch_ir.frontends.onnx import import_onnx

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 24, 16, generator=g) for _ in range(4)]
    proto = qm.export_for_quantization(_Attention().eval(), (xs[0],), ["x"])
    path = qm._quantize(tmp_path, proto, [{"x": x.numpy()} for x in xs[:3]], "static", "uint8")
    ir, weights = import_onnx(path)
    ir = normalize(ir)
    program = npu_compile(ir, target="cpu", fallback="cpu")
    device = Device()

    def run() -> tuple[torch.Tensor, list]:
        executor = Executor(program, device)
        bound = load_weights({k: v.contiguous() for k, v in weights.items()}, program, device)
        spec = program.input_specs[0]
        out = executor.run({spec.name: NPUBuffer.from_numpy(xs[3].numpy(), device, spec=spec)}, weights=bound)
        return torch.from_numpy(out[program.output_specs[0].name].to_numpy()), executor.kernels

    native, kernels = run()
    assert sum(isinstance(getattr(k, "activations", None), cpu_qmatmul.QMatMul) and k.native for k in kernels) == 2
    previous = cpu_gemv_build.set_enabled(False)  # every QGEMM through its reference
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            reference, _ = run()
    finally:
        cpu_gemv_build.set_enabled(previous)
    (interpreted,) = IRExecutor(ir, weights).run([xs[3]])
    assert torch.equal(native, reference) and torch.equal(native, interpreted)
