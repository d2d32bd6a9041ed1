"""The quantized residual add and product: ``QUANTIZE([relu](add(DEQUANTIZE(a), DEQUANTIZE(b))))`` -> ``QADD``,
``QUANTIZE(mul(DEQUANTIZE(a), DEQUANTIZE(b)))`` -> ``QMUL``.

A QDQ ResNet (onnxruntime's ``quantize_static``) leaves each residual add as two DEQUANTIZE, a float add (a ReLU
after it, where the quantizer kept one) and a QUANTIZE: four dispatches with float32 intermediates, as slow as all
the convolutions together on one thread. ``QADD`` computes the same float32 steps in one pass over the codes
(onnxruntime's QLinearAdd, an NPU's quantized elementwise add), so the rule is exact, not an approximation.

It applies when every scale and zero point is per tensor, the codes are int8/uint8, the inputs dequantize to float32
and broadcast to the output's shape as aten.add does (a QDQ transformer's bias add: its bias is uint8 codes of its
own scale, ``[N]`` against ``[..., N]``), and the DEQUANTIZE, add and ReLU outputs are read by nothing else (the
engine rejects a match whose interior is read elsewhere, with that reason); otherwise the chain stays.

A QDQ BERT's GELU multiplies two quantized tensors, ``x · (1 + erf(x/√2))``: ``QMUL`` is that product on the same
terms (onnxruntime's QLinearMul), without an activation. Its DEQUANTIZE of x is read by the erf chain too until that
chain becomes a table (``quantized_lut.py``); the engine tries the rule again once it has.
"""

from __future__ import annotations

from torch_ir.activations import ATEN_ACTIVATION_OPS, activation_of
from torch_ir.ir import OpNode
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import node
from .quantized import per_tensor_problem, zero_point

_DQ, _Q = "DEQUANTIZE", "QUANTIZE"
#: the code types QADD reads and writes (its CPU kernel's)
CODES = ("int8", "uint8")
_METHODS = ("divide", "multiply_inverse")


def _dq(name: str) -> Op:
    return Op(_DQ, Var(f"{name}_q"), exact_arity=False, name=f"dq_{name}")


_ADD = Op("aten.add.Tensor", _dq("a"), _dq("b"), name="op")
_MUL = Op("aten.mul.Tensor", _dq("a"), _dq("b"), name="op")


def _broadcasts(shape: list, to: list) -> bool:
    """Whether ``shape`` broadcasts to ``to`` (numpy rules: trailing dims align, 1 repeats), dims as the IR holds
    them (a symbolic dim only against itself)."""
    return len(shape) <= len(to) and all(d == t or d == 1 for d, t in zip(reversed(shape), reversed(to)))


def _check(m: Match) -> str | None:
    add, q = m.node("op"), m.node()
    op = "QMUL" if add.op_type == "aten.mul.Tensor" else "QADD"
    if add.attrs.get("alpha", 1) != 1:
        return f"the add has alpha={add.attrs['alpha']}"
    act = m.nodes.get("act")
    if act is not None and activation_of(act.op_type, act.attrs) != "relu":
        return f"{act.op_type} between the add and the QUANTIZE (QADD fuses relu only)"
    for name, what in (("dq_a", "first input"), ("dq_b", "second input")):
        dq = m.node(name)
        problem = per_tensor_problem(dq, what, CODES, op)
        if problem:
            return problem
        if dq.attrs.get("out_dtype", "float32") != "float32":
            return f"the {what} dequantizes to {dq.attrs['out_dtype']} ({op} computes in float32)"
        if not _broadcasts(list(dq.outputs[0].shape), list(q.outputs[0].shape)):
            return f"the {what} has shape {dq.outputs[0].shape}, which does not broadcast to {q.outputs[0].shape}"
    problem = per_tensor_problem(q, "output", CODES, op)
    if problem:
        return problem
    if q.attrs.get("qmin") is not None or q.attrs.get("qmax") is not None:
        return "the output is quantized to a narrowed range"
    if q.attrs.get("method", "divide") not in _METHODS or q.inputs[0].dtype != "float32":
        return f"the QUANTIZE reads {q.inputs[0].dtype} with method {q.attrs.get('method')!r}"
    return None


def _qadd(m: Match) -> list[OpNode]:
    q, da, db = m.node(), m.node("dq_a"), m.node("dq_b")
    new: list[OpNode] = []
    a_zp, b_zp = zero_point(m, da, new), zero_point(m, db, new)
    y_zp = zero_point(m, q, new)
    inputs = [da.inputs[0], da.inputs[1], a_zp, db.inputs[0], db.inputs[1], b_zp, q.inputs[1], y_zp]
    attrs = {"out_dtype": q.attrs["dtype"], "method": q.attrs.get("method", "divide")}
    if m.node("op").op_type == "aten.mul.Tensor":
        return [*new, node(m, "QMUL", inputs, attrs)]
    return [*new, node(m, "QADD", inputs, {**attrs, "activation": "relu" if "act" in m.nodes else None})]


RULES = [
    Rule("qdq_add", "quantized", Op(_Q, _ADD, exact_arity=False), _qadd, check=_check,
         doc="QUANTIZE(add(DEQUANTIZE(a), DEQUANTIZE(b))) -> QADD (a quantized residual add)"),
    Rule("qdq_add_relu", "quantized",
         Op(_Q, Op(ATEN_ACTIVATION_OPS, _ADD, name="act"), exact_arity=False), _qadd, check=_check,
         doc="QUANTIZE(relu(add(DEQUANTIZE(a), DEQUANTIZE(b)))) -> QADD(activation=relu)"),
    Rule("qdq_mul", "quantized", Op(_Q, _MUL, exact_arity=False), _qadd, check=_check,
         doc="QUANTIZE(mul(DEQUANTIZE(a), DEQUANTIZE(b))) -> QMUL (a quantized elementwise product)"),
]
