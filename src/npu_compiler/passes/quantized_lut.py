"""Quantized elementwise chains as tables: ``QUANTIZE(f_n(...f_1(DEQUANTIZE(x))))`` -> ``QLUT``.

A QDQ BERT (onnxruntime's ``quantize_static``) leaves its GELU as four QDQ chains (``erf(x · 0.7071)``, ``+ 1``,
the product with x, ``· 0.5``) and its attention scale as a fifth: each a DEQUANTIZE, float32 ops and a QUANTIZE,
three passes with float32 temporaries over tensors of up to 128 x 3072. Where the input is 8-bit codes with one
scale and zero point and every op between is a step of ``torch_ir.quant.lut`` (an elementwise function of one
tensor: arithmetic with a number, erf, tanh, sigmoid, an activation), the chain maps each of the 256 codes to one
code, so it is a table (``QLUT``), computed from the bound scales: one pass over bytes, as an NPU's lookup table.

It applies to chains of one to three steps whose values are float32, when the QUANTIZE does not narrow the code
range. The DEQUANTIZE may have other readers (GELU's x feeds the product too): it stays for them. A binary op (the
product of two dequantized tensors) is no step: that chain stays.
"""

from __future__ import annotations

from torch_ir.ir import OpNode
from torch_ir.quant import lut
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import node
from .quantized import per_tensor_problem, zero_point

#: the most steps a chain may have (one rule per length)
MAX_STEPS = 3
_METHODS = ("divide", "multiply_inverse")


def _chain(n: int) -> Op:
    inner = Op("DEQUANTIZE", Var("x"), exact_arity=False, name="dq")
    for k in range(1, n + 1):
        inner = Op(lut.STEP_OPS, inner, name=f"s{k}")
    return Op("QUANTIZE", inner, exact_arity=False)


def _steps(m: Match) -> list[OpNode]:
    return [m.node(f"s{k}") for k in range(1, MAX_STEPS + 1) if f"s{k}" in m.nodes]


def _check(m: Match) -> str | None:
    q, dq = m.node(), m.node("dq")
    problem = per_tensor_problem(dq, "input", lut.CODES, "QLUT") or per_tensor_problem(q, "output", lut.CODES, "QLUT")
    if problem:
        return problem
    if q.attrs.get("qmin") is not None or q.attrs.get("qmax") is not None:
        return "the output is quantized to a narrowed range"
    if q.attrs.get("method", "divide") not in _METHODS:
        return f"the QUANTIZE's method is {q.attrs.get('method')!r}"
    steps = _steps(m)
    for s in [dq, *steps]:
        if s.outputs[0].dtype != "float32":
            return f"{s.op_type} gives {s.outputs[0].dtype} (a table's chain runs in float32)"
    for s in steps:
        if lut.step_of(s.op_type, s.attrs) is None:
            return f"{s.op_type} with {s.attrs} is no table step (a tensor operand, alpha, rounding_mode)"
    return None


def _qlut(m: Match) -> list[OpNode]:
    q, dq = m.node(), m.node("dq")
    steps = [lut.step_of(s.op_type, s.attrs) for s in _steps(m)]
    new: list[OpNode] = []
    x_zp, y_zp = zero_point(m, dq, new), zero_point(m, q, new)
    attrs = {"functions": " ".join(name for name, _ in steps),
             "numbers": [number for _, number in steps if number is not None],
             "out_dtype": q.attrs["dtype"], "method": q.attrs.get("method", "divide")}
    return [*new, node(m, "QLUT", [dq.inputs[0], dq.inputs[1], x_zp, q.inputs[1], y_zp], attrs)]


RULES = [
    Rule(f"qdq_lut{n}", "quantized", _chain(n), _qlut, check=_check, shared_interior=True,
         doc=f"QUANTIZE({n} elementwise step{'s' * (n > 1)}(DEQUANTIZE(x))) -> QLUT (a table over the "
             f"{'/'.join(lut.CODES)} codes)")
    for n in range(MAX_STEPS, 0, -1)  # the longest chain first: a shorter one would leave a step behind
]
