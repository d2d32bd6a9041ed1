"""QADD, the quantized residual add: its reference is the QDQ chain DEQUANTIZE, add, relu, QUANTIZE bit for bit; the
CPU kernel (``npu_runtime.backends.cpu_qelementwise``, ``qelementwise.c``) is its reference bit for bit on every
ISA this CPU runs and every layout the arena hands it; the normalize rule fuses an onnxruntime QDQ ResNet-18's
residual adds without changing a code, and leaves the chain where it does not apply, saying why."""

from __future__ import annotations

import math
import warnings
import zlib

import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from npu_program.program import Dispatch, TensorSpec
from npu_runtime.backends import cpu_gemv_build, cpu_qelementwise
from npu_runtime.backends.cpu_kernels import Reference, make_kernel
from tests.native import isa_fixtures
from tests.runtime.test_cpu_qconv import resnet18_qdq_import  # noqa: F401  (a fixture, used by name)
from torch_ir.ops.npu_quant import dequantize, qadd, quantize

DTYPES = {"uint8": torch.uint8, "int8": torch.int8}
QADD_RULES = {"qdq_add", "qdq_add_relu"}


def _codes(shape: tuple, dtype: str, g: torch.Generator) -> torch.Tensor:
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    return torch.randint(lo, hi, shape, generator=g).to(DTYPES[dtype])


def _operands(shape: tuple, at: str, bt: str, yt: str, g: torch.Generator, halves: bool = False) -> list:
    """a a_scale a_zp b b_scale b_zp y_scale y_zp; ``halves``: scales that put many sums on a tie (x.5 steps)."""
    def zp(dtype: str) -> torch.Tensor:
        return _codes((), dtype, g)

    if halves:
        scales = [torch.tensor(0.5), torch.tensor(0.25), torch.tensor(1.0)]
    else:
        scales = [torch.rand((), generator=g) * 0.05 + 1e-3 for _ in range(3)]
    return [_codes(shape, at, g), scales[0], zp(at), _codes(shape, bt, g), scales[1], zp(bt), scales[2], zp(yt)]


def _chain(ins: list, out: str, relu: bool, method: str) -> torch.Tensor:
    """What the unfused QDQ chain computes: each node's reference in turn (aten.add / aten.relu as torch's)."""
    a, sa, za, b, sb, zb, sy, zy = ins
    s = torch.add(dequantize(a, sa, za, dtype=str(a.dtype)[6:]), dequantize(b, sb, zb, dtype=str(b.dtype)[6:]))
    return quantize(torch.relu(s) if relu else s, sy, zy, dtype=out, method=method)


TYPES = [("uint8", "uint8", "uint8"), ("int8", "int8", "int8"), ("uint8", "int8", "int8"), ("int8", "uint8", "uint8")]


@pytest.mark.parametrize("types", TYPES, ids="-".join)
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("method", ["divide", "multiply_inverse"])
@pytest.mark.parametrize("halves", [False, True])
def test_the_reference_is_the_qdq_chain_bit_for_bit(types: tuple, relu: bool, method: str, halves: bool) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(repr((types, relu, method, halves)).encode()))
    ins = _operands((2, 8, 9, 9), *types, g, halves=halves)
    got = qadd(*ins, out_dtype=types[2], activation="relu" if relu else None, method=method)
    assert got.dtype == DTYPES[types[2]] and torch.equal(got, _chain(ins, types[2], relu, method))
    if halves:  # the test reaches ties: sums at an odd multiple of 0.5 (round half to even decides)
        s = dequantize(ins[0], ins[1], ins[2], dtype=types[0]) + dequantize(ins[3], ins[4], ins[5], dtype=types[1])
        assert bool((torch.frac(s).abs() == 0.5).any())


def test_the_reference_broadcasts_as_aten_add() -> None:
    g = torch.Generator().manual_seed(1)
    ins = _operands((2, 8, 5, 5), "uint8", "uint8", "uint8", g)
    ins[3] = _codes((8, 1, 1), "uint8", g)
    assert qadd(*ins, out_dtype="uint8").shape == (2, 8, 5, 5)
    assert torch.equal(qadd(*ins, out_dtype="uint8"), _chain(ins, "uint8", False, "divide"))


# ------------------------------------------------------------------------------------------------ the CPU kernel


qlib, isa = isa_fixtures(cpu_qelementwise, cpu_qelementwise.ISAS, "TORCH_IR_QADD_ISA")


