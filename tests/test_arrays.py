"""``torch_ir.arrays``: the one reader of user ``.npy``/``.npz`` files, and the commands that use it.

Every file ends in numeric arrays equal to what ``numpy.load`` gives, or in one toolkit error naming the file
(and member), before anything is decompressed; ``run --input`` and ``bisect --input`` print it as one line
and exit 2.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npu_tools.cli import main
from torch_ir.arrays import MAX_HEADER_BYTES, ArrayFileError, load_array, load_arrays
from torch_ir.errors import InputReadError, LimitExceededError, TorchIRError
from torch_ir.limits import limits

MiB = 1 << 20


def npy_bytes(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, {"descr": descr, "fortran_order": False, "shape": shape})
    return stream.getvalue()


def deflated(prefix: bytes, zeros: int) -> bytes:
    """A raw deflate stream of ``prefix`` then ``zeros`` zero bytes (made 1 MiB at a time)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [c.compress(prefix)]
    block = bytes(MiB)
    for _ in range(zeros // MiB):
        parts.append(c.compress(block))
    return b"".join([*parts, c.compress(bytes(zeros % MiB)), c.flush()])


def zip_bytes(members: list[tuple[str, bytes, int, int]]) -> bytes:
    """A zip of ``(name, deflated data, declared size, crc32)``: the declared size need not be the true one."""
    body, central = bytearray(), bytearray()
    for name, data, size, crc in members:
        raw, offset = name.encode(), len(body)
        body += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x21, crc, len(data), size, len(raw), 0)
        body += raw + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0x21, crc, len(data), size,
                               len(raw), 0, 0, 0, 0, 0, offset) + raw
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(body), 0)
    return bytes(body + central + end)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# -- what is read -------------------------------------------------------------------------------------

@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.arange(6, dtype=">i4").reshape(2, 3),  # big-endian: read in native order
    np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
    np.array([True, False]), np.array([1 + 2j], np.complex64), np.float16(1.5), np.zeros((0, 5), np.int8),
    np.arange(3, dtype=np.uint64), np.zeros((1,) * 40, np.int16),
], ids=["f32", "big_endian", "fortran", "bool", "complex", "scalar_f16", "empty", "u64", "40_dims"])
def test_numeric_arrays_read_as_numpy_reads_them(tmp_path: Path, array: np.ndarray) -> None:
    one = load_array(write(tmp_path / "a.npy", npy_bytes(array)))
    np.savez_compressed(tmp_path / "a.npz", b=array, a=array)
    both = load_arrays(tmp_path / "a.npz")
    assert list(both) == ["b", "a"]  # the archive's order, as numpy.savez wrote the keywords
    for got in (one, both["a"], both["b"]):
        np.testing.assert_array_equal(got, array)
        assert got.dtype == array.dtype.newbyteorder("=") and got.dtype.isnative and got.flags.writeable


def test_stored_members_and_savez_positional_names(tmp_path: Path) -> None:
    np.savez(tmp_path / "p.npz", np.ones(2), np.zeros(3))
    assert {k: v.shape for k, v in load_arrays(tmp_path / "p.npz").items()} == {"arr_0": (2,), "arr_1": (3,)}


# -- what is refused, by dtype ----------------------------------------------------------------------

