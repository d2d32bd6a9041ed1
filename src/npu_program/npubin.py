"""The `.npubin` file format: a `CompiledProgram` on disk.

Layout (all integers little-endian; docs/npubin.md has the full description):

    offset  size  field
    0       8     magic b"NPUBIN\\0\\0"
    8       2     format major version (uint16)
    10      2     format minor version (uint16)
    12      8     header length H in bytes (uint64)
    20      H     header: UTF-8 JSON, sorted keys, everything except constant bytes (the program's
                  fields as `npu_program.codec.to_json` writes them, plus `constants`, `blob_nbytes`)
    ...           zero padding up to a multiple of 64
    B       N     blob: constant data, each entry 64-byte aligned, located by (offset, nbytes) in the header
    end-32  32    SHA-256 of every preceding byte

No pickle: a program file may come from anywhere and must never be able to run code when loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_ir.errors import InputNotFoundError, TorchIRError
from torch_ir.fileio import atomic_write, read_input
from torch_ir.ir.validate import MAX_JSON_DEPTH, nested_deeper_than

from .codec import SchemaError, from_json, to_json
from .kernels import KERNELS, kernels_for
from .params import Param, ParamError, params_from_attrs, params_from_file, params_to_file
from .program import CompiledProgram, Dispatch, TensorSpec

MAGIC = b"NPUBIN\0\0"
# 1.1 added `state_specs` (optional, so a 1.0 file reads as a program without state slots).
# 1.2 added `Dispatch.host` (host dispatches of compile(fallback="cpu")). It is written only when set: a program
# without host dispatches reads in a 1.1 reader, which refuses one with them (an unknown dispatch field).
# 1.3 added `Dispatch.provenance` (source nodes, module path, frontend origin, rewrite rules), written only when set.
# 2.0: a kernel dispatch's `params` are plain values its kernel record declares (`npu_program.params`: "float16",
# not the IR's {"dtype": "float16"}; every declared default written out; a non-finite float as "inf", "-inf" or
# "nan"). The meaning of a field changed, so the major goes up: a 1.x reader refuses a 2.0 file instead of
# handing plain params to code that expects the IR's tags. This reader upgrades a 1.x file's params on read
# (`_upgrade_params`); host dispatches keep their IR attributes in both.
# 2.1 added `TensorSpec.quant` (a quantized tensor's spec, `torch_ir.quant.QuantSpec`, checked on load by its own
# rules), written only when set: a 2.0 reader reads a 2.1 program without quantized tensors, and refuses one with them
# (an unknown field of a tensor spec) rather than running codes as if they were plain integers.
FORMAT_VERSION = (2, 1)
# Majors this reader understands; a new major means the layout changed in a way old readers must refuse.
SUPPORTED_MAJORS = (1, 2)
# The major of a file holding a dynamic program (`npu_program.npubin_dynamic`): several static variants.
DYNAMIC_MAJOR = 3
ALIGNMENT = 64

_FIXED = struct.Struct("<8sHHQ")  # magic, major, minor, header length
_DIGEST_BYTES = hashlib.sha256().digest_size
_RECOMPILE = "recompile the model to produce a fresh .npubin file"


@dataclass
class ConstantRange:
    """Where one constant's bytes are in the blob."""

    offset: int
    nbytes: int


@dataclass
class BlobIndex:
    """The header's fields beside the program's: where the constants' bytes are. Read by the same codec as the
    program, so what is required is what the dataclasses say (a field without a default), checked strictly."""

    constants: dict[str, ConstantRange]
    blob_nbytes: int


_BLOB_FIELDS = tuple(f.name for f in dataclasses.fields(BlobIndex))


class NpubinError(TorchIRError, ValueError):
    """A file that is not a usable `.npubin`; the message names the file, the broken rule and the fix."""


def _error(path: Path | str, problem: str, fix: str = _RECOMPILE) -> NpubinError:
    return NpubinError(f"{path}: {problem}; {fix}")


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


