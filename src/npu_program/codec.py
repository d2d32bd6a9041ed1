"""One codec between plain dataclasses and JSON values, driven by the fields' type hints.

``to_json(obj)`` turns a dataclass (or a list/dict of them) into JSON values; ``from_json(cls, data, where)``
builds one back and checks every value against the field's annotation on the way, so a file written by a
buggy or hostile writer is refused with a :class:`SchemaError` that names the field path
(``header.dispatches[3].inputs[0]: expected str, got int``) instead of flowing on as a wrong type.

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any`` (any JSON value, unchecked
here), ``list[T]``, ``dict[str, T]``, nested dataclasses and unions with ``None`` (``T | None``). The checks
are strict: an ``int`` field refuses floats, strings and bools; a ``float`` field takes an int (JSON has one
number type) but not a bool; an object with a key the dataclass has no field for is refused; a missing key
is refused unless the field has a default.

A class that defines its own JSON form (``to_dict()`` and a validating ``from_dict(data, where)`` classmethod, e.g.
``torch_ir.quant.QuantSpec``) is written and read through them: its own rules are the check, and what it raises
(a ``ValueError`` naming ``where``) becomes a :class:`SchemaError` naming the field path.

Field metadata (``dataclasses.field(metadata=...)``) tunes two things:

* ``{"json": False}``: the field is not part of the JSON form (e.g. constant bytes, stored in a blob);
* ``{"keyed_by": "name"}``: a ``dict[str, T]`` stored as a JSON list of ``T`` in insertion order, keyed on
  decoding by each item's ``name`` (duplicates refused). A JSON object would lose the order to
  ``sort_keys``, and the writer must be deterministic;
* ``{"omit_default": True}``: the field is left out of the JSON form while it holds its default (it
  decodes back to the default). A field added in a minor format version then changes nothing in the
  files that do not use it, and a reader of the older version refuses only the files that do (as an
  unknown field) instead of misreading them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, TypeVar, Union

T = TypeVar("T")


class SchemaError(TypeError, ValueError):
    """A JSON value does not fit the dataclass it is read into; the message names the field path."""


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _json_fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("json", True)]


# ------------------------------------------------------------------------------------------------ encoding


def to_json(obj: Any) -> Any:
    """``obj`` as JSON values: dataclasses become objects (fields in declaration order), tuples lists."""
    if _own_form(type(obj)):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in _json_fields(type(obj)):
            value = getattr(obj, f.name)
            if f.metadata.get("omit_default") and value == f.default:
                continue
            key = f.metadata.get("keyed_by")
            out[f.name] = [to_json(v) for v in value.values()] if key and value is not None else to_json(value)
        return out
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj


# ------------------------------------------------------------------------------------------------ decoding


def from_json(cls: type[T], data: Any, where: str = "value") -> T:
    """Build a ``cls`` (a dataclass or any supported annotation) from JSON ``data``, checking every value.

    Raises :class:`SchemaError` naming the path below ``where`` of the first value that does not fit.
    """
    return _decode(cls, data, where)


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "bool", int: "int", float: "float",
            type(None): "null"}.get(type(value), type(value).__name__)


def _fail(where: str, expected: str, value: Any) -> SchemaError:
    return SchemaError(f"{where}: expected {expected}, got {_json_type(value)} {str(value)[:40]!r}"
                       if not isinstance(value, (dict, list)) else
                       f"{where}: expected {expected}, got {_json_type(value)}")


def _decode(tp: Any, data: Any, where: str) -> Any:
    if tp is Any:
        return data
    if tp is None or tp is type(None):
        if data is not None:
            raise _fail(where, "null", data)
        return None
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if data is None and type(None) in options:
            return None
        rest = [o for o in options if o is not type(None)]
        if len(rest) != 1:
            raise SchemaError(f"{where}: the codec supports only unions with None, not {tp}")
        return _decode(rest[0], data, where)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(data, list):
            raise _fail(where, "array", data)
        return [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        key_type, item = typing.get_args(tp) or (str, Any)
        if key_type is not str:
            raise SchemaError(f"{where}: JSON object keys are strings; {tp} is not supported")
        if not isinstance(data, dict):
            raise _fail(where, "object", data)
        return {_key(k, where): _decode(item, v, f"{where}[{k!r}]") for k, v in data.items()}
    if _own_form(tp):
        if not isinstance(data, dict):
            raise _fail(where, f"object ({_name(tp)})", data)
        try:
            return tp.from_dict(data, where)
        except (TypeError, ValueError) as err:  # its own validator's refusal (naming ``where``), or a value of a
            message = (str(err).splitlines() or [""])[0][:500]  # type it did not expect (unhashable, say)
            raise SchemaError(message if message.startswith(where) else f"{where}: not a valid {_name(tp)} "
                              f"({message})") from None
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, data, where)
    if tp is bool:
        if not isinstance(data, bool):
            raise _fail(where, "bool", data)
        return data
    if tp is int:
        if not isinstance(data, int) or isinstance(data, bool):
            raise _fail(where, "int", data)
        return data
    if tp is float:
        if not isinstance(data, (int, float)) or isinstance(data, bool):
            raise _fail(where, "float", data)
        return float(data)
    if tp is str:
        if not isinstance(data, str):
            raise _fail(where, "string", data)
        return data
    raise SchemaError(f"{where}: the codec does not support the annotation {_name(tp)}")


def _own_form(tp: Any) -> bool:
    """Whether ``tp`` is a class with its own JSON form (``to_dict`` and ``from_dict``)."""
    return isinstance(tp, type) and callable(getattr(tp, "to_dict", None)) and callable(
        getattr(tp, "from_dict", None))


def _key(key: Any, where: str) -> str:
    if not isinstance(key, str):
        raise _fail(f"{where} key", "string", key)
    return key


def _decode_dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise _fail(where, f"object ({cls.__name__})", data)
    fields = _json_fields(cls)
    known = {f.name for f in fields}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise SchemaError(f"{where}: unknown field {unknown[0][:60]!r} (a {cls.__name__} has "
                          f"{', '.join(sorted(known))})")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in fields:
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SchemaError(f"{where} lacks required field {f.name!r}")
            continue
        path = f"{where}.{f.name}"
        key = f.metadata.get("keyed_by")
        if key:
            values[f.name] = _decode_keyed(hints[f.name], data[f.name], key, path)
        else:
            values[f.name] = _decode(hints[f.name], data[f.name], path)
    return cls(**values)


def _decode_keyed(tp: Any, data: Any, key: str, where: str) -> dict[str, Any]:
    """A ``dict[str, T]`` stored as a list of T, keyed by each item's ``key`` attribute."""
    _, item = typing.get_args(tp)
    items = _decode(list[item], data, where)  # type: ignore[valid-type]
    out: dict[str, Any] = {}
    for i, value in enumerate(items):
        name = getattr(value, key)
        if name in out:
            raise SchemaError(f"{where}[{i}]: duplicate {key} {str(name)[:60]!r}")
        out[name] = value
    return out


__all__ = ["SchemaError", "from_json", "to_json"]
