"""The one reader of ``.npy`` and ``.npz`` files given by a user: numeric arrays only, sized before they are read.

An array file is untrusted data like an IR: ``numpy.load`` would decompress a 2 MB ``.npz`` into gigabytes
before anything looks at the shape, hand back strings, structured records or datetimes that nothing here can
compute with, and fail with a bare ``zipfile``/``ValueError`` on a truncated file. This module reads them so
that every file ends in arrays or in one :class:`ArrayFileError` (or a ``LimitExceededError``) naming the
file, the member, the rule broken and the fix:

- the file is read through :func:`torch_ir.fileio.read_input` (a regular file, of bounded size);
- ``.npz``: the zip's central directory is read first; every member must be a ``<name>.npy`` array, stored or
  deflated (what ``numpy.savez``/``savez_compressed`` write), not encrypted, and the uncompressed sizes it
  declares (each, and all together) are checked against ``torch_ir.limits`` before anything is decompressed;
- each array's ``.npy`` header is parsed before its data: the header itself is bounded, the dtype must be
  numeric (bool, integers, floats, complex: no strings, bytes, void, structured records, objects, datetimes),
  the shape within the limits, and header plus data exactly the size the member declares;
- the data is then read with that bound, so a member that decompresses to more (or less) than it declares is
  refused without ever holding more than the array's own bytes.

    arrays = load_arrays("inputs.npz", "bisect inputs file")    # {"input_0": array, ...}, in the file's order
    x = load_array("x.npy", "input file for 'x'")
"""

from __future__ import annotations

import io
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from .errors import InputReadError, TorchIRError
from .fileio import read_input
from .limits import check_alloc, check_shape

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; the end record of an empty archive
#: numpy refuses headers over 10,000 characters (``max_header_size``); a little more for the padding.
MAX_HEADER_BYTES = 10_240
MAX_DIMS = 64  # numpy's own limit on an array's dimensions
#: dtype kinds accepted: bool, signed and unsigned integers, floats, complex.
NUMERIC_KINDS = "biufc"
_CHUNK = 16 << 20  # decompressed data is copied into the array this much at a time
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, ValueError, struct.error,
               NotImplementedError, RuntimeError, OverflowError)
_SAVEZ_FIX = "write it with numpy.savez (or savez_compressed) and numeric arrays"
_SAVE_FIX = "write it with numpy.save and a numeric array"


class ArrayFileError(InputReadError):
    """An ``.npy``/``.npz`` file is not one the toolkit reads: not numpy's format, truncated, inconsistent, or
    holding an array that is not numeric. The message names the file (and member), the rule and the fix."""


@dataclass(frozen=True)
class _Header:
    """What a ``.npy`` header declares, and how many bytes the header took."""

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype
    size: int  # bytes of magic, version, length and header text

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def load_array(path: str | os.PathLike, what: str = "array file") -> np.ndarray:
    """The numeric array of a ``.npy`` file (``numpy.save``); :class:`ArrayFileError` for anything else.

    ``what`` names the file in messages ("input file for 'x'"). The file is read whole (bounded by
    ``torch_ir.limits``); the array owns a copy of its bytes (writable, as ``numpy.load`` gives)."""
    where = f"{what} {str(path)!r}"
    data = read_input(path, what, f"give a .npy file: {_SAVE_FIX}")
    if data.startswith(ZIP_MAGICS):
        raise ArrayFileError(f"{where} is an .npz archive, not a single .npy array; give one array written by "
                             "numpy.save (or pass the archive where an .npz is expected)")
    stream = io.BytesIO(data)
    header = _read_header(stream, where, _SAVE_FIX)
    body = len(data) - header.size
    if body != header.nbytes:
        why = "the file is truncated" if body < header.nbytes else "extra bytes after the array"
        raise ArrayFileError(f"{where}: its header declares {_describe(header)} ({header.nbytes} bytes) but the "
                             f"file holds {body} bytes of data ({why}); {_SAVE_FIX}")
    buffer = bytearray(memoryview(data)[header.size:])
    return _as_array(buffer, header)


