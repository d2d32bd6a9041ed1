"""The .npubin format: exact round trip, deterministic bytes, and loud refusal of every kind of bad file."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import pytest
import torch

import npu_compiler
import torch_ir
from npu_compiler.compiled_program import CompiledProgram, Dispatch, MemoryPlan, TensorSpec
from npu_program import npubin
from npu_program.npubin import NpubinError, read_npubin, write_npubin

FIXED_SIZE = 20  # magic 8 + major 2 + minor 2 + header length 8


def make_program() -> CompiledProgram:
    """A small but complete program: several kernels, a view alias, two constants with real bytes."""
    tensors = {
        "x": TensorSpec("x", [1, 3, 8, 8], "float32"),
        "conv_out": TensorSpec("conv_out", [1, 4, 8, 8], "float32", layout="NHWC"),
        "flat": TensorSpec("flat", [1, 256], "float32"),
        "relu_out": TensorSpec("relu_out", [1, 256], "float32"),
        "fc_out": TensorSpec("fc_out", [1, 10], "float32"),
        "scale": TensorSpec("scale", [10], "float16"),
        "index": TensorSpec("index", [3], "int64"),
        "y": TensorSpec("y", [1, 10], "float32"),
    }
    return CompiledProgram(
        model_name="tiny_cnn",
        target="npu-sim",
        input_specs=[tensors["x"]],
        output_specs=[tensors["y"]],
        weight_specs=[TensorSpec("w_conv", [4, 3, 3, 3], "float32"), TensorSpec("w_fc", [10, 256], "bfloat16")],
        weight_keys={"w_conv": "features.0.weight", "w_fc": "classifier.weight"},
        tensors=tensors,
        dispatches=[
            # the kernels (and their parameters) a compile of TinyCnn emits: test_summary_and_helpers checks
            Dispatch("CONV", "conv", ["x", "w_conv"], ["conv_out"], {
                "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "has_bias": False,
                "bn_eps": 1e-05, "activation": None, "has_residual": False, "inplace_residual": False}),
            Dispatch("aten.reshape.default", "flatten", ["conv_out"], ["flat"], {"shape": [1, 256]}),
            Dispatch("aten.relu.default", "relu", ["flat"], ["relu_out"]),
            Dispatch("GEMM", "gemm", ["relu_out", "w_fc"], ["fc_out"], {
                "trans_a": False, "trans_b": True, "has_bias": False, "has_residual": False, "activation": None,
                "x_int8_group": None}),
            Dispatch("aten.mul.Tensor", "mül ünïcode", ["fc_out", "scale"], ["y"]),
        ],
        memory=MemoryPlan(arena_bytes=2048, offsets={"x": 0, "conv_out": 1024, "relu_out": 0, "fc_out": 1024,
                                                     "y": 1088},
                          no_reuse_bytes=4096, alignment=64, aliases={"flat": "conv_out"}),
        constants={"scale": bytes(range(20)), "index": struct.pack("<3q", 2, 0, 1)},
        ir={"graph": {"nodes": [{"name": "conv", "op": "aten.conv2d.default"}]}, "version": "1"},
        metadata={"compiler": "npu_compiler 0.1", "options": {"fuse": True}, "note": "ünïcode ok", "none": None},
    )


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "m.npubin"
    make_program().save(path)
    return path


def rewrite_with_checksum(path, body: bytes) -> None:
    """Write `body` plus a fresh checksum, so that only the check under test can fire."""
    path.write_bytes(body + hashlib.sha256(body).digest())


# ------------------------------------------------------------------------------------------ round trip


def test_round_trip_is_equal_field_by_field(saved):
    original, loaded = make_program(), CompiledProgram.load(saved)
    for field in original.__dataclass_fields__:
        assert getattr(loaded, field) == getattr(original, field), field
    assert loaded == original
    assert list(loaded.tensors) == list(original.tensors)  # order kept, not sorted
    assert isinstance(loaded.constants["scale"], bytes)


def test_save_is_deterministic(tmp_path):
    first, second = tmp_path / "a.npubin", tmp_path / "b.npubin"
    make_program().save(first)
    make_program().save(second)
    assert first.read_bytes() == second.read_bytes()


def test_layout_magic_version_alignment_and_checksum(saved):
    data = saved.read_bytes()
    magic, major, minor, header_len = struct.unpack_from("<8sHHQ", data)
    assert (magic, major, minor) == (b"NPUBIN\0\0", 2, 1)
    header = json.loads(data[FIXED_SIZE:FIXED_SIZE + header_len])
    blob_start = -(-(FIXED_SIZE + header_len) // 64) * 64
    for entry in header["constants"].values():
        assert entry["offset"] % 64 == 0
    scale = header["constants"]["scale"]
    assert data[blob_start + scale["offset"]:][:scale["nbytes"]] == bytes(range(20))
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()
    assert not data.startswith(b"\x80")  # not a pickle stream


def test_program_without_ir_or_constants_round_trips(tmp_path):
    program = make_program()
    program.ir, program.constants = None, {}
    # without its embedded constants, "scale" must be a weight slot: a tensor read with no storage is refused
    program.weight_specs.append(program.tensors.pop("scale"))
    program.save(tmp_path / "p.npubin")
    assert CompiledProgram.load(tmp_path / "p.npubin") == program


# ------------------------------------------------------------------------------------------ refusals


def test_missing_file(tmp_path):
    with pytest.raises(NpubinError, match="no such file") as info:
        read_npubin(tmp_path / "absent.npubin")
    assert "absent.npubin" in str(info.value)


@pytest.mark.parametrize("where", ["fixed_header", "json", "blob", "last_byte"])
def test_truncated_file_is_refused(saved, where):
    data = saved.read_bytes()
    header_len = struct.unpack_from("<Q", data, 12)[0]
    cut = {"fixed_header": 10, "json": FIXED_SIZE + header_len // 2, "blob": len(data) - 32 - 10,
           "last_byte": len(data) - 1}[where]
    saved.write_bytes(data[:cut])
    with pytest.raises(NpubinError, match="truncated") as info:
        read_npubin(saved)
    assert str(saved) in str(info.value)


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.45, 0.5, 0.7, 0.9, 0.99, 1.0])
def test_one_flipped_byte_anywhere_is_refused(saved, fraction):
    data = bytearray(saved.read_bytes())
    index = min(int(len(data) * fraction), len(data) - 1)
    data[index] ^= 0x01
    saved.write_bytes(bytes(data))
    with pytest.raises(NpubinError) as info:
        read_npubin(saved)
    assert str(saved) in str(info.value)


def test_flipped_byte_in_body_reports_checksum(saved):
    data = bytearray(saved.read_bytes())
    data[FIXED_SIZE + 5] ^= 0x20
    saved.write_bytes(bytes(data))
    with pytest.raises(NpubinError, match="checksum mismatch: file was altered or truncated; recompile"):
        read_npubin(saved)


def test_wrong_magic(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07\x12\x07pytorch" + bytes(100))
    with pytest.raises(NpubinError, match="not a .npubin file") as info:
        read_npubin(path)
    assert str(path) in str(info.value)


def test_future_major_version_is_refused(saved):
    body = bytearray(saved.read_bytes()[:-32])
    struct.pack_into("<HH", body, 8, 4, 0)  # 3 is a dynamic program's (tests/dynamic)
    rewrite_with_checksum(saved, bytes(body))
    with pytest.raises(NpubinError, match=r"version 4\.0 is not supported.*supports 1\.x, 2\.x.*recompiled"):
        read_npubin(saved)


def test_newer_minor_version_is_accepted(saved):
    body = bytearray(saved.read_bytes()[:-32])
    struct.pack_into("<HH", body, 8, 2, 7)
    rewrite_with_checksum(saved, bytes(body))
    assert read_npubin(saved) == make_program()


def test_a_newer_minor_may_add_fields_this_reader_ignores_but_this_minor_may_not(saved):
    def add_field(header):
        return {**header, "future_optional_field": {"anything": [1, 2]}}

    _rewrite_header(saved, add_field)
    with pytest.raises(NpubinError, match="future_optional_field"):
        read_npubin(saved)
    body = bytearray(saved.read_bytes()[:-32])
    struct.pack_into("<HH", body, 8, 2, 9)
    rewrite_with_checksum(saved, bytes(body))
    assert read_npubin(saved) == make_program()


def _rewrite_header(path, edit) -> None:
    """Replace the JSON header with edit(header) and re-lay the file, keeping blob and checksum valid."""
    data = path.read_bytes()
    header_len = struct.unpack_from("<Q", data, 12)[0]
    header = json.loads(data[FIXED_SIZE:FIXED_SIZE + header_len])
    blob = data[-(-(FIXED_SIZE + header_len) // 64) * 64:-32]
    raw = edit(header)
    raw = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    fixed = struct.pack("<8sHHQ", b"NPUBIN\0\0", *npubin.FORMAT_VERSION, len(raw))
    padding = bytes(-(-(len(fixed) + len(raw)) // 64) * 64 - len(fixed) - len(raw))
    rewrite_with_checksum(path, fixed + raw + padding + blob)


def test_header_that_is_not_json(saved):
    _rewrite_header(saved, lambda header: b"{not json")
    with pytest.raises(NpubinError, match="header is not valid UTF-8 JSON") as info:
        read_npubin(saved)
    assert str(saved) in str(info.value)


@pytest.mark.parametrize("field", ["memory", "dispatches", "tensors", "blob_nbytes", "constants"])
def test_header_missing_a_field_names_it(saved, field):
    _rewrite_header(saved, lambda header: {k: v for k, v in header.items() if k != field})
    with pytest.raises(NpubinError, match=f"lacks required field '{field}'"):
        read_npubin(saved)


def test_what_a_header_requires_is_what_the_dataclasses_require(saved):
    """No list of required fields beside the program's dataclasses: a field with a default (the embedded IR,
    the metadata, the state slots) may be left out and reads as its default."""
    _rewrite_header(saved, lambda header: {k: v for k, v in header.items() if k not in ("ir", "metadata")})
    loaded = read_npubin(saved)
    assert loaded.ir is None and loaded.metadata == {}
    assert not hasattr(npubin, "REQUIRED_FIELDS")


def test_a_constant_range_is_read_strictly(saved):
    def damage(header):
        header["constants"]["scale"] = {"offset": "0", "nbytes": 20}
        return header

    _rewrite_header(saved, damage)
    with pytest.raises(NpubinError, match=r"header\.constants\['scale'\]\.offset: expected int, got string"):
        read_npubin(saved)


def test_header_missing_a_nested_field_names_it(saved):
    def drop_arena(header):
        del header["memory"]["arena_bytes"]
        return header

    _rewrite_header(saved, drop_arena)
    with pytest.raises(NpubinError, match=r"header\.memory lacks required field 'arena_bytes'"):
        read_npubin(saved)


def test_constant_outside_the_blob(saved):
    def move_scale(header):
        header["constants"]["scale"]["offset"] = header["blob_nbytes"] - 4
        return header

    _rewrite_header(saved, move_scale)
    with pytest.raises(NpubinError, match="constant 'scale' range .* lies outside the .*blob") as info:
        read_npubin(saved)
    assert str(saved) in str(info.value)


# ------------------------------------------------------------------------------------------ writing


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(npubin.os, "fsync", fail)  # fails after the temp file exists and holds data
    with pytest.raises(OSError, match="disk full"):
        write_npubin(make_program(), tmp_path / "m.npubin")
    assert os.listdir(tmp_path) == []


def test_failed_write_keeps_the_old_file(saved, monkeypatch):
    before = saved.read_bytes()
    monkeypatch.setattr(npubin.os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError("rename failed")))
    program = make_program()
    program.model_name = "changed"
    with pytest.raises(OSError, match="rename failed"):
        program.save(saved)
    assert saved.read_bytes() == before
    assert os.listdir(saved.parent) == [saved.name]


def test_unserializable_program_is_refused_before_touching_disk(tmp_path):
    program = make_program()
    program.metadata["bad"] = float("nan")
    with pytest.raises(ValueError, match="not strict JSON"):
        program.save(tmp_path / "m.npubin")
    assert os.listdir(tmp_path) == []


def test_constant_of_wrong_size_is_refused_on_write(tmp_path):
    program = make_program()
    program.constants["scale"] = b"\0" * 3
    with pytest.raises(ValueError, match="constant 'scale' holds 3 bytes"):
        program.save(tmp_path / "m.npubin")


# ------------------------------------------------------------------------------------------ data model


class TinyCnn(torch.nn.Module):
    """The network make_program describes: conv, flatten, relu (not fused: a reshape comes between), linear, scale."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x).flatten(1))) * 2.0


