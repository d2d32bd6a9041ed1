"""QLUT, a quantized elementwise chain as a table over the 256 codes: the table is the chain computed by torch's own
ATen ops on every code; the CPU kernel (``qelementwise.c``'s ``qlut_map``) is the reference bit for bit on every ISA
this CPU runs and in every layout the arena hands it; the normalize rule turns an ONNX QDQ GELU (the form
onnxruntime's quantizer leaves in a BERT) into tables whose codes are the unfused chain's and within one code of
onnxruntime's, leaves the chains it cannot take with the reason, and refuses steps a file makes up."""

from __future__ import annotations

import math
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
from tests.quant.test_qadd import _run_program
from torch_ir.ops.npu_quant import dequantize, qlut, quantize
from torch_ir.quant import lut

DTYPES = {"uint8": torch.uint8, "int8": torch.int8}
LUT_RULES = {f"qdq_lut{n}" for n in (1, 2, 3)}

# (functions, numbers, the ATen ops the chain's IR holds: (op, attrs) each)
CHAINS = [
    ("mul erf", [0.7071067932881648],
     [(torch.ops.aten.mul.Tensor, {"other": 0.7071067932881648}), (torch.ops.aten.erf.default, {})]),
    ("add", [1.0], [(torch.ops.aten.add.Tensor, {"other": 1.0})]),
    ("mul", [0.125], [(torch.ops.aten.mul.Tensor, {"other": 0.125})]),
    ("div sigmoid", [3.0], [(torch.ops.aten.div.Tensor, {"other": 3.0}), (torch.ops.aten.sigmoid.default, {})]),
    ("gelu_tanh sub tanh", [0.25], [(torch.ops.aten.gelu.default, {"approximate": "tanh"}),
                                    (torch.ops.aten.sub.Tensor, {"other": 0.25}), (torch.ops.aten.tanh.default, {})]),
    ("silu relu6", [], [(torch.ops.aten.silu.default, {}), (torch.ops.aten.hardtanh.default,
                                                            {"min_val": 0.0, "max_val": 6.0})]),
    ("sqrt exp", [], [(torch.ops.aten.sqrt.default, {}), (torch.ops.aten.exp.default, {})]),  # NaN below 0
]


def _scalars(x_dtype: str, y_dtype: str, g: torch.Generator) -> list[torch.Tensor]:
    def zp(dtype: str) -> torch.Tensor:
        lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
        return torch.randint(lo, hi, (), generator=g).to(DTYPES[dtype])

    return [torch.rand((), generator=g) * 0.1 + 1e-3, zp(x_dtype), torch.rand((), generator=g) * 0.02 + 1e-3,
            zp(y_dtype)]


@pytest.mark.parametrize("chain", CHAINS, ids=[c[0].replace(" ", "-") for c in CHAINS])
@pytest.mark.parametrize("types", [("uint8", "uint8"), ("int8", "int8"), ("int8", "uint8")], ids="-".join)
@pytest.mark.parametrize("method", ["divide", "multiply_inverse"])
def test_the_table_is_the_aten_chain_on_every_code(chain: tuple, types: tuple, method: str) -> None:
    functions, numbers, ops = chain
    g = torch.Generator().manual_seed(zlib.crc32(repr((functions, types, method)).encode()))
    sx, zx, sy, zy = _scalars(*types, g)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(DTYPES[types[0]])
    v = dequantize(codes, sx, zx, dtype=types[0])
    for op, attrs in ops:  # the chain as the IR's nodes compute it: the ATen overloads themselves
        v = op(v, **attrs)
    expected = quantize(v, sy, zy, dtype=types[1], method=method)
    got = qlut(codes, sx, zx, sy, zy, functions=functions, numbers=numbers, out_dtype=types[1], method=method)
    assert got.dtype == DTYPES[types[1]] and torch.equal(got, expected)
    # any tensor of codes: each element its code's entry
    x = torch.randint(0, 256, (3, 5, 17), generator=g).to(torch.uint8).view(DTYPES[types[0]])
    table = qlut(codes, sx, zx, sy, zy, functions=functions, numbers=numbers, out_dtype=types[1], method=method)
    assert torch.equal(qlut(x, sx, zx, sy, zy, functions=functions, numbers=numbers, out_dtype=types[1],
                            method=method), table[x.view(torch.uint8).long()])


