"""ONNX ops with no ATen counterpart: ops of the ``onnx`` namespaces, run by the ONNX reference.

An ONNX node the ATen converters cannot express becomes ``onnx.<OpType>.default`` (domain
``ai.onnx.ml`` -> ``onnx_ml``, ...) with its ONNX attributes as ``attrs`` plus ``opset`` (the
version whose semantics apply), ``num_outputs`` and, when an optional input is absent,
``input_slots`` (the positions of the inputs present; ``output_slots`` likewise). A tensor
attribute is stored as ``["tensor", dtype, shape, flat values]``. Its registered reference implementation
rebuilds the single ONNX node and runs it with ``onnx.reference``, the specification's executable
form, so the IR executes wherever ONNX defines the op. One such op is registered
per ONNX op type, on demand (``ensure_registered``; ``register_onnx_ops(ir)`` for a loaded IR).

These attributes come from an IR file, which is untrusted: the slots and counts are checked, a tensor
attribute may only be of a numeric dtype, and the size of every output is computed (ONNX shape
inference on the actual inputs) and checked against ``torch_ir.limits`` before the op runs.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import onnx
import torch
from onnx.reference import ReferenceEvaluator

from torch_ir import dtypes

from ...errors import IRValidationError
from ...ir import NPU_IR
from ...limits import check_alloc
from ...ops.registry import register_op, registered_ops
from .context import np_dtype_name
from .dtypes import to_numpy, to_torch
from .fold import output_nbytes

_DOMAINS = {"": "onnx", "ai.onnx.ml": "onnx_ml", "ai.onnx.preview": "onnx_preview",
            "ai.onnx.preview.training": "onnx_preview_training"}
#: Most outputs / input positions an ``onnx.*`` node may declare.
MAX_SLOTS = 1 << 12
#: The dtypes a tensor attribute may have (``reference_node`` stores only these): numpy's own real types.
ATTRIBUTE_DTYPES = frozenset(d.name for d in dtypes.DTYPES.values() if d.numpy_native and d.kind != "complex")


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
    where = f"op {op_type_for(domain, op)}"
    _check_slots(where, opset, num_outputs, input_slots, output_slots, len(inputs))
    outs = output_slots if output_slots is not None else list(range(num_outputs))
    slots = input_slots if input_slots is not None else list(range(len(inputs)))
    names = [""] * (max(slots) + 1 if slots else 0)
    feeds = {}
    for slot, value in zip(slots, inputs):
        names[slot] = f"in{slot}"
        feeds[names[slot]] = to_numpy(value)
    try:
        node = _node(domain, op, opset, tuple(names), tuple(outs), num_outputs, _freeze(attributes))
    except IRValidationError:
        raise
    except Exception as e:  # noqa: BLE001 - no such op or opset, an attribute the op does not have
        raise IRValidationError(f"{where} (opset {opset}): the node cannot be built from its attributes "
                                f"({type(e).__name__}: {str(e)[:200]})") from None
    nbytes = output_nbytes(node, [feeds.get(n) for n in names], opset, 21 if domain else None)
    if nbytes is not None:  # before running: the outputs' sizes follow from the inputs and attributes
        check_alloc(nbytes, f"the outputs of {where}")
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


def _check_slots(where: str, opset: Any, num_outputs: Any, input_slots: Any, output_slots: Any, n_inputs: int) -> None:
    """The bookkeeping attributes of an ``onnx.*`` node (from a file) are small, in range and consistent."""
    def ints(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)

    problems = []
    if not isinstance(opset, int) or isinstance(opset, bool) or not 1 <= opset <= 1000:
        problems.append(f"opset={opset!r} is not an opset number")
    if not isinstance(num_outputs, int) or isinstance(num_outputs, bool) or not 1 <= num_outputs <= MAX_SLOTS:
        problems.append(f"num_outputs={num_outputs!r} is not an integer in 1..{MAX_SLOTS}")
    elif output_slots is not None and (not ints(output_slots) or sorted(set(output_slots)) != output_slots
                                       or any(not 0 <= s < num_outputs for s in output_slots)):
        problems.append(f"output_slots={output_slots!r} are not increasing positions below num_outputs")
    if input_slots is not None and (not ints(input_slots) or sorted(set(input_slots)) != input_slots
                                    or any(not 0 <= s < MAX_SLOTS for s in input_slots)
                                    or len(input_slots) != n_inputs):
        problems.append(f"input_slots={input_slots!r} are not {n_inputs} increasing positions below {MAX_SLOTS}")
    if problems:
        raise IRValidationError(f"{where}: " + "; ".join(problems))


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
        if dtype not in ATTRIBUTE_DTYPES or not isinstance(flat, tuple) or not isinstance(shape, tuple) or not all(
                isinstance(d, int) and d >= 0 for d in shape) or math.prod(shape) != len(flat):
            raise IRValidationError(f"tensor attribute {str(value)[:80]}: expected ['tensor', a numeric dtype, "
                                    "a shape, as many values as the shape holds]")
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
