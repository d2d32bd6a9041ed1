"""The fallback for ONNX nodes no ATen converter takes: an op of the ``onnx`` namespace.

The node keeps its ONNX meaning exactly: its attributes, the opset whose semantics apply and the
output types ONNX shape inference gave. Its implementation (``custom_ops.py``) runs the ONNX
reference. Nodes with subgraphs (If, Loop, Scan) or outputs of unknown type cannot be kept so.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from ....ops.values import encode_value
from ..context import Ctx, UnsupportedNode, np_dtype_name
from ..custom_ops import ATTRIBUTE_DTYPES, ensure_registered


def reference_node(ctx: Ctx, node: onnx.NodeProto, inputs: list[Any], attrs: dict[str, Any], opset: int):
    """Emit ``onnx.<OpType>.default`` for ``node``; returns its outputs."""
    outputs = list(node.output)
    present = [o for o in outputs if o]
    types = [ctx.graph.types.get(o) for o in present]
    if any(t is None or not t.type.tensor_type.HasField("shape") for t in types):
        raise UnsupportedNode("ONNX shape inference gives no tensor type for an output")
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        raise UnsupportedNode(f"ONNX defines no op {node.op_type!r} in domain {node.domain!r}") from None
    encoded = {k: _encode_attribute(k, v) for k, v in attrs.items()}
    encoded["opset"] = schema.since_version
    encoded["num_outputs"] = len(outputs)
    if len(present) != len(outputs):
        encoded["output_slots"] = [i for i, o in enumerate(outputs) if o]
    slots = [i for i, v in enumerate(inputs) if v is not None]
    if len(slots) != len(inputs):
        encoded["input_slots"] = slots
    metas = [ctx.graph.meta_of(t, "activation") for t in types]
    tensors = [ctx.tensor(v) for v in inputs if v is not None]
    return tuple(ctx.custom(ensure_registered(node.domain, node.op_type), tensors, encoded, metas))


def _encode_attribute(name: str, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        dtype = np_dtype_name(value)
        if dtype not in ATTRIBUTE_DTYPES:
            raise UnsupportedNode(f"attribute {name!r} is a {dtype} tensor, which IR attributes cannot hold")
        return ["tensor", dtype, list(value.shape), encode_value(value.reshape(-1).tolist())]
    if isinstance(value, list) and value and not isinstance(value[0], (int, float, str)):
        raise UnsupportedNode(f"attribute {name!r} holds graphs or tensors (control flow has no IR form yet)")
    if not isinstance(value, (int, float, str, list)):
        raise UnsupportedNode(f"attribute {name!r} is a {type(value).__name__} (a subgraph or a type)")
    return encode_value(value)
