"""The JSON form of non-tensor argument values, both ways, in one place.

Plain ints, floats, bools, strings and None are themselves. Anything else is a one-key tagged
object, so a reader never has to guess what a value is:

=====================  ===================================  ==========================
Python value           JSON                                 note
=====================  ===================================  ==========================
``torch.float32``      ``{"dtype": "float32"}``
``torch.device("cpu")`` ``{"device": "cpu"}``                replaced by the executor's
``torch.channels_last`` ``{"memory_format": "channels_last"}``
``torch.strided``      ``{"layout": "strided"}``
a SymInt ``s0*12``     ``{"sym": "12*s0"}``                  evaluated against the bound symbols
``float("inf")``       ``{"float": "inf"}``                  JSON has no inf/nan
=====================  ===================================  ==========================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from torch_ir import dtypes

from .symbolic import eval_sym, parse_sym

_MEMORY_FORMATS = {
    str(f).removeprefix("torch."): f
    for f in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format)
}
_LAYOUTS = {str(x).removeprefix("torch."): x for x in (torch.strided, torch.sparse_coo, torch._mkldnn)}  # type: ignore[attr-defined]


#: Dtypes whose values an IR may hold inline (``constant_values``, as JSON numbers); others go to the
#: weights file. Values must also be finite: JSON has no inf or nan. From the one dtype table.
INLINE_DTYPES = dtypes.INLINE_DTYPES


def dtype_name(dtype: torch.dtype) -> str:
    """The IR's name of a torch dtype (``torch.float32`` -> ``"float32"``); a ValueError for one the IR lacks."""
    return dtypes.from_torch(dtype)


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype of an IR dtype name; anything but a name of ``torch_ir.dtypes.DTYPES`` with a torch
    dtype is a ValueError (names come from files: never ``getattr(torch, name)``)."""
    return dtypes.torch_dtype(name)


def sym_text(value: Any) -> int | dict[str, str]:
    """An int for a concrete SymInt, else ``{"sym": expr}``."""
    expr = value.node.expr if hasattr(value, "node") else value
    if getattr(expr, "is_number", False) or isinstance(expr, int):
        return int(expr)
    return {"sym": str(expr)}


def encode_value(value: Any) -> Any:
    """Python/torch argument value -> JSON value (see the table above)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return sym_text(value)
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    raise TypeError(f"cannot store argument value {value!r} of type {type(value).__name__} in the IR")


def has_symbols(value: Any) -> bool:
    if isinstance(value, dict):
        return "sym" in value
    if isinstance(value, list):
        return any(has_symbols(v) for v in value)
    return False


TAGS = ("dtype", "device", "memory_format", "layout", "float", "sym")


#: How deep attribute lists may nest (an index list of lists is two); deeper only costs stack.
MAX_VALUE_DEPTH = 16


def check_value(value: Any, where: str, depth: int = 0) -> None:
    """Check a JSON attribute value from a file against the table above, without evaluating it.

    Raises ``ValueError`` (an unknown tag, a malformed payload) or ``UnsafeInputError`` (a symbolic size
    outside the allowed grammar), naming ``where``.
    """
    if isinstance(value, list):
        if depth >= MAX_VALUE_DEPTH:
            raise ValueError(f"{where}: lists nested more than {MAX_VALUE_DEPTH} deep are not attribute values")
        for i, v in enumerate(value):
            check_value(v, f"{where}[{i}]", depth + 1)
        return
    if not isinstance(value, dict):
        if value is None or isinstance(value, (bool, int, float, str)):
            return
        raise ValueError(f"{where}: {type(value).__name__} is not an attribute value")
    if len(value) != 1 or next(iter(value)) not in TAGS:
        raise ValueError(f"{where}: {str(value)[:80]} is not a tagged value: expected one key of {', '.join(TAGS)}")
    (tag, payload), = value.items()
    if not isinstance(payload, str):
        raise ValueError(f"{where}.{tag}: expected a string, got {type(payload).__name__}")
    if tag == "sym":
        parse_sym(payload, where)
        return
    try:
        decode_value(value, None, torch.device("cpu"))
    except (ValueError, KeyError, RuntimeError):
        raise ValueError(f"{where}: {tag} {payload[:80]!r} is not a valid {tag}") from None


def decode_value(value: Any, symbols: Mapping[str, int] | None = None, device: torch.device | None = None) -> Any:
    """JSON value -> Python/torch argument value. ``device`` replaces every stored device."""
    if isinstance(value, list):
        return [decode_value(v, symbols, device) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError(f"tagged attribute value {str(value)[:80]} must have exactly one key")
    (tag, payload), = value.items()
    if tag == "dtype":
        return dtype_from_name(payload)
    if tag == "device":
        return device if device is not None else torch.device(payload)
    if tag == "memory_format":
        return _lookup(_MEMORY_FORMATS, payload, tag)
    if tag == "layout":
        return _lookup(_LAYOUTS, payload, tag)
    if tag == "float":
        if payload not in ("inf", "-inf", "nan"):
            raise ValueError(f"tagged float {payload!r}: only 'inf', '-inf' and 'nan' are stored tagged")
        return float(payload)
    if tag == "sym":
        if symbols is None:
            raise ValueError(f"symbolic size {payload!r} needs bound symbols")
        return eval_sym(payload, symbols)
    raise ValueError(f"unknown tagged attribute value {str(value)[:80]}; tags are {', '.join(TAGS)}")


def _lookup(table: Mapping[str, Any], payload: Any, tag: str) -> Any:
    if not isinstance(payload, str) or payload not in table:
        raise ValueError(f"unknown {tag} {payload!r}; expected one of {', '.join(table)}")
    return table[payload]
