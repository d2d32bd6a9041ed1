"""Folding at import time: nodes whose inputs are all known become constants, not IR nodes.

Exporters leave shape arithmetic behind (``Shape -> Gather -> Concat -> Reshape``). When the
input shapes are static, ``Shape`` is a constant, so is everything computed from it, and the
``Reshape`` target becomes a static attribute. Known values are evaluated with the ONNX reference
implementation (``onnx.reference``), the specification's own executable form.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from ...ir import TensorMeta

#: Ops never folded: their value is not a function of their inputs.
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
                "If", "Loop", "Scan", "SequenceEmpty", "Optional", "ImageDecoder"}
#: Inputs larger than this are not folded: the result would be a large constant the model computes anyway.
FOLD_INPUT_LIMIT = 1 << 20


def static_shape_value(op_type: str, node: onnx.NodeProto, x: TensorMeta | np.ndarray) -> np.ndarray | None:
    """``Shape``/``Size`` of a tensor whose shape is static, as a constant; else None."""
    shape = list(x.shape)
    if op_type == "Size":
        return np.array(int(np.prod(shape)), dtype=np.int64) if all(isinstance(d, int) for d in shape) else None
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start, end = (max(0, min(rank, v + rank if v < 0 else v)) for v in (start, end))
    picked = shape[start:end]
    return np.array(picked, dtype=np.int64) if all(isinstance(d, int) for d in picked) else None


def can_fold(node: onnx.NodeProto, inputs: Sequence[object]) -> bool:
    if node.op_type in NOT_FOLDABLE or node.domain not in ("", "ai.onnx"):
        return False
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return False
    present = [v for v in inputs if v is not None]
    if not all(isinstance(v, np.ndarray) for v in present):
        return False
    return sum(v.size for v in present) <= FOLD_INPUT_LIMIT


def evaluate(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """Run one node with the ONNX reference implementation."""
    names = [n for n in node.input]
    feeds = {n: v for n, v in zip(names, inputs) if n and v is not None}
    evaluator = ReferenceEvaluator(node, opsets={"": opset})
    return [np.asarray(v) for v in evaluator.run(None, feeds)]