# ---------------------------------------------------------------------------------------------- writing


def write_npubin(program: CompiledProgram, path: str | os.PathLike[str]) -> None:
    """Write `program` to `path` atomically: readers see the old file or the complete new one, never a mix.

    The bytes are encoded before any file is touched, so an unserializable program leaves the disk untouched.
    The write is ``torch_ir.fileio.atomic_write`` (random temp name beside `path`, fsync, rename); an
    unwritable path raises ``OutputWriteError`` naming `path`.
    """
    atomic_write(path, encode_npubin(program), what="program file")


def encode_npubin(program: CompiledProgram) -> bytes:
    """The complete file contents for `program`; deterministic so that identical programs give identical files."""
    _check_constants_before_write(program)
    blob, ranges = _pack_constants(program.constants)
    header = _encode_header(_header_dict(program, ranges, len(blob)))
    fixed = _FIXED.pack(MAGIC, *FORMAT_VERSION, len(header))
    padding = bytes(_align(len(fixed) + len(header)) - len(fixed) - len(header))
    body = fixed + header + padding + blob
    return body + hashlib.sha256(body).digest()


def _check_constants_before_write(program: CompiledProgram) -> None:
    """Catch a constant without a spec or of the wrong size here, where the compiler bug is, not at run time."""
    for name, data in program.constants.items():
        spec = program.tensors.get(name)
        if spec is None:
            raise ValueError(f"constant {name!r} has no spec in program.tensors; add its TensorSpec")
        if len(data) != spec.nbytes:
            raise ValueError(f"constant {name!r} holds {len(data)} bytes but its spec {spec.shape} {spec.dtype} "
                             f"needs {spec.nbytes}; store the tensor's full little-endian data")


def _pack_constants(constants: dict[str, bytes]) -> tuple[bytes, dict[str, dict[str, int]]]:
    """Concatenate constant data in name order, each entry starting on an ALIGNMENT boundary of the blob."""
    blob = bytearray()
    ranges: dict[str, dict[str, int]] = {}
    for name in sorted(constants):
        data = bytes(constants[name])
        blob += bytes(_align(len(blob)) - len(blob))
        ranges[name] = {"offset": len(blob), "nbytes": len(data)}
        blob += data
    return bytes(blob), ranges


def _header_dict(program: CompiledProgram, ranges: dict[str, dict[str, int]], blob_nbytes: int) -> dict[str, Any]:
    # Every program field through the one codec (`tensors` becomes a list so the compiler's order survives
    # sort_keys); the constant bytes are in the blob, located by `constants`. A kernel's params are plain
    # values, a non-finite float among them written as a string (strict JSON has no inf); a host dispatch's
    # are its IR node's attributes, already strict JSON (the IR tags inf).
    header = to_json(program)
    for d, data in zip(program.dispatches, header["dispatches"]):
        if d.host is None and isinstance(d.params, dict):
            data["params"] = params_to_file(d.params)
    return {**header, "constants": ranges, "blob_nbytes": blob_nbytes}


def _encode_header(header: dict[str, Any]) -> bytes:
    # Strict JSON (no NaN/Infinity), like the IR's own serializer, so any JSON reader can open the header.
    try:
        text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"cannot write .npubin: the program holds a value that is not strict JSON ({err}); "
                         "dispatch params, ir and metadata must be JSON values (no tuples keys, NaN or objects)"
                         ) from err
    return text.encode("utf-8")


# ---------------------------------------------------------------------------------------------- reading


def read_npubin(path: str | os.PathLike[str]) -> CompiledProgram:
    """Load a `.npubin` file; raises `NpubinError` (naming the file, the broken rule and the fix) if unusable."""
    path = Path(path)
    return decode_npubin(read_file_bytes(path), path)


