"""Shape arithmetic on symbolic dimensions, folded at import time.

A dynamic-axes export computes reshape targets from ``Shape`` of tensors whose sizes are symbols.
Such a value is kept as a numpy object array of ints and expressions (``"batch"``, ``"batch*seq"``),
and the ops that shape subgraphs use (Gather, Slice, Concat, Unsqueeze, Squeeze, Cast, Identity
and integer arithmetic) are evaluated on it here. A ``Reshape`` then gets a target such as
``[{"sym": "batch"}, {"sym": "seq"}, 4, 16]``, which the executor evaluates with the bound symbols.

A value here is a shape, a few elements: a result over ``torch_ir.limits.fold_allowed`` (counted at
8 bytes an element, at most :data:`MAX_ELEMENTS`) or an expression longer than :data:`MAX_EXPRESSION`
characters (``x*x`` squared again and again doubles it) is not folded; the node stays a graph node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx

from ...ir import TensorMeta
from ...limits import fold_allowed

_ARITH = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "//"}
#: Longest symbolic size expression folded at import time.
MAX_EXPRESSION = 512
#: Most elements of a symbolic shape value (a shape has a few; each becomes a node if it reaches a converter).
MAX_ELEMENTS = 1 << 12


class _TooLarge(Exception):  # noqa: N818 - internal signal: not folded
    pass


def is_symbolic(value: object) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == object


def fold_symbolic(node: onnx.NodeProto, inputs: Sequence[object], attrs: dict,
                  bound: set[str]) -> list[np.ndarray] | None:
    """The node's outputs as symbolic shape values, or None when it is not shape arithmetic on them.

    Only ``Shape`` of a tensor whose symbolic sizes are all in ``bound`` (the symbols of the graph
    inputs, which the executor binds) starts such a value; any other size is data-dependent.
    """
    try:
        result = _fold(node.op_type, inputs, attrs, bound)
    except (_TooLarge, ValueError, IndexError, TypeError, KeyError, ZeroDivisionError, OverflowError):
        return None  # a bad axis, an empty bound, too large: the node's converter decides (and reports)
    return None if result is None else [v if isinstance(v, np.ndarray) else np.array(v, dtype=object)
                                        for v in result]


def _fold(op: str, inputs: Sequence[object], attrs: dict, bound: set[str]) -> list | None:
    if op == "Shape" and isinstance(inputs[0], TensorMeta) and not inputs[0].is_static:
        rank = len(inputs[0].shape)
        start, end = attrs.get("start", 0), attrs.get("end", rank)
        dims = inputs[0].shape[slice(start, end)]
        if not all(isinstance(d, int) or d in bound for d in dims):
            return None
        return [_array(dims)]
    if not any(is_symbolic(v) for v in inputs) or not all(isinstance(v, np.ndarray) or v is None for v in inputs):
        return None
    x = inputs[0]
    if op in ("Identity", "Cast"):
        return [x]
    if op == "Gather" and isinstance(inputs[1], np.ndarray) and inputs[1].dtype != object:
        _check_size(inputs[1].size * max(1, x.size))
        return [np.take(x, inputs[1], axis=attrs.get("axis", 0))]
    if op == "Concat":
        _check_size(sum(v.size for v in inputs if v is not None))
        return [np.concatenate([v.astype(object) for v in inputs], axis=attrs.get("axis", 0))]
    if op in ("Unsqueeze", "Squeeze"):
        axes = attrs.get("axes", None if len(inputs) < 2 or inputs[1] is None else list(inputs[1]))
        if op == "Unsqueeze":
            return [np.expand_dims(x, tuple(axes))]
        return [np.squeeze(x, tuple(axes) if axes is not None else None)]
    if op == "Slice" and x.ndim == 1 and all(v is None or v.dtype != object for v in inputs[1:]):
        starts, ends = int(inputs[1][0]), int(inputs[2][0])
        step = int(inputs[4][0]) if len(inputs) > 4 and inputs[4] is not None else 1
        return [x[slice(starts, min(ends, len(x)) if ends > 0 else ends, step)]]
    if op in _ARITH and len(inputs) == 2:
        _check_size(math.prod(np.broadcast_shapes(inputs[0].shape, inputs[1].shape)))
        a, b = np.broadcast_arrays(inputs[0].astype(object), inputs[1].astype(object))
        out = [_combine(p, q, _ARITH[op]) for p, q in zip(a.reshape(-1), b.reshape(-1))]
        return [_array(out).reshape(a.shape)]
    return None


def _combine(a: object, b: object, sign: str) -> object:
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        a, b = int(a), int(b)
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b}[sign]
    if sign == "*" and (a == 1 or b == 1):
        return b if a == 1 else a
    expression = f"({a}){sign}({b})"
    if len(expression) > MAX_EXPRESSION:
        raise _TooLarge(expression[:40])
    return expression


def _check_size(numel: int) -> None:
    if numel > MAX_ELEMENTS or not fold_allowed(numel * 8):
        raise _TooLarge(numel)


def _array(values: Sequence[object]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = [int(v) if isinstance(v, (int, np.integer)) else v for v in values]
    return out


def all_ints(value: np.ndarray) -> bool:
    return all(isinstance(v, (int, np.integer)) for v in value.reshape(-1))
