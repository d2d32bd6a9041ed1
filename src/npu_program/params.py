"""Typed kernel parameters: what a kernel record declares, what a dispatch may carry, and the IR's encoding.

Every kernel record (``npu_program.kernels``) declares its parameters as :class:`Param` s: a name, a type
from the closed set below, a default and a line of documentation. A dispatch's ``params`` are plain values
of those types: no torch object, no IR tag. Three things follow from the declarations, all here:

* :func:`check_params`: the program checker's test of a dispatch's params (an unknown name, a wrong type, a
  value outside a string's choices, a missing required param), without torch;
* :func:`params_from_attrs`: an IR node's attributes, in the IR's tagged encoding (``torch_ir.ops.values``:
  ``{"dtype": "float16"}``, ``{"float": "inf"}``), decoded into plain params with every declared default
  filled in. Lowering makes a dispatch's params with it, and the ``.npubin`` reader upgrades the params of a
  format 1.x file (which held the IR's attributes verbatim) with it;
* :func:`params_to_attrs`: the way back, for the one consumer that needs the IR's encoding: an op's reference
  implementation (``npu_runtime.reference``).

Types (a declaration's ``type`` is one of them or several joined by ``|``, e.g. ``"int|null"``):

=================  =============================================================================================
``bool``           ``true`` / ``false``
``int``            an integer (not a bool) of 64 bits
``float``          a number; inf and nan are Python floats in memory, ``"inf"``, ``"-inf"``, ``"nan"`` in a file
``scalar``         an ATen ``Scalar``: a bool, an int (kept an int: ``x * 3`` stays integral) or a float
``str``            a string of at most 1000 characters; one of the declaration's ``choices`` when it has them
``dtype``          a dtype name of ``torch_ir.dtypes`` that torch has (``"float16"``)
``layout``         a torch layout name (``"strided"``)
``memory_format``  a torch memory format name (``"contiguous_format"``)
``device``         a device string (``"cpu"``); the runtime runs on its own device whatever it says
``ints``           a list of ints
``floats``         a list of numbers
``bools``          a list of bools
``tensor``         an ATen tensor argument the IR holds as a constant (a number or bool) or leaves out (null);
                   absent, it is the next tensor input
``inputs``         an ATen tensor-list argument: input positions (ints in [0, number of inputs)) or nulls
``null``           ``null`` (``None``)
=================  =============================================================================================

Defaults are filled in, not omitted: a dispatch made by the compiler carries every declared param, except the
``tensor`` and ``inputs`` ones (an argument absent there is read from the inputs; see :data:`INPUT`). The
checker still accepts a dispatch without a param that has a default (the default applies), so a program
built by hand may leave them out.

This module imports neither torch nor the IR's decoder: the program checker runs on plain data.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch_ir.dtypes import DTYPES


class _Marker:
    """A default that is not a value: ``REQUIRED`` or ``INPUT``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: No default: every dispatch of the kernel must give the param.
REQUIRED: Any = _Marker("REQUIRED")
#: An ATen tensor argument (type ``tensor`` or ``inputs``): absent, it is the next tensor input; never filled.
INPUT: Any = _Marker("INPUT")

LAYOUTS = ("strided", "sparse_coo", "_mkldnn")
MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")
TYPES = frozenset({"bool", "int", "float", "scalar", "str", "dtype", "layout", "memory_format", "device", "ints",
                   "floats", "bools", "tensor", "inputs", "null"})
#: Types whose values the IR tags with the type's own name (``{"dtype": "float16"}``).
_TAGGED = ("dtype", "layout", "memory_format", "device")
#: The non-finite floats by the strings a file holds them as (JSON has no inf or nan).
NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_FLOATS = frozenset({"float", "scalar", "floats", "tensor"})  # types that may hold a non-finite float
MAX_STR_CHARS = 1000
MAX_LIST_ITEMS = 1 << 16
_INT_BOUND = 1 << 63
_DEVICE = re.compile(r"[a-z][a-z0-9_]{0,15}(:[0-9]{1,4})?")


class ParamError(ValueError):
    """A dispatch's params do not fit its kernel's declarations; the message names where, the param and the rule."""


@dataclass(frozen=True)
class Param:
    """One declared parameter of a kernel: plain data (a name, a type of ``TYPES``, a default, a doc line)."""

    name: str
    type: str
    default: Any = REQUIRED
    doc: str = ""
    #: The allowed values of a ``str`` param (None: any string).
    choices: tuple[str, ...] | None = None

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(self.type.split("|"))

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def filled(self) -> bool:
        """Whether the compiler writes the default when the IR leaves the param out."""
        return self.default is not REQUIRED and self.default is not INPUT