REFUSED = {
    "string": (np.array(["a", "bc"]), r"holds strings, dtype str64 \(<U2\)"),
    "bytes": (np.array([b"ab"]), r"holds byte strings"),
    "void": (np.zeros(2, "V4"), r"holds raw bytes \(void\)"),
    "structured": (np.zeros(2, [("x", "<f4"), ("y", "<i2")]), r"holds records \(a structured dtype with fields x, y"),
    "datetime": (np.array(["2024-05-01"], "datetime64[D]"), r"holds datetimes, dtype datetime64\[D\]"),
    "timedelta": (np.array([3], "timedelta64[ms]"), r"holds timedeltas"),
    "object": (np.array([{"a": 1}], dtype=object), r"holds Python objects"),
    "subarray": (np.zeros(2, np.dtype((np.float32, (3,)))), None),  # numpy saves it as a (2, 3) float32: fine
    "longdouble": (np.zeros(2, np.longdouble), r"holds values of a dtype no tensor has, dtype float128"),
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_only_numeric_dtypes(tmp_path: Path, kind: str) -> None:
    array, message = REFUSED[kind]
    stream = io.BytesIO()
    np.save(stream, array, allow_pickle=True)
    npy = write(tmp_path / "x.npy", stream.getvalue())
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as z:
        z.writestr("input_0.npy", stream.getvalue())
    if message is None:
        assert load_array(npy).shape == array.shape + array.dtype.shape
        return
    with pytest.raises(ArrayFileError, match=message) as info:
        load_array(npy, "input file for 'x'")
    assert f"input file for 'x' {str(npy)!r}" in str(info.value) and "only numeric arrays" in str(info.value)
    with pytest.raises(ArrayFileError, match=rf"x\.npz', array 'input_0' {message}"):
        load_arrays(tmp_path / "x.npz", "bisect inputs file")


def test_a_subarray_header_is_refused(tmp_path: Path) -> None:
    """numpy never writes one (it folds the sub-array into the shape), but a file can declare it."""
    header = "{'descr': ('<f4', (3,)), 'fortran_order': False, 'shape': (2,), }".ljust(117) + "\n"
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + bytes(24)
    with pytest.raises(ArrayFileError, match=r"holds sub-arrays \(dtype <f4 of shape \[3\]"):
        load_array(write(tmp_path / "s.npy", data))


# -- what is refused, by form -------------------------------------------------------------------------

def test_wrong_container(tmp_path: Path) -> None:
    npy = write(tmp_path / "x.npy", npy_bytes(np.ones(3)))
    np.savez(tmp_path / "x.npz", x=np.ones(3))
    with pytest.raises(ArrayFileError, match=r"is a single \.npy array, not an \.npz archive; write the arrays with "
                                             r"numpy\.savez"):
        load_arrays(npy)
    with pytest.raises(ArrayFileError, match=r"is an \.npz archive, not a single \.npy array"):
        load_array(tmp_path / "x.npz")
    with pytest.raises(ArrayFileError, match=r"is not an \.npz archive \(it does not start like a zip file\)"):
        load_arrays(write(tmp_path / "t.npz", b"hello"))
    with pytest.raises(ArrayFileError, match=r"is not a \.npy array \(no NUMPY magic"):
        load_array(write(tmp_path / "t.npy", b"hello"))


def test_damaged_archives(tmp_path: Path) -> None:
    np.savez_compressed(tmp_path / "ok.npz", x=np.arange(1000.0))
    data = (tmp_path / "ok.npz").read_bytes()
    for cut in (len(data) // 2, len(data) - 10):
        with pytest.raises(ArrayFileError, match=r"not a readable \.npz archive \(BadZipFile.*truncated"):
            load_arrays(write(tmp_path / "cut.npz", data[:cut]))
    damaged = bytearray(data)
    damaged[60:70] = bytes(10)  # inside the deflated data
    with pytest.raises(ArrayFileError, match=r"array 'x' (cannot be decompressed|has a damaged \.npy header)"):
        load_arrays(write(tmp_path / "bad.npz", bytes(damaged)))


@pytest.mark.filterwarnings("ignore:Duplicate name")  # the duplicate is the point
def test_members_that_are_not_arrays(tmp_path: Path) -> None:
    def archive(name: str, build) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            build(z)
        return path

    cases = {
        "text": (lambda z: z.writestr("notes.txt", "hi"), r"member 'notes\.txt' is not a \.npy array"),
        "directory": (lambda z: z.mkdir("sub"), r"member 'sub/' is not a \.npy array"),
        "duplicate": (lambda z: [z.writestr("a.npy", npy_bytes(np.ones(1))) for _ in range(2)],
                      r"member 'a\.npy' appears twice"),
        "bzip2": (lambda z: z.writestr("a.npy", npy_bytes(np.ones(1)), zipfile.ZIP_BZIP2),
                  r"uses zip compression method 12"),
        "not_npy_inside": (lambda z: z.writestr("a.npy", "plain text"), r"array 'a' is not a \.npy array"),
    }
    for name, (build, message) in cases.items():
        with pytest.raises(ArrayFileError, match=message):
            load_arrays(archive(f"{name}.npz", build))


def test_npy_length_must_match_its_header(tmp_path: Path) -> None:
    data = npy_bytes(np.arange(10, dtype=np.int32))
    with pytest.raises(ArrayFileError, match=r"declares int32 data of shape \[10\] \(40 bytes\) but the file holds "
                                             r"36 bytes of data \(the file is truncated\)"):
        load_array(write(tmp_path / "short.npy", data[:-4]))
    with pytest.raises(ArrayFileError, match=r"holds 41 bytes of data \(extra bytes after the array\)"):
        load_array(write(tmp_path / "long.npy", data + b"!"))
    with pytest.raises(ArrayFileError, match=r"truncated inside its \.npy header"):
        load_array(write(tmp_path / "header.npy", data[:20]))


def test_damaged_headers(tmp_path: Path) -> None:
    def npy(header: str, version: bytes = b"\x01\x00") -> Path:
        text = header.encode()
        return write(tmp_path / "h.npy", b"\x93NUMPY" + version + struct.pack("<H", len(text)) + text)

    with pytest.raises(ArrayFileError, match=r"has a damaged \.npy header \(ValueError"):
        load_array(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'evil': __import__('os')}\n"))
    with pytest.raises(ArrayFileError, match=r"has a damaged \.npy header"):
        load_array(npy("{'descr': 'not a dtype', 'fortran_order': False, 'shape': (2,), }\n"))
    with pytest.raises(ArrayFileError, match=r"format version 3\.0 is not read"):
        load_array(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", b"\x03\x00"))
    with pytest.raises(ArrayFileError, match=r"its shape has 65 dimensions, over numpy's 64"):
        load_array(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "1," * 65 + "), }\n"))
    with pytest.raises(LimitExceededError, match=r"dimension -3 of shape \[2, -3\] is not a non-negative integer"):
        load_array(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }\n"))


# -- sizes: checked before anything is decompressed -------------------------------------------------

def _status_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


@contextlib.contextmanager
def peak_growth_mib() -> Iterator[list[int]]:
    """MiB by which the peak RSS rose inside the block (VmHWM reset through clear_refs first)."""
    result = [0]
    Path("/proc/self/clear_refs").write_text("5")
    start = _status_kib("VmRSS")
    yield result
    result[0] = (_status_kib("VmHWM") - start) >> 10


def test_a_bomb_is_refused_on_its_declared_size(tmp_path: Path) -> None:
    """512 MiB of zeros in a 0.5 MB archive, under a 64 MiB limit: refused on the zip directory's sizes."""
    header = npy_header("<f4", (128 * MiB,))
    data = deflated(header, 512 * MiB)
    path = write(tmp_path / "bomb.npz", zip_bytes([("input_0.npy", data, len(header) + 512 * MiB, 0)]))
    assert path.stat().st_size < 1 * MiB
    with peak_growth_mib() as growth, limits(max_alloc_bytes=64 * MiB), pytest.raises(LimitExceededError) as info:
        load_arrays(path, "bisect inputs file")
    assert "member 'input_0.npy' (its declared uncompressed size) needs 512.0 MiB" in str(info.value)
    assert "TORCH_IR_MAX_ALLOC_BYTES" in str(info.value) and str(path) in str(info.value)
    assert growth[0] < 32
    # several members, each under the limit, all together over it
    small = npy_header("<f4", (8 * MiB,))
    member = deflated(small, 32 * MiB)
    many = zip_bytes([(f"m{i}.npy", member, len(small) + 32 * MiB, 0) for i in range(3)])
    with limits(max_alloc_bytes=64 * MiB), pytest.raises(LimitExceededError, match=r"all its arrays together"):
        load_arrays(write(tmp_path / "many.npz", many))


def test_sizes_that_lie_are_read_with_a_bound(tmp_path: Path) -> None:
    """The zip directory declares 72 bytes; the data decompresses to 256 MiB. The header is what the directory
    declares (8 float32): read, and no more than that is ever decompressed. A header that declares more than
    the directory does is refused."""
    header = npy_header("<f4", (8,))
    data = deflated(header, 256 * MiB)
    declared = header + bytes(32)
    path = write(tmp_path / "lie.npz", zip_bytes([("a.npy", data, len(declared), zlib.crc32(declared))]))
    with peak_growth_mib() as growth:
        got = load_arrays(path)
    assert growth[0] < 32
    np.testing.assert_array_equal(got["a"], np.zeros(8, np.float32))
    # the same stream with the CRC of all of it: zipfile notices the short read; one clear error
    with pytest.raises(ArrayFileError, match=r"cannot be decompressed \(BadZipFile: Bad CRC-32"):
        load_arrays(write(tmp_path / "crc.npz", zip_bytes([("a.npy", data, len(declared), 0)])))
    big = npy_header("<f4", (64 * MiB,))
    lying = big + bytes(32)
    with pytest.raises(ArrayFileError, match=r"header declares float32 data of shape \[67108864\] \(268435456 bytes"
                                             r" of data\) but the archive declares 32 bytes"):
        load_arrays(write(tmp_path / "hdr.npz", zip_bytes([("a.npy", deflated(big, 256 * MiB), len(lying),
                                                             zlib.crc32(lying))])))
    # a member shorter than its header declares
    short = npy_header("<f4", (16,)) + bytes(8)
    with pytest.raises(ArrayFileError, match=r"archive declares 8 bytes"):
        load_arrays(write(tmp_path / "short.npz", zip_bytes([("a.npy", deflated(short, 0), len(short),
                                                               zlib.crc32(short))])))


def test_a_header_length_of_gigabytes_is_refused_unread(tmp_path: Path) -> None:
    prefix = b"\x93NUMPY\x02\x00" + struct.pack("<I", 3 << 30)
    data = deflated(prefix, 64 * MiB)
    path = write(tmp_path / "h.npz", zip_bytes([("a.npy", data, len(prefix) + 64 * MiB, 0)]))
    with peak_growth_mib() as growth, pytest.raises(ArrayFileError, match=rf"header declares {3 << 30} bytes, over "
                                                                          rf"the {MAX_HEADER_BYTES}"):
        load_arrays(path)
    assert growth[0] < 32


def test_a_shape_over_the_limits_is_refused_before_reading(tmp_path: Path) -> None:
    data = npy_header("<f8", (1 << 40, 1 << 20))
    with pytest.raises(LimitExceededError, match=r"over the .* limit on one allocation"):
        load_array(write(tmp_path / "big.npy", data))


def test_files_that_are_not_files(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)
    with pytest.raises(InputReadError, match=r"named pipe"):
        load_arrays(fifo)
    with pytest.raises(InputReadError, match=r"is a directory"):
        load_array(tmp_path)
    with pytest.raises(InputReadError, match=r"does not exist"):
        load_array(tmp_path / "missing.npy")


def test_every_refusal_is_a_toolkit_error() -> None:
    assert issubclass(ArrayFileError, TorchIRError) and issubclass(ArrayFileError, InputReadError)


# -- the commands -------------------------------------------------------------------------------------

def _one_error_line(capsys: pytest.CaptureFixture[str], command: str, *fragments: str) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"torch-ir {command}: error:"), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def tiny_program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import torch

    import npu_compiler
    import torch_ir
    from torch_ir.weights import module_state

    torch.manual_seed(0)
    with torch.device("meta"):
        meta = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU())
    directory = tmp_path_factory.mktemp("arrays_cli")
    ir = torch_ir.extract_ir(meta, (torch.randn(2, 4, device="meta"),), model_name="tiny")
    ir.save(directory / "tiny.json")
    npu_compiler.compile(ir).save(directory / "tiny.npubin")
    torch_ir.save_weights(module_state(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU())),
                          directory / "tiny.safetensors")
    return directory / "tiny.npubin", directory / "tiny.safetensors"


