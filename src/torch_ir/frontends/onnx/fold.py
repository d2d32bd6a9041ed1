"""Folding at import time: nodes whose inputs are all known become constants, not IR nodes.

Exporters leave shape arithmetic behind (``Shape -> Gather -> Concat -> Reshape``). When the
input shapes are static, ``Shape`` is a constant, so is everything computed from it, and the
``Reshape`` target becomes a static attribute. Known values are evaluated with the ONNX reference
implementation (``onnx.reference``), the specification's own executable form.

A few bytes of a file can ask folding for any amount of memory (``ConstantOfShape`` of ``[10**5, 10**5]``),
so the size of a node's outputs is computed first (:func:`output_nbytes`, ONNX shape inference on the
known values) and the node is folded only when ``torch_ir.limits.fold_allowed`` accepts it; otherwise it
stays a graph node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from ...ir import TensorMeta

#: Ops never folded: their value is not a function of their inputs.
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
                "If", "Loop", "Scan", "SequenceEmpty", "Optional", "ImageDecoder"}
#: Inputs larger than this are not folded: the result would be a large constant the model computes anyway.
FOLD_INPUT_LIMIT = 1 << 20
#: Ops whose work grows faster than their inputs and outputs (a convolution, a product): folded only when
#: their inputs are this small, so that a file cannot make the import compute for minutes.
HEAVY_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv", "MatMul", "MatMulInteger",
             "QLinearMatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Attention", "MaxRoiPool", "RoiAlign",
             "Col2Im", "DFT", "STFT", "NonMaxSuppression", "TfIdfVectorizer"}
HEAVY_INPUT_LIMIT = 1 << 16
#: Inputs up to this many elements are given to shape inference with their values (shapes, axes, bounds).
_DATA_FOR_INFERENCE = 1 << 12


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
    limit = HEAVY_INPUT_LIMIT if node.op_type in HEAVY_OPS else FOLD_INPUT_LIMIT
    return sum(v.size for v in present) <= limit


def output_nbytes(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int,
                  default_opset: int | None = None) -> int | None:
    """The bytes ``node``'s outputs take when it runs on ``inputs`` (known values), before running it.

    ONNX shape inference computes the output shapes from the input types and the values of the small
    inputs (a shape, axes, bounds); ``opset`` is that of the node's domain (``default_opset`` that of
    ai.onnx, when the node is of another domain). None when it cannot tell (an output whose size depends on the data
    of a large input, an op without inference): the caller then does not fold.
    """
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        types, data = {}, {}
        for name, value in zip(node.input, inputs):
            if not name or value is None:
                continue
            elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
            types[name] = onnx.helper.make_tensor_type_proto(elem, list(value.shape))
            if value.size <= _DATA_FOR_INFERENCE:
                data[name] = numpy_helper.from_array(value, name)
        opsets = {"": default_opset or opset, node.domain: opset}
        outs = onnx.shape_inference.infer_node_outputs(
            schema, node, types, data, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    except Exception:  # noqa: BLE001 - a node inference rejects (bad attribute, unknown dtype): not folded
        return _bounded_by_inputs(node, inputs)
    total = 0
    for name in node.output:
        if not name:
            continue
        t = outs.get(name)
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            return _bounded_by_inputs(node, inputs)
        dims = t.tensor_type.shape.dim
        if not all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
            return _bounded_by_inputs(node, inputs)
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type).itemsize
        except (KeyError, ValueError, TypeError):
            return None
        total += math.prod(d.dim_value for d in dims) * itemsize
    return total


def _bounded_by_inputs(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> int | None:
    """For ops whose output size depends on the data but is bounded by the inputs: that bound."""
    present = [v for v in inputs if v is not None]
    if not present:
        return None
    x = present[0]
    if node.op_type == "NonZero":
        return max(x.ndim, 1) * x.size * 8
    if node.op_type in ("Unique", "Compress"):
        return x.size * (x.itemsize + 3 * 8)
    return None


def evaluate(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """Run one node with the ONNX reference implementation."""
    names = [n for n in node.input]
    feeds = {n: v for n, v in zip(names, inputs) if n and v is not None}
    evaluator = ReferenceEvaluator(node, opsets={"": opset})
    return [np.asarray(v) for v in evaluator.run(None, feeds)]