def p(name: str, type: str, default: Any = REQUIRED, doc: str = "", choices: tuple[str, ...] | None = None) -> Param:
    """A declaration, checked now (an unknown type or a default that does not fit is a bug of the table)."""
    decl = Param(name, type, default, doc, choices)
    unknown = set(decl.types) - TYPES
    if unknown:
        raise ValueError(f"param {name!r}: unknown type(s) {sorted(unknown)}; types are {sorted(TYPES)}")
    if decl.filled and not _fits(decl, default, 0):
        raise ValueError(f"param {name!r}: default {default!r} is not a {type}")
    return decl


def declare(*params: Param) -> dict[str, Param]:
    """A kernel record's ``params``: name -> declaration, in declaration order."""
    table = {decl.name: decl for decl in params}
    if len(table) != len(params):
        raise ValueError(f"a param is declared twice in {[d.name for d in params]}")
    return table


# -- checking -------------------------------------------------------------------------------------------------


def check_params(decls: Mapping[str, Param], params: Any, n_inputs: int, where: str) -> None:
    """Raise :class:`ParamError` unless ``params`` fit ``decls``: known names, values of the declared types (a
    string among its choices, an input position below ``n_inputs``), every required param given."""
    if not isinstance(params, dict):
        raise ParamError(f"{where}: params must be an object, got {type(params).__name__}")
    for name, value in params.items():
        decl = decls.get(name) if isinstance(name, str) else None
        if decl is None:
            raise ParamError(f"{where}: {str(name)[:60]!r} is not a param of the kernel (it takes "
                             f"{', '.join(decls) or 'none'})")
        if not _fits(decl, value, n_inputs):
            raise ParamError(f"{where}: param {name!r} is {_show(value)}, expected {describe(decl)}")
    missing = [name for name, decl in decls.items() if decl.required and name not in params]
    if missing:
        raise ParamError(f"{where}: lacks the required param {missing[0]!r} ({describe(decls[missing[0]])})")


def describe(decl: Param) -> str:
    """The declaration's type in words, for messages and docs."""
    words = []
    for t in decl.types:
        if t == "str" and decl.choices is not None:
            words.append("one of " + ", ".join(repr(c) for c in decl.choices))
        elif t == "inputs":
            words.append("a list of input positions")
        else:
            words.append({"ints": "a list of ints", "floats": "a list of numbers", "bools": "a list of bools",
                          "tensor": "a number (a tensor argument given as a constant)"}.get(t, t))
    return " or ".join(words)


def _fits(decl: Param, value: Any, n_inputs: int) -> bool:
    return any(_fits_type(t, decl, value, n_inputs) for t in decl.types)


def _fits_type(t: str, decl: Param, value: Any, n_inputs: int) -> bool:
    if t in ("ints", "floats", "bools", "inputs"):
        return isinstance(value, list) and len(value) <= MAX_LIST_ITEMS and all(
            _fits_item(t, v, n_inputs) for v in value)
    if t == "str":
        return isinstance(value, str) and len(value) <= MAX_STR_CHARS and (
            decl.choices is None or value in decl.choices)
    if t == "dtype":
        return isinstance(value, str) and value in DTYPES and DTYPES[value].torch_name is not None
    if t == "layout":
        return value in LAYOUTS
    if t == "memory_format":
        return value in MEMORY_FORMATS
    if t == "device":
        return isinstance(value, str) and _DEVICE.fullmatch(value) is not None
    if t == "tensor":
        return value is None or _is_scalar(value)
    if t == "scalar":
        return _is_scalar(value)
    return _fits_item({"bool": "bools", "int": "ints", "float": "floats", "null": "null"}[t], value, n_inputs)


def _fits_item(list_type: str, value: Any, n_inputs: int) -> bool:
    if list_type == "ints":
        return _is_int(value)
    if list_type == "floats":
        return _is_number(value)
    if list_type == "bools":
        return type(value) is bool
    if list_type == "inputs":
        return value is None or (_is_int(value) and 0 <= value < n_inputs)
    return value is None


def _is_int(value: Any) -> bool:
    return type(value) is int and -_INT_BOUND <= value < _INT_BOUND


def _is_number(value: Any) -> bool:
    return _is_int(value) or type(value) is float