def test_summary_and_helpers():
    program = make_program()
    text = program.summary()
    assert "dispatches: 5" in text and "2048 bytes" in text and "4096 bytes" in text and "tiny_cnn" in text
    assert program.dispatch_count == 5 and program.arena_bytes == 2048
    kinds = {"CONV": 1, "GEMM": 1, "aten.mul.Tensor": 1, "aten.relu.default": 1, "aten.reshape.default": 1}
    assert program.kernel_histogram() == kinds
    assert "dispatches: 5 (CONV 1, GEMM 1, aten.mul.Tensor 1, aten.relu.default 1, aten.reshape.default 1)" in text
    # the fixture's kernel names are the compiler's: a real compile of the same network emits exactly these
    with torch.device("meta"):
        meta = TinyCnn()
    ir = torch_ir.extract_ir(meta, (torch.randn(1, 3, 8, 8, device="meta"),), model_name="tiny_cnn")
    compiled = npu_compiler.compile(ir)
    assert compiled.kernel_histogram() == kinds
    assert [d.kernel for d in compiled.dispatches] == [d.kernel for d in program.dispatches]
    assert [sorted(d.params) for d in compiled.dispatches[:4]] == [sorted(d.params) for d in program.dispatches[:4]]
    assert TensorSpec("t", [2, 3], "bfloat16").nbytes == 12
    assert TensorSpec("s", [], "float64").nbytes == 8
    with pytest.raises(ValueError, match="unknown dtype 'complex256'"):
        _ = TensorSpec("c", [1], "complex256").nbytes