def _kernel(ins: list, params: dict, out_shape: tuple, out_dtype: str, kernel: str = "QADD") -> object:
    names = [f"in{i}" for i in range(len(ins))]
    specs = {n: TensorSpec(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in zip(names, ins)}
    specs["y"] = TensorSpec("y", list(out_shape), out_dtype)
    k = make_kernel(Dispatch(kernel=kernel, node="n", inputs=names, outputs=["y"], params=params), specs,
                    {n for i, n in enumerate(names) if i not in (0, 3)})
    k.prepare({n: t for i, (n, t) in enumerate(zip(names, ins)) if i not in (0, 3)})
    return k


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as the CPU arena holds a 4-D NHWC tensor: a strided NCHW view of NHWC bytes."""
    return t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


# shapes: not multiples of the vector width, one over several parallel chunks
SHAPES = [(1,), (7,), (3, 37), (1, 5, 7, 9), (2, 64, 17, 19), (1, 3, 131, 129)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("types", TYPES, ids="-".join)
@pytest.mark.parametrize("relu", [False, True])
def test_the_kernel_is_the_reference_bit_for_bit(shape: tuple, types: tuple, relu: bool, isa: str) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, types, relu)).encode()))
    for method, halves in (("divide", False), ("divide", True), ("multiply_inverse", False)):
        ins = _operands(shape, *types, g, halves=halves)
        params = {"out_dtype": types[2], "activation": "relu" if relu else None, "method": method}
        expected = qadd(*ins, **params)
        k = _kernel(ins, params, shape, types[2])
        assert isinstance(k, cpu_qelementwise.QAdd) and k.native
        y = torch.full_like(expected, 99)
        k.run(ins, [y])
        assert torch.equal(y, expected), (method, halves)


LAYOUTS = ["nhwc", "mixed_in", "nhwc_in", "nhwc_out", "transposed_out"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_the_arena_hands_it(layout: str, isa: str) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(layout.encode()))
    shape = (2, 24, 7, 5)
    ins = _operands(shape, "uint8", "uint8", "uint8", g)
    params = {"out_dtype": "uint8", "activation": "relu", "method": "divide"}
    expected = qadd(*ins, **params)
    k = _kernel(ins, params, shape, "uint8")
    run_ins, y = list(ins), torch.full_like(expected, 99)
    if layout in ("nhwc", "mixed_in", "nhwc_in"):
        run_ins[0] = _nhwc(ins[0])
        run_ins[3] = _nhwc(ins[3]) if layout != "mixed_in" else ins[3]
    if layout in ("nhwc", "nhwc_out"):
        y = _nhwc(y)
    if layout == "transposed_out":
        y = torch.full(shape[::-1], 99, dtype=torch.uint8).permute(3, 2, 1, 0)
    k.run(run_ins, [y])
    assert torch.equal(y, expected)


def test_an_output_over_an_input_is_exact(isa: str) -> None:
    g = torch.Generator().manual_seed(7)
    ins = _operands((3, 1000), "int8", "int8", "int8", g)
    params = {"out_dtype": "int8", "activation": None, "method": "divide"}
    expected = qadd(*ins, **params)
    k = _kernel(ins, params, (3, 1000), "int8")
    a = ins[0].clone()
    k.run([a, *ins[1:]], [a])  # in place over a
    assert torch.equal(a, expected)
    buf = torch.cat([ins[0].reshape(-1), torch.zeros(5, dtype=torch.int8)])
    a, y = buf[5:].reshape(3, 1000), buf[:3000].reshape(3, 1000)  # y overlaps a, 5 elements behind it
    a.copy_(ins[0])
    k.run([a, *ins[1:]], [y])
    assert torch.equal(y, expected)


@pytest.mark.parametrize(("shape", "small"), [((1, 128, 96), (96,)), ((3, 7, 37), (1, 37)), ((4, 5, 6), (5, 6)),
                                              ((2, 300, 77), (1, 1, 77)), ((5, 3), (1,))])
@pytest.mark.parametrize("first", [False, True], ids=["repeated_b", "repeated_a"])
def test_a_repeated_operand_is_the_reference_bit_for_bit(shape: tuple, small: tuple, first: bool, isa: str) -> None:
    """One operand repeated along y's trailing dims (a QDQ transformer's bias add: [N] against [..., N]), first or
    second, relu or not, both quotients: the native kernel (the repeated one passed as b) equals the reference."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, small, first)).encode()))
    for relu, method in ((False, "divide"), (True, "divide"), (False, "multiply_inverse")):
        ins = _operands(shape, "uint8", "int8", "uint8", g, halves=True)
        ins[3] = _codes(small, "int8", g)
        if first:
            ins = [*ins[3:6], *ins[0:3], *ins[6:]]
        params = {"out_dtype": "uint8", "activation": "relu" if relu else None, "method": method}
        expected = qadd(*ins, **params)
        k = _kernel(ins, params, shape, "uint8")
        assert isinstance(k, cpu_qelementwise.QAdd) and k.native and k.period == math.prod(small)
        y = torch.full_like(expected, 99)
        k.run(ins, [y])
        assert torch.equal(y, expected), (relu, method)


