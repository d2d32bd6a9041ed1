"""Data movement on codes: ``QUANTIZE(move(DEQUANTIZE(q, s, zp)), s, zp)`` -> ``move(q)``.

A QDQ model quantizes the output of every reshape and transpose with the parameters of its input (onnxruntime's
quantizer propagates them), so a BERT attention block moves float32 values between a DEQUANTIZE and a QUANTIZE
of the same scale and zero point 16 times per layer: 32 elementwise passes over the activations and four float
transposes, where moving the one-byte codes computes the same thing.

Exact: with ``v = q - zp`` an integer of at most 16 bits and one per-tensor scale ``s``, DEQUANTIZE gives
``fl(v·s)`` and QUANTIZE ``round(fl(fl(v·s) / s))`` (or ``· fl(1 / s)``): within three roundings of ``v``, that is
a relative error under 2**-22, far below the half that would change the rounding, so QUANTIZE returns ``v + zp =
q``, inside the code range, unclamped. This holds for every scale whose products stay normal float32 numbers (any
scale a quantizer makes); onnxruntime's own QDQ optimizer drops these pairs the same way, for any scale, so the
result is onnxruntime's. The movement ops only place elements, whatever their type.

It applies when the DEQUANTIZE and the QUANTIZE are per tensor, read and write the same code type (8 or 16 bits,
not packed 4-bit codes, whose bytes hold two), share the scale and zero point (the same tensors, or constants of
equal value), the QUANTIZE does not narrow the range, and the DEQUANTIZE gives float32 (a 16-bit float would round
``v·s``). A DEQUANTIZE or movement read elsewhere stays for its other readers.
"""

from __future__ import annotations

from torch_ir.ir import OpNode, TensorMeta
from torch_ir.quant.spec import QTYPES
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import VIEWS, same_input
from .quantized import per_tensor_problem

#: ops that only place elements (any dtype): their output is some arrangement of their input's values (the kernel
#: table's views, and the reorderings and broadcast)
MOVEMENT_OPS = (*VIEWS, "aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.expand.default")
#: code types whose codes are whole elements (packed 4-bit ones are not)
CODES = ("int8", "uint8", "int16", "uint16")


def _check(m: Match) -> str | None:
    q, dq = m.node(), m.node("dq")
    problem = per_tensor_problem(dq, "DEQUANTIZE", CODES, "a move of codes") \
        or per_tensor_problem(q, "QUANTIZE", CODES, "a move of codes")
    if problem:
        return problem
    if dq.attrs["dtype"] != q.attrs["dtype"]:
        return f"the codes change type ({dq.attrs['dtype']} -> {q.attrs['dtype']})"
    if dq.attrs.get("out_dtype", "float32") != "float32" or q.inputs[0].dtype != "float32":
        return f"the values moved are {q.inputs[0].dtype}, not float32"
    lo, hi, _ = QTYPES[q.attrs["dtype"]]
    if q.attrs.get("qmin", lo) != lo or q.attrs.get("qmax", hi) != hi:
        return "the QUANTIZE narrows the code range"
    if len(q.inputs) != len(dq.inputs) or not all(same_input(m, a, b) for a, b in zip(q.inputs[1:], dq.inputs[1:])):
        return "the QUANTIZE's scale or zero point is not the DEQUANTIZE's"
    return None


def _moved(m: Match) -> list[OpNode]:
    q, move = m.node(), m.node("move")
    codes: TensorMeta = m["q"]
    return [OpNode(q.name, move.op_type, [codes, *move.inputs[1:]], list(q.outputs), dict(move.attrs))]


RULES = [
    Rule("qdq_movement", "quantized",
         Op("QUANTIZE", Op(MOVEMENT_OPS, Op("DEQUANTIZE", Var("q"), exact_arity=False, name="dq"), exact_arity=False,
                           name="move"), exact_arity=False),
         _moved, check=_check, shared_interior=True,
         doc="QUANTIZE(move(DEQUANTIZE(q))) with one scale and zero point -> move(q) (reshape, transpose, ... on "
             "codes)"),
]