def read_file_bytes(path: Path) -> bytes:
    """A program file's bytes (of either kind), its size checked before it is read; `NpubinError` naming it."""
    try:
        data = read_input(path, "program file", "check the path, or compile the model to create it")
    except InputNotFoundError:
        raise _error(path, "no such file", "check the path, or compile the model to create it") from None
    except TorchIRError as err:
        raise NpubinError(str(err)) from None
    except MemoryError:
        raise _out_of_memory(path) from None
    return data


def decode_npubin(data: bytes, path: str | os.PathLike[str] = "<bytes>") -> CompiledProgram:
    """Decode file contents; `path` only labels error messages. Checks run from the outside in.

    Every failure is an `NpubinError` naming `path`: a header nested deeper than Python can parse (a
    RecursionError) and running out of memory (a MemoryError) included.
    """
    try:
        return _decode(data, path)
    except RecursionError:
        raise _error(path, "header is nested too deeply to be a program") from None
    except MemoryError:
        raise _out_of_memory(path) from None


def _out_of_memory(path: str | os.PathLike[str]) -> NpubinError:
    return _error(path, "out of memory while loading the program", "free memory, or check the file (a small "
                  "file that needs more memory than this machine has is corrupt or hostile)")


def _decode(data: bytes, path: str | os.PathLike[str]) -> CompiledProgram:
    header_len = _check_fixed_header(data, path)
    _check_checksum(data, path)
    header = _parse_header(data[_FIXED.size:_FIXED.size + header_len], path)
    index = _blob_index(header, path)
    blob = data[_align(_FIXED.size + header_len):len(data) - _DIGEST_BYTES]
    if len(blob) != index.blob_nbytes:
        raise _error(path, f"blob holds {len(blob)} bytes but the header declares {index.blob_nbytes}")
    version = _FIXED.unpack_from(data)[1:3]
    program = _program_from_header(header, index, blob, path, ignore_unknown=version > FORMAT_VERSION)
    _read_params(program, version[0], path)
    from .check import check_program  # it raises this module's NpubinError

    # the kernel names are checked against the target's kernels when the kernel table knows the target; an
    # unknown target's names are the business of whoever runs it (the runtime checks them again)
    check_program(program, str(path), kernels=kernels_for(program.target) or None)
    return program


def _check_fixed_header(data: bytes, path: Path | str) -> int:
    """Magic, then version, then sizes; returns the header length.

    The version is checked before the checksum because a newer major may lay out everything after the
    fixed header differently, the checksum included.
    """
    if len(data) < _FIXED.size:
        raise _error(path, f"truncated: {len(data)} bytes, shorter than the {_FIXED.size}-byte fixed header")
    magic, major, minor, header_len = _FIXED.unpack_from(data)
    if magic != MAGIC:
        raise _error(path, f"not a .npubin file (magic {magic!r}, expected {MAGIC!r})",
                     "pass a file written by CompiledProgram.save / write_npubin")
    if major == DYNAMIC_MAJOR:
        raise _error(path, "holds a dynamic program (several shape buckets, format 3), not one static program",
                     "load it with npu_program.load_program (or DynamicProgram.load); Executor runs either")
    if major not in SUPPORTED_MAJORS:
        supported = ", ".join(f"{m}.x" for m in SUPPORTED_MAJORS)
        raise _error(path, f"format version {major}.{minor} is not supported (this reader supports {supported})",
                     "the program must be recompiled with this compiler, or loaded with a newer one")
    needed = _align(_FIXED.size + header_len) + _DIGEST_BYTES
    if len(data) < needed:
        raise _error(path, f"truncated: header declares {header_len} bytes, so the file needs at least {needed} "
                           f"bytes but has {len(data)}")
    return header_len


def _check_checksum(data: bytes, path: Path | str) -> None:
    body, stored = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != stored:
        raise _error(path, "checksum mismatch: file was altered or truncated", "recompile the model")


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not strict JSON")


