"""WGSL generators of the reductions and windowed kernels: sums, means, extremes and norms over any dims,
arg-extremes, running sums, 2-D pooling (max, average, adaptive average) and 2-D resampling (nearest,
bilinear).

``reduce`` and ``arg_reduce`` run one workgroup per output element: its invocations stride over the
reduced elements (any count, any set of dims, in any layout), then fold their partial results in a
shared-memory tree. Pooling, adaptive pooling and resampling are one invocation per output element, over
the last two dims (4-D NCHW, stored NHWC or row-major, or unbatched 3-D). ``cumsum`` is one invocation per
line. Arithmetic is f32 for floating outputs, i32 for integer ones (an int64 sum keeps its low word).

NaN follows torch: it wins every max and min (amax, max pooling, argmax and the values of max/min.dim, at
the first NaN's index), tested by its bits because a shader compiler may assume ``x != x`` is false.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .movement.common import check_shape, indices, int_param, ints_param, norm_dim, number
from .wgsl import (
    WORKGROUP,
    Call,
    Shader,
    UnsupportedCall,
    compute_type,
    literal,
    numel,
    offset,
    per_element,
    per_group,
    shape_of,
    unravel,
)

#: WGSL helpers of NaN-propagating extremes (appended to a shader: module-scope order does not matter).
NAN_HELPERS = """
fn isnan_(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn max_(a: f32, b: f32) -> f32 { if (isnan_(a)) { return a; } if (isnan_(b)) { return b; } return max(a, b); }
fn min_(a: f32, b: f32) -> f32 { if (isnan_(a)) { return a; } if (isnan_(b)) { return b; } return min(a, b); }
"""

_INF = "bitcast<f32>(0x7f800000u)"
_NEG_INF = "bitcast<f32>(0xff800000u)"
_I32_MAX = "i32(2147483647)"
_I32_MIN = "bitcast<i32>(0x80000000u)"


def _with_helpers(shader: Shader) -> Shader:
    return Shader(shader.code + NAN_HELPERS, shader.workgroups, shader.scratch)


def _reduce_dims(value: object, rank: int) -> list[int]:
    """Reduced dims from a ``dim`` parameter: None or [] is every dim; negative dims count from the end."""
    if value is None:
        return list(range(rank))
    dims = [value] if isinstance(value, int) else value
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise UnsupportedCall(f"dim {value!r} is not a list of integers")
    if not dims:
        return list(range(rank))
    return sorted({norm_dim(d, rank) for d in dims if rank})  # a 0-d tensor reduces over nothing


def _group_size(count: int) -> int:
    """Invocations per workgroup for ``count`` reduced elements: a power of two (the tree halves it)."""
    return min(WORKGROUP, 1 << max(count - 1, 0).bit_length())


def _tree(size: int, fold: str) -> str:
    """The shared-memory tree over ``size`` slots; ``fold`` combines slot ``lid`` with slot ``lid + {s}``.
    Every barrier is in uniform control flow (the ``if`` is around the fold only)."""
    steps = []
    s = size // 2
    while s:
        steps.append(f"if (lid < {s}u) {{ {fold.format(s=s)} }}\n  workgroupBarrier();")
        s //= 2
    return "\n  ".join(steps)


def _split(call: Call, dims: Sequence[int], keepdim: bool) -> tuple[list[int], list[str], list[str]]:
    """(kept dims, input index, output index) of a reduction over ``dims``: the input index names kept dims
    ``k0``, ``k1``, ... (unravelled from the workgroup) and reduced ones ``r0``, ... (from the loop). Checks
    every output's shape."""
    shape = shape_of(call.ins[0])
    kept_shape = [1 if d in dims else n for d, n in enumerate(shape) if keepdim or d not in dims]
    for spec in call.outs:
        check_shape(spec, kept_shape, call.record.name)
    kept = [d for d in range(len(shape)) if d not in dims]
    src, out = [], []
    for d in range(len(shape)):
        if d in dims:
            src.append(f"r{dims.index(d)}")
            if keepdim:
                out.append("0u")
        else:
            src.append(f"k{kept.index(d)}")
            out.append(src[-1])
    return kept, src, out


def _fold(call: Call, x: str, floating: bool, count: int) -> tuple[str, str, str, str]:
    """(element, combine, init, final) of a reduce: the WGSL of one reduced element from ``x`` (the element as
    read), the fold of two partial results ``{a}`` and ``{b}``, its identity, and the result from ``total``."""
    op = call.record.name
    if op in ("aten.amax.default", "aten.amin.default"):
        big = op == "aten.amax.default"
        fold = ("max_" if big else "min_") if floating else ("max" if big else "min")
        init = (_NEG_INF if big else _INF) if floating else (_I32_MIN if big else _I32_MAX)
        return x, fold + "({a}, {b})", init, "total"
    if op == "aten.linalg_vector_norm.default":
        if not floating:
            raise UnsupportedCall("linalg_vector_norm of an integer output")
        return _norm_fold(call, x)
    if op in ("aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim"):
        combine, init = "{a} + {b}", "0.0" if floating else "0"
        if op != "aten.mean.dim":
            return x, combine, init, "total"
        if not floating:
            raise UnsupportedCall("mean of an integer output (torch asks for a floating dtype)")
        return x, combine, init, f"total / {literal(float(count))}"
    raise UnsupportedCall(f"reduce does not implement {op}")


def _norm_fold(call: Call, x: str) -> tuple[str, str, str, str]:
    """``_fold`` of linalg_vector_norm: the p-norm of ``ord`` (inf and -inf: the largest and smallest magnitude,
    0: the count of non-zeros)."""
    p = float(number(call.param("ord", 2), "ord"))
    x = f"abs({x})"
    if math.isinf(p):
        combine, init = ("max_({a}, {b})", "0.0") if p > 0 else ("min_({a}, {b})", _INF)
        return x, combine, init, "total"
    final = "total"
    if p == 0:
        x = f"select(0.0, 1.0, {x} != 0.0)"
    elif p == 2:
        x = f"{x} * {x}"
        final = "sqrt(total)"
    elif p != 1:
        x = f"pow_({x}, {literal(p)})"
        final = f"pow_(total, {literal(1.0 / p)})"
    return x, "{a} + {b}", "0.0", final


def reduce(call: Call) -> Shader:
    """mean.dim, sum.dim_IntList, sum.default, amax, amin and linalg_vector_norm: one workgroup per output
    element, each invocation folding a strided share of the reduced elements, then a tree."""
    op = call.record.name
    src, out = call.ins[0], call.outs[0]
    shape = shape_of(src)
    dims = _reduce_dims(None if op == "aten.sum.default" else call.params.get("dim"), len(shape))
    keepdim = bool(call.param("keepdim", False))
    kept, src_idx, out_idx = _split(call, dims, keepdim)
    red_shape = [shape[d] for d in dims]
    count = math.prod(red_shape)
    n_out = math.prod(shape[d] for d in kept)
    t = compute_type(out.dtype)
    x, combine, init, final = _fold(call, f"{t}(ld_in0({offset(src, src_idx)}))", t == "f32", count)
    size = _group_size(count)
    body = f"""{unravel("g", [shape[d] for d in kept], "k")}
  var acc: {t} = {init};
  for (var j = lid; j < {count}u; j = j + {size}u) {{
    {unravel("j", red_shape, "r")}
    let v = {x};
    acc = {combine.format(a="acc", b="v")};
  }}
  part[lid] = acc;
  workgroupBarrier();
  {_tree(size, "part[lid] = " + combine.format(a="part[lid]", b="part[lid + {s}u]") + ";")}
  if (lid == 0u) {{
    let total = part[0];
    st_out0({offset(out, out_idx)}, {final});
  }}"""
    shared = f"var<workgroup> part: array<{t}, {size}>;"
    return _with_helpers(per_group(call, n_out, size, body, shared=shared))


def arg_reduce(call: Call) -> Shader:
    """argmax.default (dim None: of the flattened input) and max.dim / min.dim (values, then int64 indices):
    one workgroup per output element; of equal extremes the first index wins, as in torch."""
    op = call.record.name
    src = call.ins[0]
    shape = shape_of(src)
    dim = call.params.get("dim")
    dims = _reduce_dims(None if dim is None else int_param(call, "dim"), len(shape))
    if dim is not None and len(dims) > 1:
        raise UnsupportedCall(f"{op} over several dims")
    keepdim = bool(call.param("keepdim", False))
    kept, src_idx, out_idx = _split(call, dims, keepdim)
    red_shape = [shape[d] for d in dims]
    count = math.prod(red_shape)
    n_out = math.prod(shape[d] for d in kept)
    big = op in ("aten.argmax.default", "aten.max.dim")
    t = compute_type(src.dtype)
    # (v, i) beats (bv, bi): NaN beats any number (the first NaN wins), else the extreme, else the first index
    cmp = ">" if big else "<"
    better = f"(v {cmp} bv || (v == bv && i < bi))"
    if t == "f32":
        better = f"select(!isnan_(bv) && {better}, !isnan_(bv) || i < bi, isnan_(v))"
        init = _NEG_INF if big else _INF
    else:
        init = _I32_MIN if big else _I32_MAX
    outs = list(call.outs)
    if len(outs) == 2:
        values_out, index_out = 0, 1
    elif op == "aten.argmax.default" and len(outs) == 1:
        values_out, index_out = None, 0
    else:
        raise UnsupportedCall(f"{op} with {len(outs)} outputs")
    size = _group_size(count)
    store_values = f"st_out{values_out}({offset(outs[values_out], out_idx)}, pv[0]);" if values_out is not None \
        else ""
    body = f"""{unravel("g", [shape[d] for d in kept], "k")}
  var bv: {t} = {init};
  var bi = 0xffffffffu;
  for (var i = lid; i < {count}u; i = i + {size}u) {{
    {unravel("i", red_shape, "r")}
    let v = {t}(ld_in0({offset(src, src_idx)}));
    if (better(v, i, bv, bi)) {{ bv = v; bi = i; }}
  }}
  pv[lid] = bv;
  pi[lid] = bi;
  workgroupBarrier();
  {_tree(size, "if (better(pv[lid + {s}u], pi[lid + {s}u], pv[lid], pi[lid])) "
               "{{ pv[lid] = pv[lid + {s}u]; pi[lid] = pi[lid + {s}u]; }}")}
  if (lid == 0u) {{
    {store_values}
    st_out{index_out}({offset(outs[index_out], out_idx)}, i32(pi[0]));
  }}"""
    shared = f"""var<workgroup> pv: array<{t}, {size}>;
var<workgroup> pi: array<u32, {size}>;
fn better(v: {t}, i: u32, bv: {t}, bi: u32) -> bool {{ return {better}; }}"""
    return _with_helpers(per_group(call, n_out, size, body, shared=shared))


def cumsum(call: Call) -> Shader:
    """A running sum along dim: one invocation per line, accumulating in order (f32, or i32 for an integer
    output)."""
    src, out = call.ins[0], call.outs[0]
    shape = shape_of(src)
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(out, shape, "cumsum")
    shape = shape or [1]  # a 0-d tensor is one line of one (offset then ignores the index)
    lines = shape[:dim] + shape[dim + 1:]
    idx = [f"k{k}" for k in range(len(lines))]
    idx.insert(dim, "j")
    t = compute_type(out.dtype)
    body = f"""{unravel("i", lines, "k")}
  var acc: {t} = {t}(0);
  for (var j = 0u; j < {shape[dim]}u; j = j + 1u) {{
    acc = acc + {t}(ld_in0({offset(src, idx)}));
    st_out0({offset(out, idx)}, acc);
  }}"""
    return per_element(call, math.prod(lines), body)


# -- pooling ----------------------------------------------------------------------------------------------

def _pair(call: Call, name: str, default: Sequence[int], least: int = 1) -> list[int]:
    """A per-spatial-dim parameter: one value for both dims, two, or none (``default``); each at least
    ``least``."""
    values = ints_param(call, name, default) or list(default)
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or min(values) < least:
        raise UnsupportedCall(f"parameter {name!r} = {values} is not one or two values of at least {least}")
    return values


def _spatial(call: Call) -> tuple[list[int], list[int], list[str]]:
    """(input shape, output shape, output index names) of a kernel over the last two dims of a 3-D or 4-D
    tensor."""
    in_shape, out_shape = shape_of(call.ins[0]), shape_of(call.outs[0])
    if len(in_shape) not in (3, 4) or len(out_shape) != len(in_shape) or in_shape[:-2] != out_shape[:-2]:
        raise UnsupportedCall(f"{call.record.name} of {in_shape} to {out_shape}: expected [N,] C, H, W")
    if compute_type(call.ins[0].dtype) != "f32" or compute_type(call.outs[0].dtype) != "f32":
        raise UnsupportedCall(f"{call.record.name} of {call.ins[0].dtype}: floating tensors only")
    if not numel(call.ins[0]) or not numel(call.outs[0]):
        raise UnsupportedCall(f"{call.record.name} of {in_shape} to {out_shape}: an empty tensor")
    return in_shape, out_shape, indices(len(out_shape))


def pool2d(call: Call) -> Shader:
    """max_pool2d and avg_pool2d (torch's windows: padding, dilation for max, ceil_mode's partial windows,
    count_include_pad and divisor_override for the average)."""
    op = call.record.name
    in_shape, out_shape, idx = _spatial(call)
    kernel = _pair(call, "kernel_size", ())
    stride = _pair(call, "stride", kernel)
    padding = _pair(call, "padding", [0, 0], least=0)
    height, width = in_shape[-2:]
    src, out = call.ins[0], call.outs[0]
    lead = idx[:-2]
    oh, ow = idx[-2:]
    dst = offset(out, idx)
    if op == "aten.max_pool2d.default":
        dilation = _pair(call, "dilation", [1, 1])
        body = f"""{unravel("i", out_shape)}
  var m = {_NEG_INF};
  for (var kh = 0; kh < {kernel[0]}; kh = kh + 1) {{
    let ih = i32({oh}) * {stride[0]} - {padding[0]} + kh * {dilation[0]};
    if (ih < 0 || ih >= {height}) {{ continue; }}
    for (var kw = 0; kw < {kernel[1]}; kw = kw + 1) {{
      let iw = i32({ow}) * {stride[1]} - {padding[1]} + kw * {dilation[1]};
      if (iw < 0 || iw >= {width}) {{ continue; }}
      let v = ld_in0({offset(src, [*lead, "u32(ih)", "u32(iw)"])});
      if (v > m || isnan_(v)) {{ m = v; }}
    }}
  }}
  st_out0({dst}, m);"""
        return _with_helpers(per_element(call, numel(out), body))
    if op != "aten.avg_pool2d.default":
        raise UnsupportedCall(f"pool2d does not implement {op}")
    divisor = call.params.get("divisor_override")
    include_pad = bool(call.param("count_include_pad", True))
    if divisor is not None:
        divide = literal(float(number(divisor, "divisor_override")))
    elif include_pad:
        divide = "f32((h1 - h0) * (w1 - w0))"
    else:
        divide = "f32((he - hs) * (we - ws))"
    # torch's window: clipped to the padded input for the count_include_pad divisor, then to the input
    body = f"""{unravel("i", out_shape)}
  let h0 = i32({oh}) * {stride[0]} - {padding[0]};
  let w0 = i32({ow}) * {stride[1]} - {padding[1]};
  let h1 = min(h0 + {kernel[0]}, {height + padding[0]});
  let w1 = min(w0 + {kernel[1]}, {width + padding[1]});
  let hs = max(h0, 0);
  let ws = max(w0, 0);
  let he = min(h1, {height});
  let we = min(w1, {width});
  var sum = 0.0;
  for (var ih = hs; ih < he; ih = ih + 1) {{
    for (var iw = ws; iw < we; iw = iw + 1) {{
      sum = sum + ld_in0({offset(src, [*lead, "u32(ih)", "u32(iw)"])});
    }}
  }}
  st_out0({dst}, select(sum / {divide}, 0.0, hs >= he || ws >= we));"""
    return per_element(call, numel(out), body)


def adaptive_avg_pool2d(call: Call) -> Shader:
    """Output (i, j) averages rows floor(i·H/OH) .. ceil((i+1)·H/OH) and the same of columns (torch's windows)."""
    in_shape, out_shape, idx = _spatial(call)
    (height, width), (out_h, out_w) = in_shape[-2:], out_shape[-2:]
    src, out = call.ins[0], call.outs[0]
    oh, ow = idx[-2:]
    body = f"""{unravel("i", out_shape)}
  let hs = ({oh} * {height}u) / {out_h}u;
  let he = (({oh} + 1u) * {height}u + {out_h - 1}u) / {out_h}u;
  let ws = ({ow} * {width}u) / {out_w}u;
  let we = (({ow} + 1u) * {width}u + {out_w - 1}u) / {out_w}u;
  var sum = 0.0;
  for (var ih = hs; ih < he; ih = ih + 1u) {{
    for (var iw = ws; iw < we; iw = iw + 1u) {{
      sum = sum + ld_in0({offset(src, [*idx[:-2], "ih", "iw"])});
    }}
  }}
  st_out0({offset(out, idx)}, sum / f32(he - hs) / f32(we - ws));"""
    return per_element(call, numel(out), body)


# -- resampling -------------------------------------------------------------------------------------------

def _f32(value: float) -> str:
    """A value rounded to f32 on the host (as torch's float arithmetic of the scale does), as a literal."""
    return literal(float(np.float32(value)))


def _scale(in_size: int, out_size: int, factor: float | None, align_corners: bool) -> str:
    """torch's ``area_pixel_compute_scale``: input pixels per output pixel (a given factor is used as 1/factor)."""
    if align_corners:
        return _f32(np.float32(in_size - 1) / np.float32(out_size - 1)) if out_size > 1 else "0.0"
    if factor is not None and factor > 0:
        return _f32(1.0 / factor)
    return _f32(np.float32(in_size) / np.float32(out_size))


def upsample(call: Call) -> Shader:
    """upsample_nearest2d.vec and upsample_bilinear2d.vec with torch's source-index formulas: nearest takes
    floor(o · scale) (the same index when the size is kept, o / 2 when it doubles), bilinear interpolates at
    scale · (o + 0.5) - 0.5 (align_corners: at o · (in - 1) / (out - 1)); a dim whose size is kept copies."""
    op = call.record.name
    in_shape, out_shape, idx = _spatial(call)
    factors = call.params.get("scale_factors")
    if factors is not None:
        factors = [float(number(f, "scale_factors")) for f in factors]
        if len(factors) != 2:
            raise UnsupportedCall(f"scale_factors {factors} are not two values")
    src, out = call.ins[0], call.outs[0]
    lead, pos = idx[:-2], idx[-2:]
    lines = [unravel("i", out_shape)]
    if op == "aten.upsample_nearest2d.vec":
        src_idx = []
        for k in range(2):
            n_in, n_out, o = in_shape[k - 2], out_shape[k - 2], pos[k]
            if n_out == n_in:
                src_idx.append(o)
            elif n_out == 2 * n_in:
                src_idx.append(f"({o} >> 1u)")
            else:
                scale = _scale(n_in, n_out, factors[k] if factors else None, False)
                src_idx.append(f"min(u32(floor(f32({o}) * {scale})), {n_in - 1}u)")
        lines.append(f"st_out0({offset(out, idx)}, ld_in0({offset(src, [*lead, *src_idx])}));")
        return per_element(call, numel(out), "\n  ".join(lines))
    if op != "aten.upsample_bilinear2d.vec":
        raise UnsupportedCall(f"upsample does not implement {op}")
    align = bool(call.param("align_corners", False))
    for k, axis in enumerate("hw"):
        n_in, n_out, o = in_shape[k - 2], out_shape[k - 2], pos[k]
        if n_out == n_in:
            lines += [f"let {axis}0 = {o};", f"let {axis}1 = {o};", f"let {axis}l = 0.0;"]
            continue
        scale = _scale(n_in, n_out, factors[k] if factors else None, align)
        real = f"{scale} * f32({o})" if align else f"max({scale} * (f32({o}) + 0.5) - 0.5, 0.0)"
        lines += [f"let {axis}r = {real};",
                  f"let {axis}0 = min(u32(floor({axis}r)), {n_in - 1}u);",
                  f"let {axis}1 = {axis}0 + select(0u, 1u, {axis}0 < {n_in - 1}u);",
                  f"let {axis}l = clamp({axis}r - f32({axis}0), 0.0, 1.0);"]

    def at(h: str, w: str) -> str:
        return f"ld_in0({offset(src, [*lead, h, w])})"

    lines.append(f"st_out0({offset(out, idx)}, (1.0 - hl) * ((1.0 - wl) * {at('h0', 'w0')} + wl * {at('h0', 'w1')})"
                 f" + hl * ((1.0 - wl) * {at('h1', 'w0')} + wl * {at('h1', 'w1')}));")
    return per_element(call, numel(out), "\n  ".join(lines))
