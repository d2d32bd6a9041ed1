"""A GGUF reader for untrusted files: every count, length, type id, dimension and offset is checked against
the file's size and ``torch_ir.limits`` before anything is allocated or read.

The file is mapped, not read: metadata is parsed from the mapping and each tensor is a zero-copy view of it,
so a multi-GB model costs address space, not memory, until its tensors are used. The mapping is read-only
(``numpy.memmap`` mode ``"r"``): a copy-on-write one would be charged in full against the machine's commit
limit, so a model larger than RAM + swap could not even be opened. Views are therefore read-only memory:
``clone()`` one before writing into it (a write into a view is a segmentation fault).

Layout (GGUF v2/v3, little-endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)::

    "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count  x (key string | value_type u32 | value)          string = length u64 | UTF-8 bytes
    tensor_count x (name string | n_dims u32 | ne u64[n_dims] | ggml_type u32 | offset u64)
    padding to general.alignment (default 32) | tensor data (offsets relative to here, each aligned)
"""

from __future__ import annotations

import difflib
import os
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import IRValidationError
from ...fileio import check_regular_file
from ...limits import check_alloc, check_shape
from ...quant.blocks import PLAIN_DTYPES, GGMLType, dequantize, ggml_type

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 63  # GGML_MAX_NAME is 64 bytes with the terminating NUL
MAX_KEY = 65535  # the GGUF spec: keys are at most 65535 bytes
# the least bytes each record can take, to bound a declared count by what is left of the file
_MIN_KV = 8 + 4 + 1  # key length, value type, a one-byte value
_MIN_TENSOR_INFO = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset
_OBJECT_BYTES = 32  # what one parsed metadata array item costs as a Python object, roughly

# GGUF value types: id -> (name, struct format); 8 (string) and 9 (array) are read apart
SCALARS: dict[int, tuple[str, str]] = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"), 4: ("uint32", "<I"),
    5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<B"), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
    12: ("float64", "<d"),
}
STRING, ARRAY = 8, 9
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<f8"}


class GGUFError(IRValidationError):
    """A GGUF file breaks a rule of the format; the message names the file, the field and the rule."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's record: ``ne`` in GGUF order (``ne[0]`` innermost), ``shape`` in torch order."""

    name: str
    ne: tuple[int, ...]
    type: GGMLType
    offset: int  # relative to the data section
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))


@dataclass(frozen=True)
class GGUFTensor:
    """A tensor's data: the raw uint8 blocks (a block type) or its values (a plain type), a read-only view of
    the mapped file (``clone()`` it before writing into it)."""

    name: str
    type: GGMLType
    shape: tuple[int, ...]  # logical, torch order
    data: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """The values as float32, of shape :attr:`shape`."""
        return dequantize(self.data, self.type, self.shape)