def _parse_header(raw: bytes, path: Path | str) -> dict[str, Any]:
    # Strict JSON as the writer produces it: NaN/Infinity refused (parse_constant), and integers longer
    # than Python's digit limit refused rather than crashing (nesting deeper than its recursion limit: see
    # decode_npubin).
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as err:
        raise _error(path, f"header is not valid UTF-8 JSON (strict: no NaN or Infinity; {err})") from None
    if not isinstance(header, dict):
        raise _error(path, f"header is a JSON {type(header).__name__}, not an object")
    # The free-form fields are kept as they are: bounded in depth, so that no later walk over them (saving the
    # program again, copying it) overflows the stack. The typed fields are checked by from_json and check.
    for name in ("ir", "metadata"):
        if nested_deeper_than(header.get(name), MAX_JSON_DEPTH):
            raise _error(path, f"header field {name!r} is nested more than {MAX_JSON_DEPTH} lists or objects deep")
    return header


def _blob_index(header: dict[str, Any], path: Path | str) -> BlobIndex:
    """The header's blob fields, read strictly (a missing or mistyped one names its field path)."""
    try:
        return from_json(BlobIndex, {k: header[k] for k in _BLOB_FIELDS if k in header}, "header")
    except SchemaError as err:
        raise _error(path, f"header is malformed: {err}") from None


def _program_from_header(header: dict[str, Any], index: BlobIndex, blob: bytes, path: Path | str, *,
                         ignore_unknown: bool = False) -> CompiledProgram:
    """The program of a header. A file of a newer minor version may add optional top-level fields this
    reader does not know (see docs/npubin.md, Versioning): they are ignored; in a file of this reader's
    version an unknown field is an error."""
    known = {f.name for f in dataclasses.fields(CompiledProgram)}
    fields = {k: v for k, v in header.items()
              if k not in _BLOB_FIELDS and (k in known or not ignore_unknown)}
    try:
        program = from_json(CompiledProgram, fields, "header")
    except SchemaError as err:
        raise _error(path, f"header is malformed: {err}") from None
    program.constants = _read_constants(index.constants, blob, program.tensors, path)
    return program


def _read_params(program: CompiledProgram, major: int, path: Path | str) -> None:
    """A kernel dispatch's params as the program holds them: a 1.x file's (the IR node's attributes, verbatim)
    upgraded to plain params, a 2.x file's non-finite floats read back. Host dispatches keep theirs. A kernel the
    table does not know is left to the checker, which refuses it."""
    for i, d in enumerate(program.dispatches):
        record = KERNELS.get(d.kernel) if isinstance(d.kernel, str) else None
        if d.host is not None or record is None or not isinstance(d.params, dict):
            continue
        d.params = _upgrade_params(d, record.params, f"{path}: dispatch {i} ({d.kernel})") if major < 2 \
            else params_from_file(record.params, d.params)


def _upgrade_params(d: Dispatch, declared: dict[str, Param], where: str) -> dict[str, Any]:
    """The one place format 1.x params become 2.0 params: the IR's tagged encoding decoded and the declared
    defaults filled in, as lowering does (``params_from_attrs``). The params 1.x lowering made itself
    (``has_bias``, ``inplace_residual``) are in the file already."""
    try:
        return params_from_attrs(declared, d.params, where)
    except ParamError as err:
        raise NpubinError(f"{err}; {_RECOMPILE}") from None


def _read_constants(ranges: dict[str, ConstantRange], blob: bytes, tensors: dict[str, TensorSpec],
                    path: Path | str) -> dict[str, bytes]:
    constants = {}
    for name, entry in ranges.items():
        offset, nbytes = entry.offset, entry.nbytes
        if offset < 0 or nbytes < 0 or offset + nbytes > len(blob):
            raise _error(path, f"constant {name!r} range [{offset}, {offset + nbytes}) lies outside the "
                               f"{len(blob)}-byte blob")
        spec = tensors.get(name)
        if spec is None or spec.nbytes != nbytes:
            raise _error(path, f"constant {name!r} has {nbytes} bytes but no matching spec in 'tensors'")
        constants[name] = blob[offset:offset + nbytes]
    return constants