def test_run_input_refuses_non_numeric_arrays(tiny_program: tuple[Path, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    program, weights = tiny_program
    from npu_program.program import CompiledProgram

    name = CompiledProgram.load(program).input_specs[0].name
    good = write(tmp_path / "x.npy", npy_bytes(np.ones((2, 4), np.float32)))
    assert main(["run", str(program), "--weights", str(weights), "--input", f"{name}={good}"]) == 0
    capsys.readouterr()
    for array, fragment in ((np.full((2, 4), "s"), "holds strings"),
                            (np.zeros((2, 4), [("a", "<f2"), ("b", "<f2")]), "holds records")):
        bad = write(tmp_path / "bad.npy", npy_bytes(array))
        assert main(["run", str(program), "--weights", str(weights), "--input", f"{name}={bad}"]) == 2
        _one_error_line(capsys, "run", f"--input {name} {str(bad)!r}", fragment)
    np.savez(tmp_path / "x.npz", x=np.ones((2, 4), np.float32))
    assert main(["profile", str(program), "--weights", str(weights), "--runs", "1",
                 "--input", f"{name}={tmp_path / 'x.npz'}"]) == 2
    _one_error_line(capsys, "profile", "is an .npz archive, not a single .npy array")


def test_bisect_inputs_refuses_what_is_not_an_npz_of_numbers(tiny_program: tuple[Path, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    ir = tiny_program[0].with_suffix(".json")
    weights = tiny_program[1]
    base = ["bisect", str(ir), "--weights", str(weights), "--stage", "extracted", "--input"]
    np.savez(tmp_path / "ok.npz", input_0=np.ones((2, 4), np.float32))
    assert main([*base, str(tmp_path / "ok.npz")]) == 0
    capsys.readouterr()
    np.savez(tmp_path / "s.npz", input_0=np.full((2, 4), "s"))
    np.savez(tmp_path / "d.npz", input_0=np.zeros((2, 4), "datetime64[s]"))
    np.save(tmp_path / "plain.npy", np.ones((2, 4), np.float32))
    ok = (tmp_path / "ok.npz").read_bytes()
    truncated = write(tmp_path / "cut.npz", ok[: len(ok) // 2])
    for path, fragment in ((tmp_path / "s.npz", "holds strings"), (tmp_path / "d.npz", "holds datetimes"),
                           (tmp_path / "plain.npy", "is a single .npy array, not an .npz archive"),
                           (truncated, "not a readable .npz archive")):
        assert main([*base, str(path)]) == 2
        _one_error_line(capsys, "bisect", f"bisect inputs file {str(path)!r}", fragment)
