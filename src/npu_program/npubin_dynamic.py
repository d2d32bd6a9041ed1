"""A `DynamicProgram` on disk: one `.npubin` file of format 3.0 holding every variant.

Layout: the fixed header of `npu_program.npubin` (magic, major 3, minor, header length), a JSON header (the
symbols, their padding, the symbolic input and output shapes, and per variant its sizes and where its bytes
are), the blob, and the SHA-256 of everything before it. Each variant's bytes are a complete format-2 program
file, decoded and checked by `npubin.decode_npubin` like any program; the container then checks that the
variants agree (`dynamic.check_dynamic`: one weight table, one state layout, the declared shapes).

A static program is still written as format 2.x, so a reader of this version loads old and new static files
alike; a format-2 reader refuses a dynamic file by its major version instead of misreading it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_ir.errors import TorchIRError
from torch_ir.fileio import atomic_write
from torch_ir.ops.symbolic import parse_sym

from .codec import SchemaError, from_json, to_json
from .dynamic import DynamicProgram, ShapeError, SymbolPadding, SymbolRange, Variant, check_dynamic
from .npubin import (  # the format's own pieces: one fixed header, alignment, checksum and errors
    _DIGEST_BYTES,
    _FIXED,
    DYNAMIC_MAJOR,
    MAGIC,
    NpubinError,
    _align,
    _check_checksum,
    _encode_header,
    _error,
    _parse_header,
    decode_npubin,
    encode_npubin,
    read_file_bytes,
)
from .program import CompiledProgram
from .template import Template

DYNAMIC_FORMAT_VERSION = (DYNAMIC_MAJOR, 0)


@dataclass
class VariantEntry:
    """One variant in the file: its sizes and its program's bytes in the blob."""

    sizes: dict[str, int]
    offset: int
    nbytes: int


@dataclass
class IOShape:
    """An input or output and its symbolic shape; a list of them keeps the program's order (JSON keys are sorted)."""

    name: str
    shape: list[Any]


@dataclass
class DynamicHeader:
    """The JSON header of a dynamic program file (read strictly by the one codec)."""

    model_name: str
    target: str
    symbols: dict[str, SymbolRange]
    inputs: list[IOShape]
    outputs: list[IOShape]
    padding: dict[str, SymbolPadding]
    variants: list[VariantEntry]
    blob_nbytes: int
    metadata: dict[str, Any] = field(default_factory=dict)
    ir: dict[str, Any] | None = None
    template: Template | None = None


def encode_dynamic(program: DynamicProgram) -> bytes:
    """The complete file for ``program``; deterministic, like a static program's."""
    check_dynamic(program, f"dynamic program {program.model_name!r}")
    blob, entries = bytearray(), []
    for variant in program.variants:
        data = encode_npubin(variant.program)
        blob += bytes(_align(len(blob)) - len(blob))
        entries.append(VariantEntry(dict(variant.sizes), len(blob), len(data)))
        blob += data
    header = DynamicHeader(program.model_name, program.target, program.symbols, _io(program.input_shapes),
                           _io(program.output_shapes), program.padding, entries, len(blob), program.metadata,
                           program.ir, program.template)
    text = _encode_header(to_json(header))
    fixed = _FIXED.pack(MAGIC, *DYNAMIC_FORMAT_VERSION, len(text))
    body = fixed + text + bytes(_align(len(fixed) + len(text)) - len(fixed) - len(text)) + bytes(blob)
    return body + hashlib.sha256(body).digest()


def write_dynamic(program: DynamicProgram, path: str | os.PathLike[str]) -> None:
    """Write ``program`` to ``path`` atomically (the old file or the complete new one, never a mix)."""
    atomic_write(path, encode_dynamic(program), what="program file")


def load_program(path: str | os.PathLike[str]) -> CompiledProgram | DynamicProgram:
    """A `.npubin` file of either kind: a static program (format 1.x/2.x) or a dynamic one (3.x)."""
    path = Path(path)
    data = read_file_bytes(path)
    if len(data) >= _FIXED.size and _FIXED.unpack_from(data)[1] == DYNAMIC_FORMAT_VERSION[0]:
        return decode_dynamic(data, path)
    return decode_npubin(data, path)


