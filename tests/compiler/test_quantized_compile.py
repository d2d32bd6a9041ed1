"""Quantized NPU ops compiled into programs: QUANTIZE -> QCONV -> QCONV -> DEQUANTIZE -> GEMM and a DQGEMM with
packed int4 group-quantized weights compile for the CPU, run in the runtime as the IR executor runs the same IR (the
integer ops bit for bit; the float GEMM at the end within float32 rounding: the runtime's oneDNN sums in another
order than torch's reference), keep every tensor's quantization spec through ``.npubin``, and size packed buffers
right."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import npu_compiler
from npu_compiler import UnsupportedOpsError
from npu_program import npubin
from npu_program.check import check_program
from npu_program.npubin import NpubinError
from npu_program.program import CompiledProgram
from npu_runtime import Device, Executor, NPUBuffer, load_weights
from torch_ir import IRExecutor
from torch_ir.quant.spec import QuantSpec

from .quantized_models import dqgemm_model, qconv_model

MODELS = {"qconv": qconv_model, "dqgemm": dqgemm_model}


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to float32's rounding of the float ops after the integer ones (a few ulps of K = 4 sums)."""
    torch.testing.assert_close(got, want, rtol=4 * torch.finfo(torch.float32).eps, atol=1e-6)


def run_program(program: CompiledProgram, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    device = Device()
    bound = load_weights(weights, program, device)
    out = Executor(program, device).run({program.input_specs[0].name: NPUBuffer.from_numpy(
        x.numpy(), device, spec=program.input_specs[0])}, weights=bound)
    return torch.from_numpy(out[program.output_specs[0].name].to_numpy())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_compiled_quantized_program_equals_the_ir_executor(name):
    ir, weights, x = MODELS[name]()
    (want,) = IRExecutor(ir, weights).run([x])
    program = npu_compiler.compile(ir, target="cpu")
    assert not program.host_dispatches  # every quantized op is a kernel of the CPU target
    assert_same(run_program(program, weights, x), want)


def test_the_qconv_chain_approximates_its_float_model():
    """The IR's reference is itself checked: the quantized chain tracks the float model it quantizes (a few
    quantization steps), so the bit-exact comparison above compares meaningful codes, not saturated ones."""
    ir, weights, x = qconv_model()
    (got,) = IRExecutor(ir, weights).run([x])
    g = torch.Generator().manual_seed(0)
    torch.randn(1, 3, 8, 8, generator=g)
    w1f, w2f = torch.randn(4, 3, 3, 3, generator=g) * 0.3, torch.randn(4, 4, 3, 3, generator=g) * 0.3
    b1f, gemm_w = torch.randn(4, generator=g) * 0.1, torch.randn(5, 4, generator=g)
    h = F.conv2d(F.relu(F.conv2d(x, w1f, b1f, padding=1)), w2f, stride=2, padding=1)
    want = h @ gemm_w.t()
    assert (got - want).abs().max() < 0.1 * want.abs().max()


def test_the_dqgemm_program_computes_the_int4_layer():
    """Expected values from the unpacked codes, computed here: gelu then relu of x · (codes · scale)ᵀ + b."""
    ir, weights, x = dqgemm_model()
    packed = weights["w"].to(torch.int16)
    codes = torch.stack((packed & 0xF, packed >> 4), -1).flatten(-2)
    codes = torch.where(codes > 7, codes - 16, codes).float()
    wf = codes * weights["w_s"].repeat_interleave(16, 1)
    want = F.relu(F.gelu(x @ wf.t() + weights["b"]))
    got = run_program(npu_compiler.compile(ir, target="cpu"), weights, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_packed_int4_and_integer_buffers_are_sized_by_their_bits():
    ir, weights, _ = dqgemm_model()
    program = npu_compiler.compile(ir, target="cpu")
    w = next(s for s in program.weight_specs if s.name == "w")
    assert (w.dtype, w.shape, w.nbytes, w.storage) == ("int4", [8, 32], 128, ("uint8", [8, 16]))
    assert program.weight_bytes == 128 + 8 * 2 * 4 + 8 * 4
    check_program(program)  # the memory plan and every spec, checked from scratch
    qprogram = npu_compiler.compile(qconv_model()[0], target="cpu")
    check_program(qprogram)
    assert qprogram.tensors["q0"].nbytes == 3 * 8 * 8 and qprogram.tensors["q2"].nbytes == 4 * 4 * 4
    offsets, alignment = qprogram.memory.offsets, qprogram.memory.alignment
    assert all(offsets[n] % alignment == 0 for n in ("q0", "q1", "q2"))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_npubin_keeps_every_quantization_spec(tmp_path, name):
    ir, weights, x = MODELS[name]()
    program = npu_compiler.compile(ir, target="cpu")
    path = tmp_path / "q.npubin"
    program.save(path)
    loaded = CompiledProgram.load(path)
    want = {t.name: t.quant for t in ir.tensors() if t.quant is not None}
    got = {s.name: s.quant for s in [*loaded.tensors.values(), *loaded.weight_specs] if s.quant is not None}
    assert got == {n: q for n, q in want.items() if n in got} and set(got) >= {"w"} & set(want)
    assert all(isinstance(q, QuantSpec) for q in got.values())
    embedded = {t["name"]: t.get("quant") for t in loaded.ir["weights"]}
    assert all(embedded[n] == q.to_dict() for n, q in want.items() if n in embedded)
    assert_same(run_program(loaded, weights, x), IRExecutor(ir, weights).run([x])[0])
    assert struct.unpack_from("<8sHH", path.read_bytes())[1:] == (2, 1)


def test_every_quantized_tensor_of_the_qconv_chain_keeps_its_spec():
    ir, _, _ = qconv_model()
    program = npu_compiler.compile(ir, target="cpu")
    specs = {**program.tensors, **{s.name: s for s in program.weight_specs}}
    assert {n for n, s in specs.items() if s.quant is not None} == {"q0", "q1", "q2", "w1", "w2"}
    assert specs["q1"].quant == QuantSpec("uint8", "y1s", "y1zp")


def _patched(program: CompiledProgram, tensor: str, quant: dict) -> bytes:
    """The program's file with ``tensor``'s quant spec replaced in the header (checksum recomputed)."""
    data = npubin.encode_npubin(program)
    _, major, minor, length = struct.unpack_from("<8sHHQ", data)
    header = json.loads(data[20:20 + length])
    for spec in [*header["tensors"], *header["weight_specs"]]:
        if spec["name"] == tensor:
            spec["quant"] = quant
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    body = struct.pack("<8sHHQ", b"NPUBIN\0\0", major, minor, len(raw)) + raw
    body += bytes(-len(body) % 64)  # the blob is empty: the program has no constants
    return body + hashlib.sha256(body).digest()


@pytest.mark.parametrize(("tensor", "quant", "message"), [
    ("q1", {"dtype": "int9", "scale": "y1s"}, r"header\.tensors\[\d+\]\.quant: quantized dtype 'int9' is not one of"),
    ("q1", {"dtype": "uint8", "scale": -1.0}, r"constant scales must be finite numbers > 0"),
    ("q1", {"dtype": "uint8", "scale": "y1s", "bits": 8}, r"unknown field\(s\) \['bits'\]"),
    ("q1", {"dtype": "int8", "scale": "y1s"}, r"the tensor is uint8 but its quantization spec says int8"),
    ("w1", {"dtype": "int8", "scale": "w1_s", "axis": 0, "group_size": 3},
     r"tensor 'w1' quant: group_size 3 does not divide"),
    ("w1", {"dtype": "int8", "scale": "y1s", "axis": 0}, r"scale tensor 'y1s' has shape \[\]"),
    ("q1", ["uint8"], r"tensors\[\d+\]\.quant: expected object"),
])
def test_a_bad_quantization_spec_in_a_file_is_refused_naming_the_tensor(tmp_path, tensor, quant, message):
    program = npu_compiler.compile(qconv_model()[0], target="cpu")
    path = tmp_path / "bad.npubin"
    path.write_bytes(_patched(program, tensor, quant))
    with pytest.raises(NpubinError, match=message) as err:
        CompiledProgram.load(path)
    assert str(path) in str(err.value)


def test_webgpu_runs_the_int8_ops_and_places_the_others_on_the_host_or_refuses_them_with_the_way_out():
    """QUANTIZE, QCONV, DEQUANTIZE are WebGPU kernels (a strict compile takes them); DQGEMM (weight-only) is not."""
    program = npu_compiler.compile(qconv_model()[0], target="webgpu")
    assert not program.host_dispatches and {"QUANTIZE", "QCONV", "DEQUANTIZE"} <= {d.kernel for d in program.dispatches}
    ir, _, _ = dqgemm_model()
    with pytest.raises(UnsupportedOpsError, match=r"(?s)DQGEMM.*fallback=\"cpu\""):
        npu_compiler.compile(ir, target="webgpu")
    program = npu_compiler.compile(ir, target="webgpu", fallback="cpu")
    host = {d.kernel for _, d in program.host_dispatches}
    assert host == {"DQGEMM"}
    assert all("webgpu" in d.host for _, d in program.host_dispatches)
