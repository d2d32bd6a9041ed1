"""The `.npubin` file format, re-exported from ``npu_program.npubin`` (where the reader and writer live, so
that the runtime loads programs without importing the compiler). docs/npubin.md describes the layout."""

from __future__ import annotations

import os  # noqa: F401  (kept as an attribute: tests patch npu_compiler.npubin.os)

from npu_program.npubin import (
    ALIGNMENT,
    FORMAT_VERSION,
    MAGIC,
    REQUIRED_FIELDS,
    SUPPORTED_MAJORS,
    NpubinError,
    decode_npubin,
    encode_npubin,
    read_npubin,
    write_npubin,
)

__all__ = ["ALIGNMENT", "FORMAT_VERSION", "MAGIC", "REQUIRED_FIELDS", "SUPPORTED_MAJORS", "NpubinError",
           "decode_npubin", "encode_npubin", "read_npubin", "write_npubin"]
