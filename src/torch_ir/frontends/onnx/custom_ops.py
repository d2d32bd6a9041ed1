"""ONNX ops with no ATen counterpart: ops of the ``onnx`` namespaces, run by the ONNX reference.

An ONNX node the ATen converters cannot express becomes ``onnx.<OpType>.default`` (domain
``ai.onnx.ml`` -> ``onnx_ml``, ...) with its ONNX attributes as ``attrs`` plus ``opset`` (the
version whose semantics apply), ``num_outputs`` and, when an optional input is absent,
``input_slots`` (the positions of the inputs present; ``output_slots`` likewise). A tensor
attribute is stored as ``["tensor", dtype, shape, flat values]``. Its registered reference implementation
rebuilds the single ONNX node and runs it with ``onnx.reference``, the specification's executable
form, so the IR executes wherever ONNX defines the op. One such op is registered
per ONNX op type, on demand (``ensure_registered``; ``register_onnx_ops(ir)`` for a loaded IR).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
import torch
from onnx.reference import ReferenceEvaluator

from ...ir import NPU_IR
from ...ops.registry import register_op, registered_ops
from .context import np_dtype_name
from .dtypes import to_numpy, to_torch

_DOMAINS = {"": "onnx", "ai.onnx.ml": "onnx_ml", "ai.onnx.preview": "onnx_preview",
            "ai.onnx.preview.training": "onnx_preview_training"}
_META_KEYS = ("opset", "num_outputs", "input_slots")


def op_type_for(domain: str, op: str) -> str:
    """The IR op type of ONNX op ``op`` of ``domain``.

    Example::

        >>> op_type_for("ai.onnx.ml", "TreeEnsemble")
        'onnx_ml.TreeEnsemble.default'
    """
    return f"{_DOMAINS['' if domain == 'ai.onnx' else domain]}.{op}.default"


def run_reference(domain: str, op: str, *inputs: torch.Tensor, opset: int, num_outputs: int = 1,
                  input_slots: list[int] | None = None, output_slots: list[int] | None = None,
                  **attributes: Any) -> tuple[torch.Tensor, ...]:
    """Run ONNX op ``op`` at ``opset`` on ``inputs`` with the ONNX reference implementation."""
    outs = output_slots if output_slots is not None else list(range(num_outputs))
    slots = input_slots if input_slots is not None else list(range(len(inputs)))
    names = [""] * (max(slots) + 1 if slots else 0)
    feeds = {}
    for slot, value in zip(slots, inputs):
        names[slot] = f"in{slot}"
        feeds[names[slot]] = to_numpy(value)
    node = _node(domain, op, opset, tuple(names), tuple(outs), num_outputs, _freeze(attributes))
    evaluator = _evaluator(node, domain, opset)
    results = evaluator.run([f"out{i}" for i in outs], feeds)
    return tuple(to_torch(np.asarray(r), np_dtype_name(np.asarray(r))) for r in results)


@functools.lru_cache(maxsize=256)
def _node(domain: str, op: str, opset: int, names: tuple[str, ...], outs: tuple[int, ...], num_outputs: int,
          frozen: tuple) -> Any:
    schema = onnx.defs.get_schema(op, opset, domain)
    attrs = [onnx.helper.make_attribute(k, _thaw(v), attr_type=schema.attributes[k].type) for k, v in frozen]
    outputs = [f"out{i}" if i in outs else "" for i in range(num_outputs)]
    node = onnx.helper.make_node(op, list(names), outputs, domain=domain or None)
    node.attribute.extend(attrs)
    return node


def _evaluator(node: onnx.NodeProto, domain: str, opset: int) -> ReferenceEvaluator:
    opsets = {"": opset} if not domain else {domain: opset, "": 21}
    return ReferenceEvaluator(node, opsets=opsets)


def _freeze(attrs: dict[str, Any]) -> tuple:
    """Attributes as a hashable key (for the node cache); lists become tuples."""
    def freeze(v: Any) -> Any:
        return tuple(freeze(x) for x in v) if isinstance(v, list) else v
    return tuple(sorted((k, freeze(v)) for k, v in attrs.items()))


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "tensor":
        _, dtype, shape, flat = value
        return onnx.numpy_helper.from_array(np.array(flat, dtype=dtype).reshape(shape))
    return list(value) if isinstance(value, tuple) else value


def ensure_registered(domain: str, op: str) -> str:
    """Register the reference implementation of ONNX op ``op`` (once); returns its IR op type.

    Registration is per op and on demand, so the registry (and the operator docs generated from
    it) only holds the ONNX ops an imported graph actually kept.
    """
    op_type = op_type_for(domain, op)
    if op_type not in registered_ops():
        impl = functools.partial(run_reference, "" if domain == "ai.onnx" else domain, op)
        register_op(op_type, doc=f"ONNX {domain or 'ai.onnx'}::{op}, run by onnx.reference")(impl)
    return op_type


def provide(op_type: str) -> bool:
    """The registry's hook: register ``onnx.<Op>.default`` (and the other ONNX namespaces) on first use."""
    ns, _, rest = op_type.partition(".")
    domain = {n: d for d, n in _DOMAINS.items()}.get(ns)
    if domain is None or not rest.endswith(".default"):
        return False
    ensure_registered(domain, rest.rsplit(".", 1)[0])
    return True


def register_onnx_ops(ir: NPU_IR) -> list[str]:
    """Register the implementations of the ``onnx.*`` ops ``ir`` uses, ahead of time.

    Not needed before executing: the registry registers them on first use through ``provide``.

    Example::

        ir = load_ir("model.json")
        register_onnx_ops(ir)
        IRExecutor(ir, "model.safetensors").run([x])
    """
    by_namespace = {ns: domain for domain, ns in _DOMAINS.items()}
    done = []
    for node in ir.nodes:
        ns, _, rest = node.op_type.partition(".")
        if ns in by_namespace:
            done.append(ensure_registered(by_namespace[ns], rest.rsplit(".", 1)[0]))
    return sorted(set(done))