def load_arrays(path: str | os.PathLike, what: str = "arrays file") -> dict[str, np.ndarray]:
    """The numeric arrays of an ``.npz`` file (``numpy.savez``), by name (the member name without ``.npy``), in
    the order the archive stores them; :class:`ArrayFileError` for anything else (a plain ``.npy``, a truncated
    or non-zip file, a member that is not an array, a non-numeric array), ``LimitExceededError`` for arrays over
    ``torch_ir.limits`` — both before anything is decompressed."""
    where = f"{what} {str(path)!r}"
    data = read_input(path, what, f"give an .npz file: {_SAVEZ_FIX}")
    if data.startswith(NPY_MAGIC):
        raise ArrayFileError(f"{where} is a single .npy array, not an .npz archive; write the arrays with "
                             "numpy.savez('file.npz', a, b, ...) (one array per input)")
    if not data.startswith(ZIP_MAGICS):
        raise ArrayFileError(f"{where} is not an .npz archive (it does not start like a zip file); {_SAVEZ_FIX}")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except _ZIP_ERRORS as e:
        raise ArrayFileError(f"{where} is not a readable .npz archive ({_reason(e)}): it may be truncated; "
                             f"{_SAVEZ_FIX}") from None
    with archive:
        members = _check_members(archive.infolist(), where)
        return {name: _read_member(archive, info, f"{where}, array {name!r}") for name, info in members.items()}


# -- the zip ------------------------------------------------------------------------------------------

def read_cli_inputs(items: Sequence[str], names: Sequence[str]) -> dict[str, np.ndarray]:
    """The arrays of the command line's ``--input`` options, by graph input name.

    Each item is ``NAME=FILE.npy`` or ``FILE.npz`` (one array per graph input: by name; named ``input_<i>``
    or ``arr_<i>`` (``numpy.savez`` without names), by position; else in the order the archive stores
    them). ``names`` are the graph inputs; an array for no input is an error naming the flag."""
    arrays: dict[str, np.ndarray] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if sep:
            arrays[name] = load_array(path, f"--input {name}")
        elif item.endswith(".npz"):
            arrays.update(_by_input(load_arrays(item, f"--input {item}"), names, item))
        else:
            raise ArrayFileError(f"--input {item!r}: write NAME=FILE.npy, or give an .npz holding every input")
    unknown = sorted(set(arrays) - set(names))
    if unknown:
        raise ArrayFileError(f"--input names {unknown}, which are not inputs of the model; its inputs are "
                             f"{', '.join(names)}")
    return arrays


def _by_input(archive: dict[str, np.ndarray], names: Sequence[str], where: str) -> dict[str, np.ndarray]:
    keys = list(archive)
    if set(keys) <= set(names):
        return archive
    for prefix in ("input_", "arr_"):
        if sorted(keys) == sorted(f"{prefix}{i}" for i in range(len(keys))) and len(keys) <= len(names):
            return {names[i]: archive[f"{prefix}{i}"] for i in range(len(keys))}
    if len(keys) == len(names):
        return dict(zip(names, archive.values()))
    raise ArrayFileError(f"--input {where!r} holds {len(keys)} arrays ({', '.join(keys)}) for {len(names)} inputs "
                         f"({', '.join(names)}): name them after the inputs (numpy.savez(file, {names[0]}=...))")


