"""Views (when dispatched), permute, expand, copy and fill: each output element from one source element, or
a constant."""

from __future__ import annotations

import math

from ..wgsl import (
    FLOAT_DTYPES,
    Call,
    Shader,
    UnsupportedCall,
    literal,
    move,
    numel,
    offset,
    per_element,
    shape_of,
    unravel,
)
from .common import check_broadcast, check_shape, copy_from, indices, ints_param, norm_dim, number, per_output


def reshape(call: Call) -> Shader:
    """Every view kernel and clone / contiguous: element i of the output in row-major order is element i of
    the input in row-major order (each read and written in its own layout)."""
    src, out = call.ins[0], call.outs[0]
    if numel(src) != numel(out):
        raise UnsupportedCall(f"a view of {numel(src)} elements as {shape_of(out)}")
    dst = offset(out, indices(len(shape_of(out))))
    return per_output(call, [unravel("i", shape_of(src), "s"),
                             move(call, 0, offset(src, indices(len(shape_of(src)), "s")), dst)])


def permute(call: Call) -> Shader:
    rank = len(shape_of(call.ins[0]))
    dims = [norm_dim(d, rank) for d in ints_param(call, "dims")]
    if sorted(dims) != list(range(rank)):
        raise UnsupportedCall(f"dims {dims} are not a permutation of {rank} dims")
    check_shape(call.outs[0], [shape_of(call.ins[0])[d] for d in dims], "permute")
    src = [""] * rank
    for k, d in enumerate(dims):  # output dim k is input dim dims[k]
        src[d] = f"d{k}"
    return copy_from(call, src)


def expand(call: Call) -> Shader:
    """The input broadcast to the output's shape (size-1 and missing leading dims repeat)."""
    out_shape = shape_of(call.outs[0])
    check_broadcast(call.ins[0], out_shape, "expand")
    k = len(shape_of(call.ins[0]))
    return copy_from(call, indices(len(out_shape))[len(out_shape) - k:] if k else [])


def copy(call: Call) -> Shader:
    """copy.default: src (input 1) broadcast into self's shape and converted to self's dtype."""
    out_shape = shape_of(call.outs[0])
    src = call.ins[1]
    dst = offset(call.outs[0], indices(len(out_shape)))
    check_shape(call.outs[0], shape_of(call.ins[0]), "copy")
    check_broadcast(src, out_shape, "copy")
    return per_output(call, [move(call, 1, offset(src, indices(len(out_shape)), out_shape), dst)])


def full(call: Call) -> Shader:
    """A fill of ``fill_value`` in the output's dtype (an int64 fill writes both words: any int64 value)."""
    out = call.outs[0]
    value = number(call.params.get("fill_value"), "fill_value")
    if out.dtype in FLOAT_DTYPES:
        return per_element(call, numel(out), f"st_out0(i, {literal(value)});")
    if isinstance(value, float) and not math.isfinite(value):
        raise UnsupportedCall(f"fill_value {value} in an integer dtype")
    if out.dtype == "bool":
        return per_element(call, numel(out), f"st_out0(i, {int(value != 0)});")
    v = int(value)  # torch truncates a float fill of an integer tensor toward zero
    if out.dtype == "int64":
        v &= (1 << 64) - 1
        lo, hi = v & 0xFFFFFFFF, v >> 32
        return per_element(call, numel(out),
                           f"out0[2u * i] = bitcast<i32>({lo}u); out0[2u * i + 1u] = bitcast<i32>({hi}u);")
    bits = {"int32": 32, "int8": 8, "uint8": 8}.get(out.dtype, 32)
    v &= (1 << bits) - 1  # wrapped to the dtype as torch's cast wraps, then as the i32 st_ takes it
    if out.dtype != "uint8" and v >= 1 << (bits - 1):
        v -= 1 << bits
    return per_element(call, numel(out), f"st_out0(i, {literal(v, 'i32')});")
