"""The generators of the ATen matrix products: mm, bmm, matmul (torch.matmul's broadcasting, 1-D operands
included) and baddbmm."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..wgsl import Call, Shader, UnsupportedCall, literal, shape_of
from .kernel import run
from .operands import Contraction, _compute_type, _number, _offset, _tensor_load


def _product(call: Call, first: int) -> tuple[Contraction, list[tuple[str, Sequence[int]]]]:
    """torch.matmul of inputs ``first`` and ``first + 1`` (1-D operands, broadcast batch dims), its epilogue
    left to the caller; also the output's parts."""
    t = _compute_type(call)
    a_spec, b_spec = call.ins[first], call.ins[first + 1]
    a, b, out = shape_of(a_spec), shape_of(b_spec), shape_of(call.outs[0])
    if not a or not b:
        raise UnsupportedCall("matmul of a 0-d tensor")
    m, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    n = 1 if len(b) == 1 else b[-1]
    if (b[0] if len(b) == 1 else b[-2]) != k:
        raise UnsupportedCall(f"matmul of shapes {a} and {b}")
    if len(b) <= 2 and len(a) > 2:  # B is one matrix: x's batch dims are rows (a GEMM, GEMV-able)
        lead, batch = a[:-1], []
        la = _tensor_load(call, first, t, [("r", lead), ("k", [k])], len(a) - 1, k)
    else:
        batch = out[:len(out) - (len(a) > 1) - (len(b) > 1)]
        lead = [m] if len(a) > 1 else []
        la = _tensor_load(call, first, t, [("b", batch), ("r", lead), ("k", [k])], len(a) - 1, k)
    if len(b) == 1:
        lb = _tensor_load(call, first + 1, t, [("b", batch), ("k", [k]), ("r", [])], 0, k)
    else:
        lb = _tensor_load(call, first + 1, t, [("b", batch), ("k", [k]), ("r", [n])], len(b) - 2, k)
    parts = [("b", batch), ("m", lead), ("n", [n] if len(b) > 1 else [])]
    rows = math.prod(lead) if len(a) > 2 and len(b) <= 2 else m
    return Contraction(t, math.prod(batch), rows, n, k, la, [lb], ""), parts


def matmul(call: Call) -> Shader:
    """aten.mm, aten.bmm and aten.matmul (torch.matmul's broadcasting, 1-D operands included)."""
    c, parts = _product(call, 0)
    c.epilogue = f"st_out0({_offset(call.outs[0], parts)}, v0);"
    return run(call, c)


def baddbmm(call: Call) -> Shader:
    """aten.baddbmm: beta · self + alpha · (batch1 @ batch2), self broadcast to the output."""
    c, parts = _product(call, 1)
    beta, alpha = _number(call.param("beta", 1), "beta"), _number(call.param("alpha", 1), "alpha")
    v = f"{literal(alpha, c.t)} * v0"
    if beta != 0:  # torch ignores self when beta is 0 (a NaN in it does not propagate)
        v = f"{literal(beta, c.t)} * {c.t}(ld_in0({_offset(call.ins[0], parts)})) + {v}"
    c.epilogue = f"st_out0({_offset(call.outs[0], parts)}, {v});"
    return run(call, c)