def test_refused_cases_run_the_reference() -> None:
    g = torch.Generator().manual_seed(3)
    ins = _operands((2, 8, 5, 5), "uint8", "uint8", "uint8", g)
    ins[3] = _codes((8, 1, 1), "uint8", g)  # a broadcast add
    params = {"out_dtype": "uint8", "activation": None, "method": "divide"}
    k = _kernel(ins, params, (2, 8, 5, 5), "uint8")
    y = torch.empty(2, 8, 5, 5, dtype=torch.uint8)
    k.run(ins, [y])
    assert isinstance(k, Reference) and torch.equal(y, qadd(*ins, **params))
    # a zero y_scale (0 / 0 is NaN): accepted by shape, refused at prepare, the reference runs
    ins = _operands((4, 9), "int8", "int8", "int8", g)
    ins[6] = torch.tensor(0.0)
    k = _kernel(ins, {**params, "out_dtype": "int8"}, (4, 9), "int8")
    assert isinstance(k, cpu_qelementwise.QAdd) and not k.native


def test_without_the_native_library_it_warns_once_and_runs_the_reference(monkeypatch) -> None:
    for name, value in (("library", None), ("failed", "no compiler (test)"), ("warned", False)):
        monkeypatch.setattr(cpu_qelementwise._kernel, name, value)
    monkeypatch.setattr(cpu_gemv_build.NativeKernel, "enabled", True)
    ins = _operands((3, 11), "uint8", "uint8", "uint8", torch.Generator().manual_seed(4))
    params = {"out_dtype": "uint8", "activation": "relu", "method": "divide"}
    k = _kernel(ins, params, (3, 11), "uint8")
    y = torch.empty(3, 11, dtype=torch.uint8)
    with pytest.warns(RuntimeWarning, match="reference"):
        k.run(ins, [y])
    assert torch.equal(y, qadd(*ins, **params))


# ------------------------------------------------------------------------------------------------ the rule


def _run_program(ir, weights: dict, x: torch.Tensor, disabled: set[str]) -> tuple[torch.Tensor, list]:
    """``ir`` compiled for the CPU (normalized there with the ``disabled`` rules off) and run on ``x``."""
    from npu_compiler import CompileOptions
    from npu_compiler import compile as npu_compile
    from npu_compiler.passes import NormalizeOptions
    from npu_runtime import Device, Executor, NPUBuffer, load_weights

    options = CompileOptions(normalize_options=NormalizeOptions(disabled_rules=disabled))
    program = npu_compile(ir, target="cpu", fallback="cpu", options=options)
    device = Device()
    executor = Executor(program, device)
    bound = load_weights({k: v.contiguous() for k, v in weights.items()}, program, device)
    feeds = {program.input_specs[0].name: NPUBuffer.from_numpy(x.numpy(), device, spec=program.input_specs[0])}
    out = executor.run(feeds, weights=bound)
    return torch.from_numpy(out[program.output_specs[0].name].to_numpy()), executor.kernels


@pytest.mark.slow
def test_qdq_resnet18_adds_fuse_and_give_the_same_codes(resnet18_qdq_import, qlib) -> None:  # noqa: F811
    from npu_compiler.passes import NormalizeOptions, normalize
    from torch_ir import IRExecutor

    raw, weights, x = resnet18_qdq_import
    fused = normalize(raw)
    unfused = normalize(raw, NormalizeOptions(disabled_rules=set(QADD_RULES)))
    assert fused.op_histogram().get("QADD") == 8 and "aten.add.Tensor" not in fused.op_histogram()
    assert unfused.op_histogram().get("aten.add.Tensor") == 8 and "QADD" not in unfused.op_histogram()
    got, kernels = _run_program(raw, weights, x, set())
    assert sum(isinstance(k, cpu_qelementwise.QAdd) and k.native for k in kernels) == 8
    before, kernels = _run_program(raw, weights, x, QADD_RULES)
    assert not any(isinstance(k, cpu_qelementwise.QAdd) for k in kernels)
    (interpreted,) = IRExecutor(fused, weights).run([x])
    assert torch.equal(got, before) and torch.equal(got, interpreted)
    # against the unnormalized import: QCONV rounds once where a QDQ convolution rounds twice, so only QADD here
    only_adds = normalize(raw, NormalizeOptions(disabled_rules={"qdq_conv", "qdq_gemm", "qdq_matmul"}))
    # (a block's input dequantized once for its convolution and its skip: those adds keep the chain, saying why)
    assert only_adds.op_histogram().get("QADD", 0) >= 3 and "QCONV" not in only_adds.op_histogram()
    assert all("read outside" in r for r in _rejections(only_adds)) and _rejections(only_adds)
    assert not _rejections(fused)  # no stale rejection: the rule fired on each add once its convolutions had
    assert torch.equal(IRExecutor(only_adds, weights).run([x])[0], IRExecutor(raw, weights).run([x])[0])