def _check_members(infos: list[zipfile.ZipInfo], where: str) -> dict[str, zipfile.ZipInfo]:
    """The members by array name, every rule checked on the central directory alone (nothing decompressed)."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        member = f"{where}: member {info.filename!r}"
        if info.is_dir() or not info.filename.endswith(".npy"):
            raise ArrayFileError(f"{member} is not a .npy array; an .npz holds only arrays ({_SAVEZ_FIX})")
        if info.flag_bits & 0x1:
            raise ArrayFileError(f"{member} is encrypted; {_SAVEZ_FIX}")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ArrayFileError(f"{member} uses zip compression method {info.compress_type}; numpy.savez writes "
                                 f"only stored or deflated members; {_SAVEZ_FIX}")
        name = info.filename.removesuffix(".npy")
        if name in members:
            raise ArrayFileError(f"{member} appears twice: which one is meant is ambiguous; {_SAVEZ_FIX}")
        check_alloc(info.file_size, f"{member} (its declared uncompressed size)")
        members[name] = info
    check_alloc(sum(i.file_size for i in members.values()), f"{where} (all its arrays together)")
    return members


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> np.ndarray:
    try:
        with archive.open(info) as stream:
            header = _read_header(stream, where, _SAVEZ_FIX)
            if header.size + header.nbytes != info.file_size:
                raise ArrayFileError(f"{where}: its header declares {_describe(header)} ({header.nbytes} bytes of "
                                     f"data) but the archive declares {info.file_size - header.size} bytes for "
                                     f"it; the archive is inconsistent or truncated; {_SAVEZ_FIX}")
            buffer = _read_exactly(stream, header.nbytes, where)
    except TorchIRError:  # ours (an ArrayFileError is also an OSError): already says what is wrong
        raise
    except _ZIP_ERRORS as e:
        raise ArrayFileError(f"{where} cannot be decompressed ({_reason(e)}): the archive is damaged or truncated; "
                             f"{_SAVEZ_FIX}") from None
    return _as_array(buffer, header)


def _read_exactly(stream: BinaryIO, nbytes: int, where: str) -> bytearray:
    """``nbytes`` of ``stream``, never more: what is read beyond them is one byte, to tell that it is there."""
    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    done = 0
    while done < nbytes:
        chunk = stream.read(min(_CHUNK, nbytes - done))
        if not chunk:
            raise ArrayFileError(f"{where} ends after {done} of its {nbytes} bytes of data: the archive is "
                                 f"truncated; {_SAVEZ_FIX}")
        view[done:done + len(chunk)] = chunk
        done += len(chunk)
    if stream.read(1):
        raise ArrayFileError(f"{where} decompresses to more than its header declares ({nbytes} bytes of data): "
                             f"the archive is damaged or hostile; {_SAVEZ_FIX}")
    return buffer


# -- the .npy header ----------------------------------------------------------------------------------

def _read_header(stream: BinaryIO, where: str, fix: str) -> _Header:
    """The header of the ``.npy`` data at the start of ``stream``, read with a bound and checked: a numeric
    dtype, a shape within the limits. The length prefix is read here, not by numpy, so that a version-2 header
    declaring gigabytes is refused before they are read."""
    prefix = stream.read(len(NPY_MAGIC) + 2)
    if len(prefix) < len(NPY_MAGIC) + 2 or not prefix.startswith(NPY_MAGIC):
        raise ArrayFileError(f"{where} is not a .npy array (no NUMPY magic at its start); {fix}")
    version = (prefix[-2], prefix[-1])
    if version not in ((1, 0), (2, 0)):
        # 3.0 is what numpy.save writes only for structured dtypes with non-Latin-1 field names: never numeric
        raise ArrayFileError(f"{where}: .npy format version {version[0]}.{version[1]} is not read (versions 1.0 "
                             f"and 2.0 hold every numeric array); {fix}")
    length_format = "<H" if version == (1, 0) else "<I"
    length_bytes = stream.read(struct.calcsize(length_format))
    if len(length_bytes) < struct.calcsize(length_format):
        raise ArrayFileError(f"{where} is truncated inside its .npy header; {fix}")
    (length,) = struct.unpack(length_format, length_bytes)
    if length > MAX_HEADER_BYTES:
        raise ArrayFileError(f"{where}: its .npy header declares {length} bytes, over the {MAX_HEADER_BYTES} a "
                             f"header can need; the file is damaged or hostile; {fix}")
    text = stream.read(length)
    if len(text) < length:
        raise ArrayFileError(f"{where} is truncated inside its .npy header; {fix}")
    shape, fortran_order, dtype = _parse_header(prefix + length_bytes + text, version, where, fix)
    header = _Header(shape, fortran_order, dtype, len(prefix) + len(length_bytes) + length)
    _check_dtype(dtype, where)
    if len(shape) > MAX_DIMS:
        raise ArrayFileError(f"{where}: its shape has {len(shape)} dimensions, over numpy's {MAX_DIMS}; {fix}")
    check_shape(shape, dtype.itemsize, where)
    return header


def _parse_header(raw: bytes, version: tuple[int, int], where: str, fix: str) -> tuple[tuple[int, ...], bool,
                                                                                       np.dtype]:
    """numpy's own parser (a literal, never evaluated code) on the bounded header bytes."""
    stream = io.BytesIO(raw[len(NPY_MAGIC) + 2:])
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    try:
        shape, fortran_order, dtype = read(stream, max_header_size=MAX_HEADER_BYTES)
    except (ValueError, TypeError, SyntaxError, OverflowError, MemoryError, RecursionError) as e:
        raise ArrayFileError(f"{where} has a damaged .npy header ({_reason(e)}); {fix}") from None
    return tuple(shape), bool(fortran_order), dtype


