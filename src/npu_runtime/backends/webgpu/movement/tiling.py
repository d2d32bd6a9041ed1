"""Repeats, padding, rolls and flips: each output index maps to a source index by a modulo, a reflection, a
clamp or a reversal."""

from __future__ import annotations

import math

from ..wgsl import FLOAT_DTYPES, Call, Shader, UnsupportedCall, literal, move, numel, offset, shape_of, unravel
from .common import check_shape, copy_from, indices, int_param, ints_param, norm_dim, number, per_output, with_dim


def repeat(call: Call) -> Shader:
    """The input tiled ``repeats`` times per dim (repeats may add leading dims)."""
    shape = shape_of(call.ins[0])
    repeats = ints_param(call, "repeats")
    if len(repeats) < len(shape):
        raise UnsupportedCall(f"repeats {repeats} has fewer dims than the input's {len(shape)}")
    lead = len(repeats) - len(shape)
    check_shape(call.outs[0], repeats[:lead] + [r * s for r, s in zip(repeats[lead:], shape)], "repeat")
    return copy_from(call, [f"(d{lead + k} % {s}u)" for k, s in enumerate(shape)])


def repeat_interleave(call: Call) -> Shader:
    """repeat_interleave.self_int: each index along dim repeated ``repeats`` times (dim None: of the
    flattened input)."""
    shape = shape_of(call.ins[0])
    repeats = int_param(call, "repeats")
    if repeats < 1:
        if numel(call.outs[0]) == 0:
            return per_output(call, [])
        raise UnsupportedCall(f"repeats {repeats}")
    if call.params.get("dim") is None:
        check_shape(call.outs[0], [numel(call.ins[0]) * repeats], "repeat_interleave")
        return copy_from(call, indices(len(shape), "s"), lines=[unravel(f"i / {repeats}u", shape, "s")])
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(call.outs[0], with_dim(shape, dim, shape[dim] * repeats) if shape else [repeats], "repeat_interleave")
    src = indices(len(shape))
    if src:
        src[dim] = f"(d{dim} / {repeats}u)"
    return copy_from(call, src)


def pad(call: Call) -> Shader:
    """pad.default: ``pad`` is (before, after) pairs from the last dim backwards (negative crops); ``mode``
    constant (``value``, None is 0), reflect, replicate or circular."""
    shape = shape_of(call.ins[0])
    amounts = ints_param(call, "pad")
    mode = call.param("mode", "constant")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise UnsupportedCall(f"pad mode {mode!r}")
    if len(amounts) % 2 or len(amounts) > 2 * len(shape):
        raise UnsupportedCall(f"pad {amounts} for a tensor of rank {len(shape)}")
    before = [0] * len(shape)
    for k in range(len(amounts) // 2):
        before[len(shape) - 1 - k] = amounts[2 * k]
    out_shape = list(shape)
    for k in range(len(amounts) // 2):
        out_shape[len(shape) - 1 - k] += amounts[2 * k] + amounts[2 * k + 1]
    check_shape(call.outs[0], out_shape, "pad")
    lines, src, inside = [], [], []
    for d, (size, b) in enumerate(zip(shape, before)):
        p = f"p{d}"
        lines.append(f"let {p} = i32(d{d}) - {b};")
        if mode == "reflect":
            lines.append(f"let r{d} = select({p}, -{p}, {p} < 0);")
            lines.append(f"let q{d} = select(r{d}, {2 * (size - 1)} - r{d}, r{d} >= {size});")
        elif mode == "replicate":
            lines.append(f"let q{d} = {p};")
        elif mode == "circular":
            # shifted non-negative first: % of a negative i32 is not the same on every backend (GLSL leaves it
            # undefined), of a u32 it is
            n = max(size, 1)
            lines.append(f"let q{d} = i32(u32({p} + {n * (b // n + 1)}) % {n}u);")
        else:
            lines.append(f"let q{d} = {p};")
            inside.append(f"({p} >= 0 && {p} < {size})")
        # clamped in every mode: a pad wider than the dim (which torch refuses for reflect) stays in bounds
        src.append(f"u32(clamp(q{d}, 0, {max(size - 1, 0)}))")
    out = call.outs[0]
    dst = offset(out, indices(len(shape)))
    copy_in = move(call, 0, offset(call.ins[0], src), dst)
    if mode != "constant" or not inside:
        return per_output(call, [*lines, copy_in])
    value = number(call.param("value", 0), "value")
    if out.dtype not in FLOAT_DTYPES and not math.isfinite(value):
        raise UnsupportedCall(f"pad value {value} in an integer dtype")
    if out.dtype in FLOAT_DTYPES:
        fill = literal(value)
    else:
        fill = literal(int(value != 0) if out.dtype == "bool" else int(value), "i32")
    return per_output(call, [*lines, f"if ({' && '.join(inside)}) {{ {copy_in} }} else {{ st_out0({dst}, {fill}); }}"])


def roll(call: Call) -> Shader:
    """A circular shift: output index j along a rolled dim reads (j - shift) mod size; no dims rolls the
    flattened tensor."""
    shape = shape_of(call.ins[0])
    check_shape(call.outs[0], shape, "roll")
    shifts, dims = ints_param(call, "shifts"), ints_param(call, "dims")
    if not dims:
        if len(shifts) != 1:
            raise UnsupportedCall(f"roll of the flattened tensor takes one shift, got {shifts}")
        n = max(numel(call.ins[0]), 1)
        back = (-shifts[0]) % n
        return copy_from(call, indices(len(shape), "s"), lines=[unravel(f"(i + {back}u) % {n}u", shape, "s")])
    if len(shifts) != len(dims):
        raise UnsupportedCall(f"roll shifts {shifts} and dims {dims} differ in length")
    total = [0] * len(shape)
    for s, d in zip(shifts, dims):
        total[norm_dim(d, len(shape))] += s
    src = [f"((d{d} + {(-t) % size}u) % {size}u)" if t % max(size, 1) else f"d{d}"
           for d, (t, size) in enumerate(zip(total, shape))]
    return copy_from(call, src)


def flip(call: Call) -> Shader:
    shape = shape_of(call.ins[0])
    check_shape(call.outs[0], shape, "flip")
    dims = {norm_dim(d, len(shape)) for d in ints_param(call, "dims")}
    return copy_from(call, [f"({max(size - 1, 0)}u - d{d})" if d in dims else f"d{d}"
                            for d, size in enumerate(shape)])
