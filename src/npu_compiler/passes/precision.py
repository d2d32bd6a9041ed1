"""The compute dtype chosen at compile time: a float IR retyped to bf16, fp16 or fp32 (``CompileOptions.precision``).

Run on a normalized IR (``compile`` does, before kernel fusion), it gives every floating tensor of the graph
(activations, weights, constants, state) the precision's dtype, as OpenVINO's inference precision hint or
``model.to(torch.bfloat16)`` would, with two exceptions that keep the model's interface and intent:

* **The program's inputs and outputs keep their dtypes.** A float input is cast once, by a ``_to_copy`` node right
  after it, and a float output is the cast of the value computed in the precision, so a caller's float32 arrays
  and the code reading the outputs do not change.
* **float64 stays float64**: a model computing something in double did so on purpose.
* **What is computed from integers and the model's config alone stays float32** (positions made float, a rotary
  ``inv_freq``, a filled mask), as PyTorch's autocast leaves it: position 257 is not a bf16 number. Such a value is
  rounded once, by a ``_to_copy`` node, where an op reads it beside the precision's values.

A model with state (a KV cache) is refused: its build chooses its dtype (``load_lm(dtype=...)``).

The weights file is not rewritten: the program's weight slots have the precision's dtype and
``metadata["precision"]["weights"]`` names the slots cast from another float dtype, which ``npu_runtime.load_weights``
then rounds (to nearest even) as it binds them. The kernels accumulate as their records say (``kernel_record``:
fp32 accumulation for the bf16/fp16 contractions and reductions of the CPU backend).

A quantized IR is refused: its float tensors are scales and dequantized values whose widths the quantization fixed
(``torch_ir.quant``), and casting them would change the integer results.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch_ir.ir import NPU_IR, OpNode, Provenance, TensorMeta, check_integrity

from ..errors import CompileError

#: ``CompileOptions.precision`` -> the IR dtype it computes in (the one place the accepted names are listed).
PRECISIONS: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: The float dtypes the cast retypes (float64 is kept: see the module docstring).
CAST_FROM = frozenset({"float32", "bfloat16", "float16"})
RULE = "precision"
CAST_OP = "aten._to_copy.default"


def precision_dtype(precision: str | None) -> str | None:
    """The IR dtype of ``precision`` (None: the IR's own); raises ``CompileError`` for another name."""
    if precision is None:
        return None
    if precision not in PRECISIONS:
        raise CompileError(f"precision={precision!r}: choose one of {', '.join(map(repr, PRECISIONS))} (the compute "
                           "dtype of a float model), or None to keep the IR's dtypes")
    return PRECISIONS[precision]


def cast_precision(ir: NPU_IR, precision: str) -> NPU_IR:
    """``ir`` computing in ``precision`` (see the module docstring); the input IR is not modified. The new IR's
    ``metadata["precision"]`` says what was done: ``{"precision", "dtype", "weights": {slot: old dtype}}``."""
    dtype = precision_dtype(precision)
    _refuse(ir, precision)
    cast = _lowered(ir, dtype)
    if not cast:
        return dataclasses.replace(ir, metadata={**ir.metadata, "precision": _record(precision, dtype, {})})
    boundary = {t.name for t in (*ir.graph_inputs, *ir.graph_outputs)}  # they keep their dtypes
    taken = {t.name for t in ir.tensors()} | {n.name for n in ir.nodes}
    renames = {name: _fresh(taken, f"{name}_{precision}") for name in sorted(boundary & cast.keys())}
    copies: dict[int, TensorMeta] = {}  # one copy per tensor object: a value shared by its uses stays shared

    def retyped(t: TensorMeta) -> TensorMeta:
        if t.name not in cast:
            return t
        if id(t) not in copies:
            copies[id(t)] = dataclasses.replace(t, name=renames.get(t.name, t.name), dtype=dtype)
        return copies[id(t)]

    inputs = [t for t in ir.graph_inputs if t.name in renames]
    nodes = [_cast_node(t, retyped(t), "input") for t in inputs]
    rounded: dict[str, TensorMeta] = {}  # a float32 value met by the precision's: its one rounded copy
    for node in ir.nodes:
        casts, node = _round_precise_inputs(_retyped_node(node, retyped, cast, dtype), dtype, rounded, taken)
        nodes += [*casts, node]
    outputs = [t for t in ir.graph_outputs if t.name in renames and t.name not in {i.name for i in inputs}]
    nodes += [_cast_node(retyped(t), t, "output") for t in outputs]
    weights_cast = {w.name: cast[w.name] for w in ir.weights if w.name in cast}
    new = dataclasses.replace(
        ir, nodes=nodes, weights=[retyped(w) for w in ir.weights], constants=[retyped(c) for c in ir.constants],
        metadata={**ir.metadata, "precision": _record(precision, dtype, weights_cast)})
    check_integrity(new, source=f"IR {ir.model_name!r} cast to {precision}")
    return new


def _lowered(ir: NPU_IR, dtype: str) -> dict[str, str]:
    """The float tensors that compute in ``dtype`` (name -> their dtype now, for those not in it yet): the model's
    float inputs and its weights and constants, and every float result of a node reading one of them. What is
    computed from integers and the model's config alone (positions made float, a rotary ``inv_freq``, a mask
    filled with a constant) stays as it is, as PyTorch's autocast leaves it: a position past 256 is not a bf16
    number. Such a value is rounded once, where it meets the precision's values (``_round_precise_inputs``)."""
    buffers = {w.name for w in ir.weights if ir.weight_name_mapping.get(w.name, w.name) in ir.non_persistent_buffers}
    sources = [*ir.graph_inputs, *(w for w in ir.weights if w.name not in buffers), *ir.constants]
    low = {t.name: t.dtype for t in sources if t.dtype in CAST_FROM}
    for node in ir.nodes:
        if any(t.name in low for t in node.inputs):
            low.update({t.name: t.dtype for t in node.outputs if t.dtype in CAST_FROM})
    return {name: old for name, old in low.items() if old != dtype}


def _round_precise_inputs(node: OpNode, dtype: str, rounded: dict[str, TensorMeta],
                          taken: set[str]) -> tuple[list[OpNode], OpNode]:
    """When ``node`` computes in ``dtype`` but also reads float values kept in another dtype: the cast nodes rounding
    them (one per value, shared by its later readers) and ``node`` reading the rounded copies."""
    floats = [t for t in node.inputs if t.dtype in CAST_FROM]
    if not any(t.dtype == dtype for t in floats) or all(t.dtype == dtype for t in floats):
        return [], node
    casts: list[OpNode] = []
    inputs = list(node.inputs)
    for i, t in enumerate(inputs):
        if t.dtype in CAST_FROM and t.dtype != dtype:
            if t.name not in rounded:
                rounded[t.name] = dataclasses.replace(t, name=_fresh(taken, f"{t.name}_{RULE}"), dtype=dtype)
                casts.append(_cast_node(t, rounded[t.name], "value"))
            inputs[i] = rounded[t.name]
    return casts, dataclasses.replace(node, inputs=inputs, provenance=_tagged(node.provenance))


def _refuse(ir: NPU_IR, precision: str) -> None:
    """A quantized model (its float tensors are scales), or one with state (a KV cache, whose dtype the model's own
    build chooses: ``load_lm(dtype=...)``)."""
    if ir.mutations:
        raise CompileError(
            f"IR {ir.model_name!r}: precision={precision!r} casts a stateless float model, but this one writes state "
            f"({', '.join(sorted(ir.mutations)[:3])}); build the model in the dtype instead (an LLM: "
            "load_lm(dtype=...), torch-ir generate --dtype) and compile it without a precision")
    quantized = sorted({n.op_type for n in ir.nodes if _is_quantized(n)})
    if quantized:
        raise CompileError(
            f"IR {ir.model_name!r}: precision={precision!r} casts a float model, but this one is quantized "
            f"({', '.join(quantized[:4])}); its float tensors are scales and dequantized values whose widths the "
            "quantization fixed. Compile it without a precision (torch-ir compile without --precision)")


def _is_quantized(node: OpNode) -> bool:
    return any(t.quant is not None for t in (*node.inputs, *node.outputs)) or "quantize" in node.op_type.lower()


def _retyped_node(node: OpNode, retyped: Any, cast: dict[str, str], dtype: str) -> OpNode:
    if not any(t.name in cast for t in (*node.inputs, *node.outputs)):
        return node
    attrs = dict(node.attrs)
    # an explicit float cast (the model's own .to(float32)) now casts to the precision, like every other float
    if isinstance(attrs.get("dtype"), dict) and attrs["dtype"].get("dtype") in CAST_FROM:
        attrs["dtype"] = {"dtype": dtype}
    return dataclasses.replace(node, inputs=[retyped(t) for t in node.inputs],
                               outputs=[retyped(t) for t in node.outputs], attrs=attrs,
                               provenance=_tagged(node.provenance))


def _cast_node(src: TensorMeta, dst: TensorMeta, where: str) -> OpNode:
    """``dst = src.to(dst.dtype)``: the cast of a program input (or a float32 value) into the precision, or of a
    result out of it."""
    return OpNode(name=f"{RULE}_{where}_{dst.name}", op_type=CAST_OP, inputs=[src], outputs=[dst],
                  attrs={"dtype": {"dtype": dst.dtype}},
                  provenance=Provenance(nodes=[], origin=f"precision: the program's {where} in its own dtype",
                                        rules=[RULE]))


def _tagged(provenance: Provenance | None) -> Provenance | None:
    if provenance is None or RULE in provenance.rules:
        return provenance
    return dataclasses.replace(provenance, rules=[*provenance.rules, RULE])


def _fresh(taken: set[str], name: str) -> str:
    """``name``, or ``name_1``, ``name_2``, ... when a tensor or node has it; the one returned is taken then."""
    out, i = name, 1
    while out in taken:
        out, i = f"{name}_{i}", i + 1
    taken.add(out)
    return out


def _record(precision: str, dtype: str, weights: dict[str, str]) -> dict[str, Any]:
    return {"precision": precision, "dtype": dtype, "weights": dict(sorted(weights.items()))}


__all__ = ["CAST_FROM", "PRECISIONS", "cast_precision", "precision_dtype"]