def _qdq_add_model(*, relu: bool = False, per_channel: bool = False, broadcast: bool = False,
                   add_is_output: bool = False) -> onnx.ModelProto:
    """DequantizeLinear(a), DequantizeLinear(b) -> Add [-> Relu] -> QuantizeLinear, uint8 codes."""
    shape, b_shape = [1, 4, 3, 3], [1, 4, 1, 1] if broadcast else [1, 4, 3, 3]
    inits = [numpy_helper.from_array(torch.tensor(v, dtype=torch.float32).numpy(), n)
             for n, v in (("sa", 0.02), ("sb", 0.03), ("sy", 0.04))]
    inits += [numpy_helper.from_array(torch.tensor(v, dtype=torch.uint8).numpy(), n)
              for n, v in (("za", 128), ("zb", 120), ("zy", 0 if relu else 128))]
    if per_channel:
        inits[0] = numpy_helper.from_array(torch.tensor([0.02, 0.01, 0.03, 0.04]).numpy(), "sa")
        inits[3] = numpy_helper.from_array(torch.full((4,), 128, dtype=torch.uint8).numpy(), "za")
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"], axis=1),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["fb"]),
             helper.make_node("Add", ["fa", "fb"], ["s"])]
    last = "s"
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["r"]))
        last = "r"
    nodes.append(helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.UINT8, shape)]
    if add_is_output:
        outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, shape))
    graph = helper.make_graph(nodes, "qadd", [helper.make_tensor_value_info("a", TensorProto.UINT8, shape),
                                              helper.make_tensor_value_info("b", TensorProto.UINT8, b_shape)],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _rejections(ir) -> list[str]:
    return [reason for stage in ir.metadata["normalize"]["stages"] for rule, _, reason in stage["rejected"]
            if rule in QADD_RULES]


def test_relu_after_the_add_fuses_and_the_codes_stay() -> None:
    from npu_compiler.passes import normalize
    from torch_ir import IRExecutor
    from torch_ir.frontends.onnx import import_onnx

    raw, weights = import_onnx(_qdq_add_model(relu=True))
    fused = normalize(raw)
    (node,) = [n for n in fused.nodes if n.op_type == "QADD"]
    assert node.attrs["activation"] == "relu" and "aten.relu.default" not in fused.op_histogram()
    g = torch.Generator().manual_seed(9)
    xs = [_codes((1, 4, 3, 3), "uint8", g) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(IRExecutor(fused, weights).run(xs)[0], IRExecutor(raw, weights).run(xs)[0])


def test_a_broadcast_add_fuses_and_the_codes_stay() -> None:
    """A broadcast operand (a QDQ transformer's bias: uint8 codes of its own scale, [N] against [..., N]) fuses too:
    QADD broadcasts as aten.add, and its codes are the chain's bit for bit."""
    from npu_compiler.passes import normalize
    from torch_ir import IRExecutor
    from torch_ir.frontends.onnx import import_onnx

    raw, weights = import_onnx(_qdq_add_model(broadcast=True))
    fused = normalize(raw)
    assert fused.op_histogram().get("QADD") == 1 and "aten.add.Tensor" not in fused.op_histogram()
    g = torch.Generator().manual_seed(10)
    xs = [_codes((1, 4, 3, 3), "uint8", g), _codes((1, 4, 1, 1), "uint8", g)]
    assert torch.equal(IRExecutor(fused, weights).run(xs)[0], IRExecutor(raw, weights).run(xs)[0])


@pytest.mark.parametrize(("variant", "reason"), [
    ({"per_channel": True}, "per channel"), ({"add_is_output": True}, "")])
def test_rejected_cases_keep_the_chain(variant: dict, reason: str) -> None:
    from npu_compiler.passes import normalize
    from torch_ir.frontends.onnx import import_onnx

    ir = normalize(import_onnx(_qdq_add_model(**variant))[0])
    assert "QADD" not in ir.op_histogram() and ir.op_histogram().get("aten.add.Tensor") == 1
    reasons = _rejections(ir)
    assert reasons and all(reason in r for r in reasons), reasons
