"""Small helpers the rule sets share: making replacement nodes, reading shapes and attributes."""

from __future__ import annotations

import math
from typing import Any

from ..ir import OpNode, TensorMeta
from .rewrite import Match


def node(m: Match, op_type: str, inputs: list[TensorMeta], attrs: dict[str, Any] | None = None,
         outputs: list[TensorMeta] | None = None, suffix: str = "") -> OpNode:
    """A node that takes the root's place: the root's name (plus ``suffix``) and, by default, its outputs."""
    root = m.node()
    return OpNode(root.name + suffix, op_type, list(inputs), list(outputs if outputs is not None else root.outputs),
                  dict(attrs or {}))


def temp(m: Match, like: TensorMeta, shape: list, suffix: str, dtype: str | None = None) -> TensorMeta:
    """A new intermediate tensor named after the root (``linear_r``)."""
    return TensorMeta(m.node().outputs[0].name + suffix, list(shape), dtype or like.dtype, role="activation")


def shape_attr(shape: list[int | str]) -> list[Any]:
    """A shape as an attribute value: symbolic dims in the ``{"sym": ...}`` form the executor decodes."""
    return [d if isinstance(d, int) else {"sym": d} for d in shape]


def out(m: Match, name: str = "root") -> TensorMeta:
    return m.node(name).outputs[0]


def static(shape: list[int | str]) -> bool:
    return all(isinstance(d, int) for d in shape)


def prod(dims: list[int | str]) -> int | None:
    return math.prod(dims) if static(dims) else None


def norm_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def producer_op(m: Match, t: TensorMeta) -> str | None:
    p = m.producer(t)
    return p.op_type if p is not None else None


VIEWS = ("aten.reshape.default", "aten.view.default", "aten._unsafe_view.default", "aten.unsqueeze.default",
         "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.flatten.using_ints")
