"""QMUL, the quantized elementwise product: its reference is the QDQ chain DEQUANTIZE, mul, QUANTIZE bit for bit; the
CPU kernel (QADD's, ``qelementwise.c``, with the product in place of the sum) is its reference bit for bit on every
ISA this CPU runs, every layout the arena hands it and a repeated operand; the normalize rule fuses a QDQ product and
gives onnxruntime's codes within one step; a relu after the product keeps the chain."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from npu_runtime.backends import cpu_qelementwise
from tests.native import isa_fixtures
from tests.quant.test_qadd import TYPES, _kernel, _nhwc, _operands
from torch_ir.ops.npu_quant import dequantize, qmul, quantize

DTYPES = {"uint8": torch.uint8, "int8": torch.int8}


def _chain(ins: list, out: str, method: str) -> torch.Tensor:
    """What the unfused QDQ chain computes: each node's reference in turn (aten.mul as torch's)."""
    a, sa, za, b, sb, zb, sy, zy = ins
    p = torch.mul(dequantize(a, sa, za, dtype=str(a.dtype)[6:]), dequantize(b, sb, zb, dtype=str(b.dtype)[6:]))
    return quantize(p, sy, zy, dtype=out, method=method)


@pytest.mark.parametrize("types", TYPES, ids="-".join)
@pytest.mark.parametrize("method", ["divide", "multiply_inverse"])
def test_the_reference_is_the_qdq_chain_bit_for_bit(types: tuple, method: str) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(repr((types, method)).encode()))
    for halves in (False, True):
        ins = _operands((2, 8, 9, 9), *types, g, halves=halves)
        got = qmul(*ins, out_dtype=types[2], method=method)
        assert got.dtype == DTYPES[types[2]] and torch.equal(got, _chain(ins, types[2], method))


qlib, isa = isa_fixtures(cpu_qelementwise, cpu_qelementwise.ISAS, "TORCH_IR_QADD_ISA")


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 37), (2, 64, 17, 19)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("types", TYPES, ids="-".join)
def test_the_kernel_is_the_reference_bit_for_bit(shape: tuple, types: tuple, isa: str) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, types)).encode()))
    for method, halves in (("divide", False), ("divide", True), ("multiply_inverse", False)):
        ins = _operands(shape, *types, g, halves=halves)
        params = {"out_dtype": types[2], "method": method}
        expected = qmul(*ins, **params)
        k = _kernel(ins, params, shape, types[2], "QMUL")
        assert isinstance(k, cpu_qelementwise.QMul) and k.native
        y = torch.full_like(expected, 99)
        k.run(ins, [y])
        assert torch.equal(y, expected), (method, halves)


@pytest.mark.parametrize("layout", ["nhwc", "nhwc_in", "nhwc_out"])
def test_every_layout_the_arena_hands_it(layout: str, isa: str) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(layout.encode()))
    shape = (2, 24, 7, 5)
    ins = _operands(shape, "uint8", "int8", "uint8", g)
    expected = qmul(*ins, out_dtype="uint8")
    k = _kernel(ins, {"out_dtype": "uint8"}, shape, "uint8", "QMUL")
    if layout in ("nhwc", "nhwc_in"):
        ins[0], ins[3] = _nhwc(ins[0]), _nhwc(ins[3])
    y = torch.zeros(shape, dtype=torch.uint8)
    y = _nhwc(y) if layout in ("nhwc", "nhwc_out") else y
    k.run(ins, [y])
    assert torch.equal(y, expected)


@pytest.mark.parametrize("first", [False, True])
def test_a_repeated_operand_is_the_reference_bit_for_bit(first: bool, isa: str) -> None:
    g = torch.Generator().manual_seed(int(first))
    ins = _operands((3, 5, 64), "uint8", "uint8", "uint8", g)
    small = _operands((64,), "uint8", "uint8", "uint8", g)[0]
    ins[0 if first else 3] = small
    expected = qmul(*ins, out_dtype="uint8")
    k = _kernel(ins, {"out_dtype": "uint8"}, (3, 5, 64), "uint8", "QMUL")
    assert isinstance(k, cpu_qelementwise.QMul) and k.period == 64
    y = torch.zeros(3, 5, 64, dtype=torch.uint8)
    k.run(ins, [y])
    assert torch.equal(y, expected)


def _qdq_mul_model(relu: bool = False):
    """DequantizeLinear(a), DequantizeLinear(b) -> Mul [-> Relu] -> QuantizeLinear, uint8 codes."""
    shape = [2, 8, 40]
    inits = [numpy_helper.from_array(np.array(v, dtype=np.float32), n) for n, v in
             (("sa", 0.03), ("sb", 0.011), ("sy", 0.05))]
    inits += [numpy_helper.from_array(np.array(v, dtype=np.uint8), n) for n, v in (("za", 128), ("zb", 3), ("zy", 60))]
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["fb"]),
             helper.make_node("Mul", ["fa", "fb"], ["p"])]
    last = "p"
    if relu:
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        last = "r"
    nodes.append(helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["y"]))
    graph = helper.make_graph(nodes, "qmul", [helper.make_tensor_value_info(n, TensorProto.UINT8, shape)
                                              for n in ("a", "b")],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_qdq_product_fuses_and_gives_onnxruntimes_codes(qlib) -> None:
    import onnxruntime as ort

    from npu_compiler import compile as npu_compile
    from npu_compiler.passes import normalize
    from npu_runtime import Device, Executor, NPUBuffer, load_weights
    from torch_ir import IRExecutor
    from torch_ir.frontends.onnx import import_onnx

    model = _qdq_mul_model()
    raw, weights = import_onnx(model)
    fused = normalize(raw)
    assert fused.op_histogram() == {"QMUL": 1}
    g = torch.Generator().manual_seed(5)
    a, b = (torch.randint(0, 256, (2, 8, 40), generator=g).to(torch.uint8) for _ in range(2))
    program = npu_compile(raw, target="cpu")
    device = Device()
    executor = Executor(program, device)
    bound = load_weights({k: v.contiguous() for k, v in weights.items()}, program, device)
    feeds = {s.name: NPUBuffer.from_numpy(t.numpy(), device, spec=s) for s, t in zip(program.input_specs, (a, b))}
    got = torch.from_numpy(executor.run(feeds, weights=bound)[program.output_specs[0].name].to_numpy())
    assert any(isinstance(k, cpu_qelementwise.QMul) and k.native for k in executor.kernels)
    (chain,) = IRExecutor(raw, weights).run([a, b])
    assert torch.equal(got, chain)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (theirs,) = session.run(None, {"a": a.numpy(), "b": b.numpy()})
    assert np.abs(theirs.astype(np.int32) - got.numpy().astype(np.int32)).max() <= 1


def test_a_relu_after_the_product_keeps_the_chain() -> None:
    from npu_compiler.passes import normalize
    from torch_ir.frontends.onnx import import_onnx

    raw, _ = import_onnx(_qdq_mul_model(relu=True))
    assert "QMUL" not in normalize(raw).op_histogram()

