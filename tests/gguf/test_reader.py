"""read_gguf on files gguf.GGUFWriter wrote: every metadata value type, tensor records, views and values."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from torch_ir.frontends.gguf import GGUFError, read_gguf

from .writer import write_gguf


def _metadata(w: gguf.GGUFWriter) -> None:
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_uint64("t.u64", 1 << 60)
    w.add_int64("t.i64", -(1 << 60))
    w.add_float64("t.f64", 1e-300)
    w.add_array("t.arr_str", ["a", "", "ü"])
    w.add_key_value("t.arr_i32", [1, -2, 3], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
    w.add_key_value("t.arr_f32", [0.25, -1.5], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)
    w.add_key_value("t.arr_bool", [True, False], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL)


def test_metadata_of_every_type(tmp_path: Path) -> None:
    f = read_gguf(write_gguf(tmp_path / "m.gguf", "llama", {}, _metadata))
    assert f.version == 3 and f.architecture == "llama" and f.tensors == {} and f.alignment == 32
    expected = {"general.architecture": "llama", "t.u8": 200, "t.i8": -100, "t.u16": 60000, "t.i16": -30000,
                "t.u32": 4_000_000_000, "t.i32": -2_000_000_000, "t.f32": 0.5, "t.bool": True, "t.str": "héllo ✓",
                "t.u64": 1 << 60, "t.i64": -(1 << 60), "t.f64": 1e-300, "t.arr_str": ["a", "", "ü"],
                "t.arr_i32": [1, -2, 3], "t.arr_f32": [0.25, -1.5], "t.arr_bool": [True, False]}
    assert f.metadata == expected
    assert f.value_types["t.arr_i32"] == "array[int32]" and f.value_types["t.u32"] == "uint32"


def _tensors() -> dict[str, tuple[np.ndarray, str]]:
    rng = np.random.default_rng(11)
    return {"a": (rng.standard_normal((3, 5)).astype(np.float32), "F32"),
            "b": (rng.standard_normal((4, 64)).astype(np.float32), "Q8_0"),
            "c": (rng.standard_normal((2, 3, 32)).astype(np.float32), "Q4_0"),
            "d": (rng.standard_normal((2, 6)).astype(np.float32), "F16"),
            "e": (rng.standard_normal(7).astype(np.float32), "BF16")}


@pytest.mark.parametrize("alignment", [None, 64, 1])
def test_tensors_round_trip(tmp_path: Path, alignment: int | None) -> None:
    src = _tensors()
    path = write_gguf(tmp_path / "t.gguf", "llama", src, alignment=alignment)
    ref = gguf.GGUFReader(path)  # the reference reader: same records, same bytes
    with read_gguf(path) as f:
        assert f.alignment == (alignment or 32)
        assert list(f.tensors) == list(src)
        for rt in ref.tensors:
            info = f.tensors[rt.name]
            assert info.ne == tuple(int(d) for d in rt.shape) and info.type.id == int(rt.tensor_type)
            assert f.data_offset + info.offset == rt.data_offset and info.nbytes == rt.n_bytes
        for name, (array, type_name) in src.items():
            t = f.tensor(name)
            assert t.shape == array.shape and t.type.name == type_name
            expected = gguf.quants.dequantize(gguf.quants.quantize(array, gguf.GGMLQuantizationType[type_name]),
                                              gguf.GGMLQuantizationType[type_name])
            assert torch.equal(t.dequantize(), torch.from_numpy(expected.reshape(array.shape)))
        assert f.tensor("a").data.dtype == torch.float32
        assert torch.equal(f.tensor("a").data, torch.from_numpy(src["a"][0]))
        assert f.tensor("d").data.dtype == torch.float16 and f.tensor("e").data.dtype == torch.bfloat16
        assert f.tensor("b").data.dtype == torch.uint8 and tuple(f.tensor("b").data.shape) == (4, 2 * 34)


def test_large_sparse_file_is_mapped_not_read(tmp_path: Path) -> None:
    """A 3 GiB tensor (a sparse file: no disk used) is opened and viewed without reading it into memory."""
    import resource

    path = write_gguf(tmp_path / "t.gguf", "llama", {"small": (np.ones(32, np.float32), "F32")})
    head = path.read_bytes()
    ne0 = 3 << 30  # I8 elements: 3 GiB
    # rewrite the one tensor record as a 3 GiB I8 tensor and extend the file sparsely to hold it
    record = b"small" + struct.pack("<IQIQ", 1, 32, 0, 0)
    assert head.count(record) == 1
    path.write_bytes(head.replace(record, b"small" + struct.pack("<IQIQ", 1, ne0, 24, 0)))
    with open(path, "r+b") as fh:
        fh.truncate(len(head) + ne0)  # the data section starts inside the original file
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    f = read_gguf(path)
    t = f.tensor("small")
    assert t.shape == (ne0,) and t.data.dtype == torch.int8 and int(t.data[-1]) == 0
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 100 << 10, f"peak RSS grew by {grown_kib} KiB"
    with pytest.raises(GGUFError, match="has no tensor 'x'"):
        f.tensor("x")