@dataclass
class GGUFFile:
    """A parsed GGUF file: ``metadata`` (key -> value; arrays as lists), ``value_types`` (key -> "uint32",
    "array[string]", ...), ``tensors`` (name -> :class:`TensorInfo`, in file order)."""

    path: Path
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, str]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_offset: int
    file_size: int
    _map: np.ndarray | None = field(default=None, repr=False)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def tensor(self, name: str) -> GGUFTensor:
        """The tensor ``name`` as a view of the file (see :class:`GGUFTensor`)."""
        info = self.tensors.get(name)
        if info is None:
            close = difflib.get_close_matches(name, list(self.tensors), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else f" ({len(self.tensors)} tensors)"
            raise GGUFError(f"GGUF file {str(self.path)!r} has no tensor {name!r}{hint}")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r").view(np.ndarray)
        start = self.data_offset + info.offset
        with warnings.catch_warnings():  # read-only on purpose (module docstring); torch warns about it
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            raw = torch.from_numpy(self._map[start:start + info.nbytes])
        dtype = PLAIN_DTYPES.get(info.type.name)
        if dtype is None:
            row_bytes = info.ne[0] // info.type.block * info.type.nbytes  # rows of whole blocks
            return GGUFTensor(name, info.type, info.shape, raw.reshape(*info.shape[:-1], row_bytes))
        if start % info.type.nbytes:  # an alignment below the item size: copy rather than view unaligned
            raw = raw.clone()
        return GGUFTensor(name, info.type, info.shape, raw.view(dtype).reshape(info.shape))

    def dequantize(self, name: str) -> torch.Tensor:
        """The tensor ``name`` as float32 (a new tensor)."""
        return self.tensor(name).dequantize()

    def close(self) -> None:
        """Drop this object's mapping; views already handed out keep theirs."""
        self._map = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Cursor:
    """Reads little-endian fields from the mapped header, refusing any read past the end of the file."""

    def __init__(self, buf: np.ndarray, path: Path) -> None:
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def fail(self, what: str, problem: str) -> GGUFError:
        return GGUFError(f"GGUF file {str(self.path)!r}: {what}: {problem}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(what, f"needs {n} bytes at offset {self.pos}, past the end of the file "
                                  f"({self.size} bytes); the file is truncated or the field is corrupt")

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str, max_len: int | None = None) -> str:
        n = self.u64(f"{what} (its length)")
        if max_len is not None and n > max_len:
            raise self.fail(what, f"length {n} is over the {max_len}-byte limit the GGUF format sets")
        self.need(n, f"{what} ({n} bytes)")
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.fail(what, f"is not valid UTF-8 ({err.reason} at byte {err.start}); GGUF strings are "
                                  f"UTF-8") from None

    def bound_count(self, count: int, min_item: int, what: str) -> None:
        """Refuse a count whose records could not fit in what is left of the file."""
        if count * min_item > self.size - self.pos:
            raise self.fail(what, f"{count} items of at least {min_item} bytes each cannot fit in the "
                                  f"{self.size - self.pos} bytes left of the file")


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse the GGUF file at ``path`` (header, metadata, tensor records), checking every field; tensor data
    is read lazily through :meth:`GGUFFile.tensor`. Raises :class:`GGUFError` (an ``IRValidationError``) or
    ``LimitExceededError`` naming the file, the field and the rule."""
    source = Path(path)
    check_regular_file(source, "GGUF file", "check the path", read_whole=False)
    size = os.path.getsize(source)
    if size < 24:
        raise GGUFError(f"GGUF file {str(source)!r} is {size} bytes, shorter than the 24-byte header (magic, "
                        f"version, tensor count, metadata count); the file is truncated or not GGUF")
    buf = np.memmap(source, dtype=np.uint8, mode="r").view(np.ndarray)
    cur = _Cursor(buf, source)
    version, n_tensors, n_kv = _header(cur)
    metadata, types = _metadata(cur, n_kv)
    alignment = _alignment(cur, metadata, types)
    infos = _tensor_infos(cur, n_tensors)
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = _check_extents(cur, infos, data_offset, alignment)
    return GGUFFile(source, version, metadata, types, tensors, alignment, data_offset, size, buf)


def _header(cur: _Cursor) -> tuple[int, int, int]:
    magic = bytes(cur.buf[:4])
    if magic != MAGIC:
        raise cur.fail("magic", f"the file starts with {magic!r}, not {MAGIC!r}; it is not a GGUF file")
    cur.pos = 4
    version = cur.u32("version")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        why = (f"a big-endian GGUF file (version {swapped}); only little-endian files are supported"
               if swapped in VERSIONS else "versions 2 and 3 are supported (version 1 is obsolete)")
        raise cur.fail("version", f"{version} is not supported: {why}")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    cur.bound_count(n_kv, _MIN_KV, "metadata count")
    return version, n_tensors, n_kv


def _metadata(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, str]]:
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}", MAX_KEY)
        if not key:
            raise cur.fail(f"metadata key #{i}", "is empty; every key names a field")
        if key in metadata:
            raise cur.fail(f"metadata key {key!r}", "appears twice; each key must be unique")
        vtype = cur.u32(f"metadata {key!r} (its value type)")
        metadata[key], types[key] = _value(cur, vtype, f"metadata {key!r}")
    return metadata, types


def _value(cur: _Cursor, vtype: int, what: str) -> tuple[Any, str]:
    if vtype in SCALARS:
        name, fmt = SCALARS[vtype]
        value = cur.scalar(fmt, what)
        return (_bool(cur, value, what) if vtype == 7 else value), name
    if vtype == STRING:
        return cur.string(what), "string"
    if vtype != ARRAY:
        raise cur.fail(what, f"value type {vtype} is not a GGUF type (0-12)")
    item = cur.u32(f"{what} (its item type)")
    count = cur.u64(f"{what} (its length)")
    if item == ARRAY:
        raise cur.fail(what, "is an array of arrays; nested arrays are not supported (no model uses them)")
    if item not in SCALARS and item != STRING:
        raise cur.fail(what, f"array item type {item} is not a GGUF type (0-12)")
    min_item = 8 if item == STRING else struct.calcsize(SCALARS[item][1])
    cur.bound_count(count, min_item, f"{what} (an array of {count} items)")
    check_alloc(count * _OBJECT_BYTES, f"GGUF file {str(cur.path)!r}: {what} (an array of {count} items)")
    type_name = f"array[{'string' if item == STRING else SCALARS[item][0]}]"
    if item == STRING:
        return [cur.string(f"{what}[{j}]") for j in range(count)], type_name
    nbytes = count * min_item
    values = np.frombuffer(cur.buf, dtype=_NUMPY[item], count=count, offset=cur.pos)
    cur.pos += nbytes
    if item == 7:
        return [_bool(cur, int(v), f"{what}[{j}]") for j, v in enumerate(values)], type_name
    return values.tolist(), type_name


def _bool(cur: _Cursor, value: int, what: str) -> bool:
    if value not in (0, 1):
        raise cur.fail(what, f"a bool must be 0 or 1, got {value}")
    return bool(value)


def _alignment(cur: _Cursor, metadata: dict[str, Any], types: dict[str, str]) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    value = metadata["general.alignment"]
    if types["general.alignment"] != "uint32" or value <= 0 or value & (value - 1):
        raise cur.fail("metadata 'general.alignment'", f"must be a uint32 power of two, got "
                                                       f"{types['general.alignment']} {value!r}")
    return value


def _tensor_infos(cur: _Cursor, n_tensors: int) -> list[TensorInfo]:
    cur.bound_count(n_tensors, _MIN_TENSOR_INFO, "tensor count")
    infos: list[TensorInfo] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"tensor #{i} (its name)", MAX_NAME)
        what = f"tensor {name!r}"
        if name in seen:
            raise cur.fail(what, "appears twice; each tensor name must be unique")
        seen.add(name)
        n_dims = cur.u32(f"{what} (its number of dimensions)")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(what, f"has {n_dims} dimensions; GGML tensors have 1 to {MAX_DIMS}")
        ne = tuple(cur.u64(f"{what} (dimension {d})") for d in range(n_dims))
        type_id = cur.u32(f"{what} (its type)")
        try:
            gt = ggml_type(type_id)
        except IRValidationError as err:
            raise cur.fail(what, str(err)) from None
        offset = cur.u64(f"{what} (its offset)")
        check_shape(ne, 1, f"GGUF file {str(cur.path)!r}: {what}")
        if ne[0] % gt.block:
            raise cur.fail(what, f"its innermost dimension ne[0]={ne[0]} is not a multiple of {gt.block}, "
                                 f"the elements in one {gt.name} block")
        numel = 1
        for d in ne:
            numel *= d
        infos.append(TensorInfo(name, ne, gt, offset, numel // gt.block * gt.nbytes))
    return infos


def _check_extents(cur: _Cursor, infos: list[TensorInfo], data_offset: int,
                   alignment: int) -> dict[str, TensorInfo]:
    """Every tensor lies inside the file, at an aligned offset, overlapping no other."""
    for info in infos:
        what = f"tensor {info.name!r}"
        if info.offset % alignment:
            raise cur.fail(what, f"offset {info.offset} is not a multiple of the alignment {alignment}")
        end = data_offset + info.offset + info.nbytes
        if end > cur.size:
            raise cur.fail(what, f"data offset {data_offset} + offset {info.offset} + {info.nbytes} bytes "
                                 f"({info.type.name}, ne={list(info.ne)}) is past the end of the file "
                                 f"({cur.size} bytes); the file is truncated or the offset is corrupt")
    ordered = sorted(infos, key=lambda t: t.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.nbytes > b.offset:
            raise cur.fail(f"tensor {b.name!r}", f"offset {b.offset} overlaps tensor {a.name!r} (offset "
                                                 f"{a.offset}, {a.nbytes} bytes); tensors must not overlap")
    return {info.name: info for info in infos}


__all__ = ["GGUFError", "GGUFFile", "GGUFTensor", "TensorInfo", "read_gguf"]