def test_every_step_is_read_from_its_aten_form() -> None:
    assert lut.step_of("aten.mul.Tensor", {"other": 0.5}) == ("mul", 0.5)
    assert lut.step_of("aten.div.Scalar", {"other": 2}) == ("div", 2.0)
    assert lut.step_of("aten.gelu.default", {"approximate": "tanh"}) == ("gelu_tanh", None)
    assert lut.step_of("aten.clamp.default", {"min": 0, "max": 6}) == ("relu6", None)
    assert lut.step_of("aten.erf.default", {}) == ("erf", None)
    # not steps: alpha, a rounding mode, a clamp that is no activation, an op off the table
    for op, attrs in [("aten.add.Tensor", {"other": 1.0, "alpha": 2}), ("aten.div.Tensor", {"other": 2.0,
                      "rounding_mode": "floor"}), ("aten.clamp.default", {"min": -1, "max": 1}),
                      ("aten.mul.Tensor", {"other": True}), ("aten.cumsum.default", {"dim": 0}),
                      ("aten.mul.Tensor", {})]:
        assert lut.step_of(op, attrs) is None, (op, attrs)


@pytest.mark.parametrize("functions, numbers, message", [
    ("__import__ os", [], "unknown step"), ("", [], "names no step"), ("mul erf", [], "takes 1 number"),
    ("erf", [1.0], "takes 0 number"), ("mul", ["1"], "takes 1 number")])
def test_steps_a_file_makes_up_are_refused(functions: str, numbers: list, message: str) -> None:
    one = torch.tensor(0.1)
    with pytest.raises(ValueError, match=message):
        qlut(torch.zeros(4, dtype=torch.uint8), one, torch.tensor(0, dtype=torch.uint8), one,
             torch.tensor(0, dtype=torch.uint8), functions=functions, numbers=numbers, out_dtype="uint8")


def test_codes_the_table_does_not_cover_are_refused() -> None:
    one = torch.tensor(0.1)
    with pytest.raises(ValueError, match="int8 and uint8 codes only"):
        qlut(torch.zeros(4, dtype=torch.int16), one, torch.tensor(0, dtype=torch.int16), one,
             torch.tensor(0, dtype=torch.uint8), functions="erf", numbers=[], out_dtype="uint8")
    with pytest.raises(ValueError, match="per tensor"):
        qlut(torch.zeros(4, dtype=torch.uint8), torch.ones(4), torch.tensor(0, dtype=torch.uint8), one,
             torch.tensor(0, dtype=torch.uint8), functions="erf", numbers=[], out_dtype="uint8")


# ------------------------------------------------------------------------------------------------ the CPU kernel

qlib, isa = isa_fixtures(cpu_qelementwise, cpu_qelementwise.ISAS, "TORCH_IR_QDQ_ISA")


def _kernel(x: torch.Tensor, scalars: list, params: dict, out_dtype: str) -> object:
    names = ["x", "sx", "zx", "sy", "zy"]
    specs = {n: TensorSpec(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in zip(names,
                                                                                                  [x, *scalars])}
    specs["y"] = TensorSpec("y", list(x.shape), out_dtype)
    k = make_kernel(Dispatch(kernel="QLUT", node="n", inputs=names, outputs=["y"], params=params), specs,
                    set(names[1:]))
    k.prepare(dict(zip(names[1:], scalars)))
    return k


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 37), (2, 64, 17, 19), (1, 3, 131, 129)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["contiguous", "nhwc", "nhwc_in", "nhwc_out", "in_place"])
def test_the_kernel_is_the_reference_bit_for_bit(shape: tuple, layout: str, isa: str) -> None:
    if layout != "contiguous" and len(shape) != 4:
        pytest.skip("the arena's strided views are 4-D")
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, layout)).encode()))
    scalars = _scalars("int8", "int8", g)
    params = {"functions": "mul erf", "numbers": [0.7071067932881648], "out_dtype": "int8", "method": "divide"}
    x = torch.randint(-128, 128, shape, generator=g).to(torch.int8)
    expected = qlut(x, *scalars, **params)
    k = _kernel(x, scalars, params, "int8")
    assert isinstance(k, cpu_qelementwise.QLut)

    def nhwc(t: torch.Tensor) -> torch.Tensor:
        return t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)

    xin = nhwc(x) if layout in ("nhwc", "nhwc_in") else x.clone()
    y = torch.full_like(expected, 99)
    y = nhwc(y) if layout in ("nhwc", "nhwc_out") else y
    if layout == "in_place":
        y = xin
    k.run([xin, *scalars], [y])
    assert torch.equal(y, expected)


def test_scales_known_only_at_run_time_run_the_reference() -> None:
    names = ["x", "sx", "zx", "sy", "zy"]
    specs = {n: TensorSpec(n, [] if n != "x" else [4], "float32" if n.startswith("s") else "uint8") for n in names}
    specs["y"] = TensorSpec("y", [4], "uint8")
    k = make_kernel(Dispatch(kernel="QLUT", node="n", inputs=names, outputs=["y"],
                             params={"functions": "erf", "numbers": [], "out_dtype": "uint8"}), specs, set())
    assert isinstance(k, Reference)


# ------------------------------------------------------------------------------------------------ the rule

SQRT2 = math.sqrt(2.0)


