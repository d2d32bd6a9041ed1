"""The converter table: ONNX op type -> one converter per opset version where the semantics changed.

A converter is named after the ONNX op it translates and is registered for the first opset whose
semantics it implements::

    @converter("Slice", since=10)          # starts/ends/axes/steps became inputs in opset 10
    def Slice(ctx, data, starts, ends, axes=None, steps=None):
        ...

It receives the node's inputs positionally (an IR ``TensorMeta``, a numpy array when the value is
known at import time, or None for an absent optional input) and the ONNX attributes as keyword
arguments, and returns the node's outputs (a value or a tuple of them). ``lookup`` picks the
converter of the newest ``since`` that is not newer than the model's opset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Converter = Callable[..., object]


@dataclass(frozen=True)
class Entry:
    op_type: str
    since: int
    fn: Converter


#: (domain, op type) -> entries sorted by ``since``
TABLE: dict[tuple[str, str], list[Entry]] = {}


def converter(op_type: str, since: int = 1, *, domain: str = "") -> Callable:
    """Register ``fn`` as the converter of ``op_type`` from opset ``since`` on."""
    def decorator(fn: Converter) -> Converter:
        entries = TABLE.setdefault((domain, op_type), [])
        entries.append(Entry(op_type, since, fn))
        entries.sort(key=lambda e: e.since)
        return fn
    return decorator


def lookup(domain: str, op_type: str, opset: int) -> Entry | None:
    """The converter for ``op_type`` at ``opset``, or None.

    Example::

        >>> lookup("", "Relu", 17).fn.__name__
        'Relu'
    """
    entries = TABLE.get(("" if domain == "ai.onnx" else domain, op_type), [])
    chosen = None
    for entry in entries:
        if entry.since <= opset:
            chosen = entry
    return chosen


def _load() -> None:
    # importing the modules fills TABLE
    from . import attention, elementwise, indexing, nn, qops, quant, reduce, reference, resize, rnn, shape  # noqa: F401


_load()