def decode_dynamic(data: bytes, path: str | os.PathLike[str] = "<bytes>") -> DynamicProgram:
    """Decode a dynamic program file; every failure is an ``NpubinError`` naming ``path``."""
    try:
        return _decode(data, path)
    except RecursionError:
        raise _error(path, "header is nested too deeply to be a program") from None
    except MemoryError:
        raise _error(path, "out of memory while loading the program", "check the file") from None


def _decode(data: bytes, path: str | os.PathLike[str]) -> DynamicProgram:
    if len(data) < _FIXED.size + _DIGEST_BYTES:
        raise _error(path, f"truncated: {len(data)} bytes")
    magic, major, minor, header_len = _FIXED.unpack_from(data)
    if magic != MAGIC or major != DYNAMIC_FORMAT_VERSION[0]:
        raise _error(path, f"not a dynamic program file (magic {magic!r}, version {major}.{minor})")
    start = _align(_FIXED.size + header_len)
    if len(data) < start + _DIGEST_BYTES:
        raise _error(path, f"truncated: header declares {header_len} bytes, the file has {len(data)}")
    _check_checksum(data, path)
    try:
        header = from_json(DynamicHeader, _parse_header(data[_FIXED.size:_FIXED.size + header_len], path), "header")
    except SchemaError as err:
        raise _error(path, f"header is malformed: {err}") from None
    blob = data[start:len(data) - _DIGEST_BYTES]
    if len(blob) != header.blob_nbytes:
        raise _error(path, f"blob holds {len(blob)} bytes but the header declares {header.blob_nbytes}")
    _check_shapes(header, path)
    variants = [Variant(entry.sizes, _variant(entry, blob, path)) for entry in header.variants]
    program = DynamicProgram(header.model_name, header.target, header.symbols, _named(header.inputs, path),
                             _named(header.outputs, path), header.padding, variants, header.metadata, header.ir,
                             header.template)
    try:
        check_dynamic(program, str(path))
    except ShapeError as err:
        raise NpubinError(str(err)) from None
    return program


def _io(shapes: dict[str, list[Any]]) -> list[IOShape]:
    return [IOShape(name, list(shape)) for name, shape in shapes.items()]


def _named(shapes: list[IOShape], path: str | os.PathLike[str]) -> dict[str, list[Any]]:
    named = {s.name: s.shape for s in shapes}
    if len(named) != len(shapes):
        raise _error(path, f"an input or output is listed twice: {[s.name for s in shapes]}")
    return named


def _variant(entry: VariantEntry, blob: bytes, path: str | os.PathLike[str]) -> CompiledProgram:
    end = entry.offset + entry.nbytes
    if entry.offset < 0 or entry.nbytes < 0 or end > len(blob):
        raise _error(path, f"variant {entry.sizes} lies outside the {len(blob)}-byte blob")
    return decode_npubin(blob[entry.offset:end], f"{path} (variant {entry.sizes})")


def _check_shapes(header: DynamicHeader, path: str | os.PathLike[str]) -> None:
    """Every declared dimension a size or a symbolic expression of the grammar (never given to ``eval``)."""
    for kind, shapes in (("input", header.inputs), ("output", header.outputs)):
        for name, shape in ((s.name, s.shape) for s in shapes):
            for d in shape:
                if isinstance(d, str):
                    try:
                        parse_sym(d, f"{kind} {name!r}")
                    except TorchIRError as err:
                        raise _error(path, str(err)) from None
                elif not isinstance(d, int) or isinstance(d, bool) or d < 0:
                    raise _error(path, f"{kind} {name!r} has the dimension {d!r}: expected a size or a symbol")
    for name, covered in header.symbols.items():
        if not 0 <= covered.min <= covered.max:
            raise _error(path, f"symbol {name!r} covers {covered.min}..{covered.max}, an empty or negative range")


__all__ = ["DYNAMIC_FORMAT_VERSION", "decode_dynamic", "encode_dynamic", "load_program", "write_dynamic"]