def _is_scalar(value: Any) -> bool:
    return type(value) is bool or _is_number(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- the IR's encoding, both ways -----------------------------------------------------------------------------

#: How deep an attribute's lists may nest (the IR's own bound, ``torch_ir.ops.values.MAX_VALUE_DEPTH``).
MAX_DEPTH = 16


def params_from_attrs(decls: Mapping[str, Param], attrs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An IR node's attributes as plain params: tags decoded (``{"dtype": "float16"}`` -> ``"float16"``,
    ``{"float": "inf"}`` -> ``inf``), the declared defaults filled in, in declaration order. An attribute the
    kernel does not declare, a symbolic size or an unknown tag is a :class:`ParamError` naming ``where`` and
    the param. The values' types are :func:`check_params`'s business."""
    unknown = [name for name in attrs if name not in decls]
    if unknown:
        raise ParamError(f"{where}: attribute {str(unknown[0])[:60]!r} is not a param of the kernel (it takes "
                         f"{', '.join(decls) or 'none'})")
    params = {}
    for name, decl in decls.items():
        if name in attrs:
            params[name] = decode_attr(attrs[name], f"{where}: param {name!r}")
        elif decl.filled:
            params[name] = list(decl.default) if isinstance(decl.default, list) else decl.default
    return params


def decode_attr(value: Any, where: str, depth: int = 0) -> Any:
    """One attribute value in the IR's encoding as a plain value (see :func:`params_from_attrs`)."""
    if isinstance(value, list):
        if depth >= MAX_DEPTH:
            raise ParamError(f"{where}: lists nested more than {MAX_DEPTH} deep")
        return [decode_attr(v, where, depth + 1) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ParamError(f"{where}: {_show(value)} is not a tagged value (one key)")
    (tag, payload), = value.items()
    if tag == "sym":
        raise ParamError(f"{where}: the symbolic size {_show(payload)} has no value; a program is planned for "
                         "static shapes: bind the symbols (compile(bind=...), --bind) before compiling")
    if tag == "float" and payload in NON_FINITE:
        return NON_FINITE[payload]
    if tag in _TAGGED and isinstance(payload, str):
        return payload
    raise ParamError(f"{where}: {_show(value)} is not a tagged value of the IR (dtype, layout, memory_format, "
                     "device, float)")


def params_to_attrs(decls: Mapping[str, Param], params: Mapping[str, Any]) -> dict[str, Any]:
    """Plain params in the IR's encoding again (the op's reference implementation reads that): a value of a
    tagged type tagged, a non-finite float ``{"float": "inf"}``. A param without a declaration is kept as it is."""
    attrs = {}
    for name, value in params.items():
        decl = decls.get(name)
        attrs[name] = value if decl is None else _encode(decl, value)
    return attrs


def _encode(decl: Param, value: Any) -> Any:
    if isinstance(value, list):
        return [_encode(decl, v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if isinstance(value, str):
        tag = next((t for t in decl.types if t in _TAGGED), None)
        return value if tag is None else {tag: value}
    return value


# -- the file's encoding of non-finite floats -------------------------------------------------------------------


def params_to_file(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as strict JSON: a non-finite float as ``"inf"``, ``"-inf"`` or ``"nan"``."""
    return {name: _finite_json(value) for name, value in params.items()}


def _finite_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_finite_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def params_from_file(decls: Mapping[str, Param], params: Any) -> Any:
    """The inverse of :func:`params_to_file` for a kernel's params: ``"inf"``, ``"-inf"`` and ``"nan"`` become
    floats where the declaration takes a number (a string param keeps its string). Anything else is left for
    :func:`check_params` to judge."""
    if not isinstance(params, dict):
        return params
    out = {}
    for name, value in params.items():
        decl = decls.get(name) if isinstance(name, str) else None
        numeric = decl is not None and not _FLOATS.isdisjoint(decl.types)
        out[name] = _non_finite(value) if numeric else value
    return out


def _non_finite(value: Any) -> Any:
    if isinstance(value, list):
        return [NON_FINITE.get(v, v) if isinstance(v, str) else v for v in value]
    return NON_FINITE.get(value, value) if isinstance(value, str) else value


# -- host dispatches ----------------------------------------------------------------------------------------------


def check_json_value(value: Any, where: str, depth: int = 0) -> None:
    """A host dispatch's params are its IR node's attributes, whose meaning the op registry judges when the
    runtime binds the op (``npu_runtime.reference``); here they only have to be bounded JSON: null, bools,
    numbers, strings, lists and string-keyed objects, nested at most ``MAX_DEPTH`` deep."""
    if isinstance(value, (list, dict)):
        if depth >= MAX_DEPTH:
            raise ParamError(f"{where}: nested more than {MAX_DEPTH} lists or objects deep")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(value, dict) and not isinstance(key, str):
                raise ParamError(f"{where}: object key {_show(key)} is not a string")
            check_json_value(item, f"{where}[{key!r}]", depth + 1)
        return
    if value is not None and not isinstance(value, (bool, int, float, str)):
        raise ParamError(f"{where}: {type(value).__name__} is not a JSON value")


__all__ = ["INPUT", "LAYOUTS", "MEMORY_FORMATS", "REQUIRED", "TYPES", "Param", "ParamError", "check_json_value",
           "check_params", "declare", "decode_attr", "describe", "p", "params_from_attrs", "params_from_file",
           "params_to_attrs", "params_to_file"]