def _gelu_qdq_model(*, per_channel: bool = False) -> onnx.ModelProto:
    """onnxruntime's QDQ form of BERT's GELU, ``x · 0.5 · (1 + erf(x / √2))``: every op between a DequantizeLinear
    and a QuantizeLinear of its own scale, uint8 codes, x of [2, 16, 40]."""
    shape = [2, 16, 40]
    f32 = [("sx", 0.05), ("se", 2.0 / 255), ("sa", 2.0 / 255), ("sm", 0.04), ("sy", 0.02), ("sqrt2", SQRT2),
           ("one", 1.0), ("half", 0.5)]
    u8 = [("zx", 128), ("ze", 128), ("za", 0), ("zm", 100), ("zy", 10)]
    inits = [numpy_helper.from_array(np.array(v, dtype=np.float32), n) for n, v in f32]
    inits += [numpy_helper.from_array(np.array(v, dtype=np.uint8), n) for n, v in u8]
    if per_channel:  # the first DequantizeLinear per channel: no table
        inits[0] = numpy_helper.from_array(np.linspace(0.01, 0.05, 40).astype(np.float32), "sx")
        inits[8] = numpy_helper.from_array(np.full(40, 128, dtype=np.uint8), "zx")
    dq = {"axis": 2} if per_channel else {}
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["fx"], **dq),
             helper.make_node("Div", ["fx", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("QuantizeLinear", ["e", "se", "ze"], ["qe"]),
             helper.make_node("DequantizeLinear", ["qe", "se", "ze"], ["fe"]),
             helper.make_node("Add", ["fe", "one"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["qa"]),
             helper.make_node("DequantizeLinear", ["qa", "sa", "za"], ["fa"]),
             helper.make_node("Mul", ["fx", "fa"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "sm", "zm"], ["qm"]),
             helper.make_node("DequantizeLinear", ["qm", "sm", "zm"], ["fm"]),
             helper.make_node("Mul", ["fm", "half"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "sy", "zy"], ["y"])]
    graph = helper.make_graph(nodes, "qdq_gelu", [helper.make_tensor_value_info("x", TensorProto.UINT8, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _rejections(ir) -> list[str]:
    return [reason for stage in ir.metadata["normalize"]["stages"] for rule, _, reason in stage["rejected"]
            if rule in LUT_RULES]


def test_an_onnx_qdq_gelu_becomes_tables_with_the_chains_codes(qlib) -> None:
    import onnxruntime as ort

    from npu_compiler.passes import normalize
    from torch_ir import IRExecutor
    from torch_ir.frontends.onnx import import_onnx

    model = _gelu_qdq_model()
    raw, weights = import_onnx(model)
    fused = normalize(raw)
    hist = fused.op_histogram()
    # erf(x / √2), + 1 and · 0.5 are tables; the product of two dequantized tensors is no step: a QMUL, once the
    # erf chain no longer reads x's DEQUANTIZE (the engine retries the rule)
    assert hist.get("QLUT") == 3 and hist.get("QMUL") == 1 and "aten.erf.default" not in hist
    assert "aten.mul.Tensor" not in hist and "DEQUANTIZE" not in hist and not _rejections(fused)
    x = torch.randint(0, 256, (2, 16, 40), generator=torch.Generator().manual_seed(3)).to(torch.uint8)
    got, kernels = _run_program(raw, weights, x, set())
    assert sum(isinstance(k, cpu_qelementwise.QLut) for k in kernels) == 3
    assert sum(isinstance(k, cpu_qelementwise.QMul) for k in kernels) == 1
    before, kernels = _run_program(raw, weights, x, LUT_RULES | {"qdq_mul"})
    assert not any(isinstance(k, (cpu_qelementwise.QLut, cpu_qelementwise.QMul)) for k in kernels)
    (chain,) = IRExecutor(raw, weights).run([x])
    assert torch.equal(got, before) and torch.equal(got, chain)
    # onnxruntime, the model's own runtime: its erf may differ from torch's in the last bit, moving a code by one
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (theirs,) = session.run(None, {"x": x.numpy()})
    diff = np.abs(theirs.astype(np.int32) - got.numpy().astype(np.int32))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99


def test_chains_it_cannot_tabulate_stay_and_say_why() -> None:
    from npu_compiler.passes import normalize
    from torch_ir import IRExecutor
    from torch_ir.frontends.onnx import import_onnx

    raw, weights = import_onnx(_gelu_qdq_model(per_channel=True))
    fused = normalize(raw)
    # the erf chain reads the per-channel codes: it stays; the later chains read per-tensor codes: tables
    assert fused.op_histogram().get("QLUT") == 2 and "aten.erf.default" in fused.op_histogram()
    assert any("per channel" in r for r in _rejections(fused))
    x = torch.randint(0, 256, (2, 16, 40), generator=torch.Generator().manual_seed(4)).to(torch.uint8)
    assert torch.equal(IRExecutor(fused, weights).run([x])[0], IRExecutor(raw, weights).run([x])[0])
