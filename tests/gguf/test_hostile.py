"""Hostile GGUF files, built byte by byte: each is refused by read_gguf with one clear toolkit error naming the
file, the field and the rule, before any allocation its fields ask for (traced: under 1 MiB per case)."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import pytest

from torch_ir.errors import InputReadError, LimitExceededError, TorchIRError
from torch_ir.frontends.gguf import GGUFError, read_gguf


def s(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def tensor(name: str, ne: list[int], type_id: int = 0, offset: int = 0) -> bytes:
    return s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + \
        struct.pack("<IQ", type_id, offset)


def gguf_file(kvs: list[bytes] = (), infos: list[bytes] = (), data: bytes = b"", *, version: int = 3,
              n_kv: int | None = None, n_tensors: int | None = None, align: int = 32) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    return body + b"\0" * (-len(body) % align) + data


U32, STR, ARR = 4, 8, 9
ALIGN_KV = kv("general.alignment", U32, struct.pack("<I", 64))
CASES = {
    "truncated_header": (b"GGUF\x03\0\0\0\0", GGUFError, "shorter than the 24-byte header"),
    "not_gguf": (b"\x89PNG" + b"\0" * 40, GGUFError, "not a GGUF file"),
    "version_1": (gguf_file(version=1), GGUFError, "version: 1 is not supported"),
    "big_endian": (gguf_file(version=3 << 24), GGUFError, "big-endian GGUF file"),
    "huge_kv_count": (gguf_file(n_kv=1 << 62), GGUFError, "metadata count: 4611686018427387904 items .* cannot fit"),
    "huge_tensor_count": (gguf_file(n_tensors=1 << 60), GGUFError, "tensor count: .* cannot fit"),
    "key_too_long": (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 40) + b"k" * 8, GGUFError,
                     "metadata key #0: length 1099511627776 is over the 65535-byte limit"),
    "key_length_past_end": (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1000) + b"k" * 8, GGUFError,
                            r"metadata key #0 \(1000 bytes\): needs 1000 bytes at offset 32, past the end"),
    "value_string_past_end": (gguf_file([kv("a", STR, struct.pack("<Q", 10**12))]), GGUFError,
                              "metadata 'a' .* past the end of the file"),
    "huge_array": (gguf_file([kv("a", ARR, struct.pack("<IQ", 0, 1 << 40))]), GGUFError,
                   "an array of 1099511627776 items.*cannot fit"),
    "huge_string_array": (gguf_file([kv("a", ARR, struct.pack("<IQ", STR, 1 << 33))]), GGUFError, "cannot fit"),
    "nested_array": (gguf_file([kv("a", ARR, struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", 0, 0))]), GGUFError,
                     "nested arrays are not supported"),
    "unknown_value_type": (gguf_file([kv("a", 13, b"\0" * 8)]), GGUFError, "value type 13 is not a GGUF type"),
    "duplicate_key": (gguf_file([kv("a", U32, b"\1\0\0\0"), kv("a", U32, b"\2\0\0\0")]), GGUFError,
                      "metadata key 'a': appears twice"),
    "invalid_utf8_key": (gguf_file([s(b"\xff\xfe") + struct.pack("<I", U32) + b"\0" * 4]), GGUFError,
                         "not valid UTF-8"),
    "empty_key": (gguf_file([kv("", U32, b"\0" * 4)]), GGUFError, "metadata key #0: is empty"),
    "bad_bool": (gguf_file([kv("b", 7, b"\x02")]), GGUFError, "a bool must be 0 or 1, got 2"),
    "alignment_not_power_of_two": (gguf_file([kv("general.alignment", U32, struct.pack("<I", 48))]), GGUFError,
                                   "general.alignment.*power of two, got uint32 48"),
    "alignment_zero": (gguf_file([kv("general.alignment", U32, b"\0" * 4)]), GGUFError, "power of two"),
    "offset_past_end": (gguf_file([], [tensor("blk.0.attn_q.weight", [1024], 0, 0)], b"\0" * 64), GGUFError,
                        r"tensor 'blk.0.attn_q.weight': data offset \d+ \+ offset 0 \+ 4096 bytes .* past the end"),
    "misaligned_offset": (gguf_file([], [tensor("t", [4], 0, 8)], b"\0" * 64), GGUFError,
                          "offset 8 is not a multiple of the alignment 32"),
    "misaligned_custom": (gguf_file([ALIGN_KV], [tensor("t", [4], 0, 32)], b"\0" * 128, align=64), GGUFError,
                          "offset 32 is not a multiple of the alignment 64"),
    "unknown_type_id": (gguf_file([], [tensor("t", [32], 99)], b"\0" * 64), GGUFError,
                        "tensor 't': GGML type 99 is not a known type"),
    "too_many_dims": (gguf_file([], [tensor("t", [1] * 5)], b"\0" * 64), GGUFError, "has 5 dimensions"),
    "dims_overflow": (gguf_file([], [tensor("t", [1 << 32] * 4)], b"\0" * 64), LimitExceededError,
                      "tensor 't'.*over the .* limit"),
    "dim_over_max_dim": (gguf_file([], [tensor("t", [(1 << 40) + 1])], b"\0" * 64), LimitExceededError,
                         "dimension 1099511627777 .* over the 1099511627776 limit"),
    "block_not_whole": (gguf_file([], [tensor("t", [48, 2], 8)], b"\0" * 256), GGUFError,
                        "ne.0.=48 is not a multiple of 32, the elements in one Q8_0 block"),
    "duplicate_tensor": (gguf_file([], [tensor("t", [8]), tensor("t", [8], 0, 32)], b"\0" * 64), GGUFError,
                         "tensor 't': appears twice"),
    "overlapping_tensors": (gguf_file([], [tensor("a", [16]), tensor("b", [8], 0, 32)], b"\0" * 128), GGUFError,
                            "tensor 'b': offset 32 overlaps tensor 'a'"),
    "name_too_long": (gguf_file([], [tensor("x" * 200, [8])], b"\0" * 64), GGUFError,
                      "length 200 is over the 63-byte limit"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_file_refused(tmp_path: Path, case: str) -> None:
    data, error, pattern = CASES[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(error, match=pattern) as info:
            read_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(info.value, TorchIRError)
    assert str(path) in str(info.value)
    assert peak < 1 << 20, f"{peak} bytes allocated while refusing {case}"


def test_valid_handmade_file_reads(tmp_path: Path) -> None:
    """The builder above makes readable files when nothing is wrong: the hostile cases fail for their reason."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(gguf_file([ALIGN_KV], [tensor("a", [16]), tensor("b", [8], 0, 64)], bytes(range(128)), align=64))
    f = read_gguf(path)
    assert f.alignment == 64 and f.tensor("b").data.shape == (8,)
    assert f.tensor("b").data.view(-1).numpy().view("u1")[:4].tolist() == [64, 65, 66, 67]


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(InputReadError, match="is a directory"):
        read_gguf(tmp_path)
    with pytest.raises(InputReadError, match="does not exist"):
        read_gguf(tmp_path / "missing.gguf")