def _check_dtype(dtype: np.dtype, where: str) -> None:
    """Only numbers: what a tensor can hold. Strings, bytes, void, records, objects and datetimes are refused
    by the dtype's name, as are long doubles (no tensor dtype holds them)."""
    numeric = (dtype.kind in NUMERIC_KINDS and dtype.fields is None and dtype.subdtype is None
               and dtype.type not in (np.longdouble, np.clongdouble))
    if not numeric:
        raise ArrayFileError(f"{where} holds {_dtype_text(dtype)}; only numeric arrays (bool, integers, floats, "
                             "complex) are read: convert the values to numbers before saving them")


_KINDS = {"U": "strings", "S": "byte strings", "V": "raw bytes (void)", "O": "Python objects", "M": "datetimes",
          "m": "timedeltas"}


def _dtype_text(dtype: np.dtype) -> str:
    """What the array holds, in words, with numpy's name of the dtype."""
    if dtype.fields is not None:
        return f"records (a structured dtype with fields {', '.join(dtype.names or ())}: {dtype.str})"
    if dtype.subdtype is not None:
        return f"sub-arrays (dtype {dtype.subdtype[0].str} of shape {list(dtype.shape)} per item)"
    words = _KINDS.get(dtype.kind, "values of a dtype no tensor has")
    return f"{words}, dtype {dtype.name} ({dtype.str})"


def _describe(header: _Header) -> str:
    return f"{header.dtype.name} data of shape {list(header.shape)}"


def _as_array(buffer: bytearray, header: _Header) -> np.ndarray:
    """The array over ``buffer`` (no copy), in native byte order, in the memory order the file declares."""
    flat = np.frombuffer(buffer, dtype=header.dtype, count=math.prod(header.shape))
    if not header.dtype.isnative:
        flat = flat.byteswap(inplace=True).view(header.dtype.newbyteorder("="))
    if header.fortran_order:
        return flat.reshape(header.shape[::-1]).transpose()
    return flat.reshape(header.shape)


def _reason(e: BaseException, limit: int = 200) -> str:
    """The library's error in a few words: its first line, cut (numpy quotes the whole header)."""
    lines = str(e).splitlines()
    text = lines[0][:limit] + ("..." if len(lines[0]) > limit else "") if lines else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


__all__ = ["ArrayFileError", "MAX_HEADER_BYTES", "NUMERIC_KINDS", "load_array", "load_arrays", "read_cli_inputs"]
