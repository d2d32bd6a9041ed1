"""The one generator of every elementwise kernel: its record's ``wgsl`` expression, broadcast over the output.

An elementwise record of ``npu_program.kernels`` carries its WGSL as an expression of ``x0``, ``x1``, ...
and its parameters ``{name}`` (``{name=default}`` where the parameter may be absent). ``x<k>`` is the op's
k-th argument: of an ATen op, the k-th argument of its schema, read from the next input tensor or, where
the IR folded a constant into the node's attributes (``mul.Tensor`` by 2.0), that constant; of an NPU op,
its k-th input. Operands are loaded as the computation type (f32 when any operand or the output is
floating, else i32); a bool output stores ``bool(expression)``. Operands broadcast to the output's shape
(numpy rules), each in its own layout, so an NHWC activation plus a per-channel bias is one pass.
"""

from __future__ import annotations

import re
from functools import cache

from torch_ir.ops.registry import resolve_overload

from .wgsl import (
    FLOAT_DTYPES,
    Call,
    Shader,
    UnsupportedCall,
    compute_type,
    literal,
    numel,
    offset,
    per_element,
    shape_of,
    substitute,
    unravel,
)


def elementwise(call: Call) -> Shader:
    template = call.record.wgsl
    if template is None:
        raise UnsupportedCall(f"{call.record.name} has no wgsl expression in its record")
    out = call.outs[0]
    floating = any(s.dtype in FLOAT_DTYPES for s in (*call.ins, out)) or any(
        isinstance(v, float) for v in call.params.values())
    t = "f32" if floating else "i32"
    scalars = {k: v for k, v in call.params.items() if isinstance(v, (int, float, str))}
    scalars["out_bool"] = "true" if out.dtype == "bool" else "false"
    expr = substitute(template, scalars, t)
    shape = shape_of(out)
    idx = [f"d{k}" for k in range(len(shape))]
    loads = []
    for k, source in enumerate(_operands(call)):
        if not re.search(rf"\bx{k}\b", expr):
            continue
        if isinstance(source, int):
            spec = call.ins[source]
            if len(shape_of(spec)) > len(shape):
                raise UnsupportedCall(f"input {source} has more dims than the output")
            loads.append(f"let x{k} = {t}(ld_in{source}({offset(spec, idx, shape)}));")
        else:
            value = call.params.get(source)
            if not isinstance(value, (int, float)):
                raise UnsupportedCall(f"argument {source!r} is {value!r}, not a number")
            loads.append(f"let x{k} = {literal(value, t)};")
    value = f"select(0, 1, bool({expr}))" if out.dtype == "bool" else f"{compute_type(out.dtype)}({expr})"
    body = "\n  ".join([unravel("i", shape), *loads, f"st_out0({offset(out, idx)}, {value});"])
    return per_element(call, numel(out), body)


def _operands(call: Call) -> list[int | str]:
    """Per argument of the op: the input it is read from (its index), or the attribute holding it."""
    names = _schema_arguments(call.record.name)
    if names is None:
        return list(range(len(call.ins)))
    sources: list[int | str] = []
    cursor = 0
    for name in names:
        if name in call.params:
            sources.append(name)
        else:
            sources.append(cursor)
            cursor += 1
    return sources


@cache
def _schema_arguments(op: str) -> tuple[str, ...] | None:
    """The argument names of an ATen op's schema (None for an NPU op: its inputs are its operands)."""
    overload = resolve_overload(op) if op.startswith("aten.") else None
    return None if overload is None else tuple(a.name for a in overload._schema.arguments)
