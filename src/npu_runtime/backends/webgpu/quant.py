"""WGSL generators of QUANTIZE, DEQUANTIZE, QADD, QMUL, QMAXPOOL and QLUT, and the exact f32 arithmetic every int8
kernel shares.

Codes are stored as the backend stores every 8-bit tensor: four to a u32 word, little-endian (``wgsl.binding``);
``ld_`` returns a code as i32 (int8 sign-extended, uint8 zero-extended), ``st_`` sets its byte with two atomics.

Bit-exactness with the reference (``torch_ir.quant.numerics``) rests on three facts of WGSL:

* ``+``, ``-``, ``*`` of f32 are correctly rounded, and ``round`` rounds half to even (the spec's ``round``:
  "when e lies halfway between integers k and k + 1, the result is k when k is even");
* ``/`` of f32 is not (2.5 ulp), so a quotient the reference rounds once (``x / scale``, ``1 / scale``, the
  requantize multiplier ``x_s · w_s / y_s``) is computed by ``div_rne``: the 24 quotient bits of the two
  significands by restoring long division in u32, rounded to nearest even on the exact remainder. Operands or a
  quotient outside the normal range (zero, subnormal, infinite, NaN) take WGSL's ``/``: where a QUANTIZE meets
  them the quotient is 0, ±inf or NaN either way once rounded and clamped (a subnormal quotient rounds to 0);
* an i32 → f32 conversion is exact only below 2**24 in magnitude (the spec lets a wider one round either way), so
  ``i2f`` rounds a wider accumulator to 24 significant bits, half to even, in integers first.

The quotient ``1 / scale`` of ``method="multiply_inverse"`` is taken in float64 and rounded to float32 by the
reference; that equals the correctly rounded f32 quotient, because 1 / s of a 24-bit significand is never within
2**-49 (relative) of an f32 midpoint, far outside float64's rounding error (2**-53), so the double rounding is
innocuous.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from npu_program.program import TensorSpec

from .wgsl import Call, Shader, UnsupportedCall, numel, offset, per_element, shape_of, unravel

#: The exact f32 helpers (see the module docstring); the compiler drops those a shader does not call.
EXACT_F32 = """
fn div_rne(a: f32, b: f32) -> f32 {
  let ua = bitcast<u32>(a); let ub = bitcast<u32>(b);
  let ea = i32((ua >> 23u) & 0xffu); let eb = i32((ub >> 23u) & 0xffu);
  if (ea == 0 || ea == 255 || eb == 0 || eb == 255) { return a / b; }  // zero, subnormal, inf, NaN
  var ma = (ua & 0x7fffffu) | 0x800000u; let mb = (ub & 0x7fffffu) | 0x800000u;
  var e = ea - eb;
  if (ma < mb) { ma = ma << 1u; e = e - 1; }  // now 1 <= ma / mb < 2
  var q = 0u; var r = ma;
  for (var i = 0u; i < 24u; i = i + 1u) {  // r < 2 mb < 2**25 throughout
    q = q << 1u;
    if (r >= mb) { r = r - mb; q = q | 1u; }
    r = r << 1u;
  }
  if (r > mb || (r == mb && (q & 1u) == 1u)) { q = q + 1u; }  // r = 2 * remainder: above, at or below half
  if (q == 0x1000000u) { q = 0x800000u; e = e + 1; }
  let biased = e + 127;
  if (biased <= 0 || biased >= 255) { return a / b; }  // a subnormal or infinite quotient
  return bitcast<f32>((((ua ^ ub) & 0x80000000u)) | (u32(biased) << 23u) | (q & 0x7fffffu));
}
fn i2f(v: i32) -> f32 {
  if (v > -16777216 && v < 16777216) { return f32(v); }
  var m = bitcast<u32>(v);
  if (v < 0) { m = 0u - m; }  // |v| as u32 (also for -2**31)
  let drop = 8u - countLeadingZeros(m);  // bits below the 24 kept ones (1 to 8)
  let rest = m & ((1u << drop) - 1u); let half = 1u << (drop - 1u);
  var kept = m >> drop;
  if (rest > half || (rest == half && (kept & 1u) == 1u)) { kept = kept + 1u; }
  let mag = f32(kept) * exp2(f32(drop));  // kept <= 2**24 and a power of two: both exact
  return select(mag, -mag, v < 0);
}
"""

#: The code types the WebGPU int8 kernels read and write, with their ranges.
CODE_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def code_range(dtype: str, what: str, kernel: str) -> tuple[int, int]:
    """The range of an 8-bit code type; other types are refused naming the tensor."""
    if dtype not in CODE_RANGES:
        raise UnsupportedCall(f"{kernel}: {what} is {dtype}; the WebGPU kernels run int8 and uint8 codes only "
                              "(4-bit, 16-bit and float8 codes: compile with fallback='cpu')")
    return CODE_RANGES[dtype]


def check_scale(call: Call, index: int, what: str) -> None:
    """A scale input must be a float type the shaders load (float64 scales, PT2E's, are not)."""
    spec = call.ins[index]
    if spec.dtype not in ("float32", "float16", "bfloat16"):
        raise UnsupportedCall(f"{call.record.name}: {what} {spec.name!r} is {spec.dtype}; the WebGPU kernels read "
                              "float32, float16 or bfloat16 scales (cast float64 scales to float32 at import)")


def param_index(call: Call, index: int | None, shape: list[int], idx: list[str]) -> str:
    """The element of a scale or zero point (input ``index``) for the element at logical ``idx`` of a tensor of
    ``shape``: the one element of a per-tensor one, else along ``axis``: the channel's, or its group's (a per-group
    one has the tensor's shape with ``shape[axis] / group_size`` along the axis, as ``numerics.expand`` reads it)."""
    if index is None:
        return "0u"
    spec = call.ins[index]
    n, axis, group = numel(spec), call.param("axis"), call.param("group_size")
    if n == 1 and group is None:
        return "0u"
    rank = len(shape)
    if not isinstance(axis, int) or not -rank <= axis < rank:
        raise UnsupportedCall(f"{call.record.name}: {spec.name!r} holds {n} values; per channel or group they need an "
                              f"axis of the {shape} tensor (axis={axis!r})")
    axis %= rank
    if group is None:
        if shape[axis] != n:
            raise UnsupportedCall(f"{call.record.name}: {spec.name!r} holds {n} values, not the {shape[axis]} "
                                  f"channels of axis {axis} of {shape}")
        return idx[axis]
    want = [d // group if k == axis else d for k, d in enumerate(shape)]
    if not isinstance(group, int) or group < 1 or shape[axis] % group or shape_of(spec) != want:
        raise UnsupportedCall(f"{call.record.name}: {spec.name!r} has shape {shape_of(spec)}; groups of {group!r} "
                              f"along axis {axis} of {shape} need {want}")
    return offset(spec, [f"({v}) / {group}u" if k == axis else v for k, v in enumerate(idx)])


def _layout_free(spec: TensorSpec) -> None:
    if spec.quant is not None and spec.quant.block:
        raise UnsupportedCall(f"{spec.name!r} holds GGUF blocks; QUANTIZE and DEQUANTIZE read plain tensors")


def quantize(call: Call) -> Shader:
    """QUANTIZE: ``q = clamp(round(x / scale) + zp, qmin, qmax)`` per element, ``x / scale`` exact (``div_rne``)."""
    x, q = call.ins[0], call.outs[0]
    _layout_free(x)
    lo, hi = code_range(call.param("dtype"), f"the codes {q.name!r}", "QUANTIZE")
    if q.dtype != call.param("dtype"):
        raise UnsupportedCall(f"QUANTIZE: output {q.name!r} is {q.dtype}, not dtype={call.param('dtype')}")
    check_scale(call, 1, "the scale")
    lo = max(lo, int(call.param("qmin", lo)))
    hi = min(hi, int(call.param("qmax", hi)))
    shape = shape_of(q)
    idx = [f"d{k}" for k in range(len(shape))]
    s_at = param_index(call, 1, shape, idx)
    has_zp = len(call.ins) > 2
    zp_at = param_index(call, 2, shape, idx) if has_zp else None
    if call.param("method", "divide") == "divide":
        y = f"div_rne(ld_in0({offset(x, idx)}), ld_in1({s_at}))"
    else:  # x · f32(1 / f64(scale)): that inverse is the correctly rounded f32 one (module docstring)
        y = f"ld_in0({offset(x, idx)}) * div_rne(1.0, ld_in1({s_at}))"
    zp = f" + f32(ld_in2({zp_at}))" if has_zp else ""
    body = [unravel("i", shape), f"let y = round({y}){zp};",
            f"st_out0({offset(q, idx)}, i32(clamp(y, {float(lo)!r}, {float(hi)!r})));"]
    return per_element(call, numel(q), "\n  ".join(body), helpers=EXACT_F32)


def dequantize(call: Call) -> Shader:
    """DEQUANTIZE: ``x = f32(q - zp) · scale`` per element, cast to out_dtype by the store."""
    q, x = call.ins[0], call.outs[0]
    _layout_free(q)
    dtype = call.param("dtype")
    if dtype != "int32":
        code_range(dtype, f"the codes {q.name!r}", "DEQUANTIZE")
    if q.dtype != dtype:
        raise UnsupportedCall(f"DEQUANTIZE: input {q.name!r} is {q.dtype}, not dtype={dtype}")
    check_scale(call, 1, "the scale")
    shape = shape_of(q)
    idx = [f"d{k}" for k in range(len(shape))]
    s_at = param_index(call, 1, shape, idx)
    zp = f" - ld_in2({param_index(call, 2, shape, idx)})" if len(call.ins) > 2 else ""
    body = [unravel("i", shape), f"let v = ld_in0({offset(q, idx)}){zp};",  # int32 wraps as torch's does
            f"st_out0({offset(x, idx)}, i2f(v) * ld_in1({s_at}));"]
    return per_element(call, numel(q), "\n  ".join(body), helpers=EXACT_F32)



#: QADD's scales must lie in ``[2**-100, 2**100]`` (a and b's may also be 0) for its WGSL to be exact: then every
#: dequantized value and their sum are 0 or normal f32 numbers (a sum of two such values is a multiple of an ulp
#: of at least 2**-123), which WGSL neither flushes nor leaves the normal range with, and the quotient by y's scale
#: is ``div_rne``'s correctly rounded one. The reference computes on anything; real scales are ~1e-4 to 1.
QADD_SCALE_RANGE = (2.0 ** -100, 2.0 ** 100)
#: QMUL's input scales: a product of two dequantized codes (at most 255 · 2**50 each) stays normal, where the
#: sum's inputs of QADD_SCALE_RANGE could make 2**216
QMUL_SCALE_RANGE = (2.0 ** -50, 2.0 ** 50)


def _code_kernel(call: Call, kernel: str, scales: tuple[tuple[int, str], ...], params: tuple[int, ...]
                 ) -> tuple[int, int]:
    """The checks QADD and QMAXPOOL share: y holds ``out_dtype`` codes (their range returned), each of ``scales``
    ``(input index, what)`` is a float type the shaders load, and each input of ``params`` (scales and zero points)
    holds one value."""
    y, out = call.outs[0], call.param("out_dtype", "int8")
    lo, hi = code_range(out, f"the codes {y.name!r}", kernel)
    if y.dtype != out:
        raise UnsupportedCall(f"{kernel}: output {y.name!r} is {y.dtype}, not out_dtype={out}")
    for index, what in scales:
        check_scale(call, index, what)
    for index in params:
        if numel(call.ins[index]) != 1:
            raise UnsupportedCall(f"{kernel}: {call.ins[index].name!r} holds {numel(call.ins[index])} values; its "
                                  "scales and zero points are per tensor")
    return lo, hi


def qadd(call: Call) -> Shader:
    """QADD: ``y = clamp(round(act(f32(a - a_zp) · a_s + f32(b - b_zp) · b_s) / y_s) + y_zp, lo, hi)`` per element
    (the reference's float32 steps in order; ``/ y_s`` exact, or ``· f32(1 / y_s)`` for multiply_inverse); a and b
    broadcast to y as aten.add does. Per-tensor scales and zero points."""
    return _binary(call, "QADD", "+")


def qmul(call: Call) -> Shader:
    """QMUL: QADD's steps with the float32 product of the two dequantized values (correctly rounded in WGSL, as
    ``+``) in place of the sum; no activation."""
    return _binary(call, "QMUL", "*")


def _binary(call: Call, kernel: str, op: str) -> Shader:
    a, b, y = call.ins[0], call.ins[3], call.outs[0]
    for spec in (a, b):
        _layout_free(spec)
        code_range(spec.dtype, f"the codes {spec.name!r}", kernel)
    lo, hi = _code_kernel(call, kernel, ((1, "a's scale"), (4, "b's scale"), (6, "y's scale")), (1, 2, 4, 5, 6, 7))
    shape = shape_of(y)
    idx = [f"d{k}" for k in range(len(shape))]
    s = (f"(f32(ld_in0({offset(a, idx, shape)}) - ld_in2(0u)) * ld_in1(0u)) {op} "
         f"(f32(ld_in3({offset(b, idx, shape)}) - ld_in5(0u)) * ld_in4(0u))")
    relu = call.param("activation") == "relu"
    quotient = "div_rne(s, ld_in6(0u))" if call.param("method", "divide") == "divide" \
        else "s * div_rne(1.0, ld_in6(0u))"
    body = [unravel("i", shape), f"let s = {'max(' + s + ', 0.0)' if relu else s};",
            f"let q = round({quotient}) + f32(ld_in7(0u));",
            f"st_out0({offset(y, idx)}, i32(clamp(q, {float(lo)!r}, {float(hi)!r})));"]
    shader = per_element(call, numel(y), "\n  ".join(body), helpers=EXACT_F32)
    scales = ((1, "a's scale", True), (4, "b's scale", True), (6, "y's scale", False))
    ranges = {1: QMUL_SCALE_RANGE, 4: QMUL_SCALE_RANGE} if kernel == "QMUL" else None
    return dataclasses.replace(shader, bind_check=_bound_scales(kernel, call.dispatch.node, scales, ranges))


def _bound_scales(kernel: str, node: str, scales: tuple[tuple[int, str, bool], ...],
                  ranges: dict[int, tuple[float, float]] | None = None
                  ) -> Callable[[Callable[[int], np.ndarray | None]], None]:
    """The bind-time check of a kernel's scales, ``(input index, what, whether 0 is allowed)`` each, against
    :data:`QADD_SCALE_RANGE` (``ranges``: another range for some inputs); a scale computed at run time is not
    checked."""

    def check(read: Callable[[int], np.ndarray | None]) -> None:
        for index, what, zero_ok in scales:
            value = read(index)
            if value is None:
                continue
            v = abs(float(np.asarray(value, dtype=np.float64).reshape(-1)[0]))
            low, high = (ranges or {}).get(index, QADD_SCALE_RANGE)
            if not (math.isfinite(v) and (low <= v <= high or (zero_ok and v == 0.0))):
                raise ValueError(f"{kernel} (node {node!r}): {what} is {v:.3g}; the WebGPU kernel is exact for scales "
                                 f"in [2**{math.log2(low):.0f}, 2**{math.log2(high):.0f}] only (the float32 steps "
                                 "could leave the normal range, where WGSL's arithmetic is not the reference's); run "
                                 "the program on the CPU backend")

    return check


def qmaxpool(call: Call) -> Shader:
    """QMAXPOOL: per output, the window's largest code (smallest for a negative x_scale: dequantizing is monotone in
    the code, so that code's value is the float maximum; -inf for a window of padding only), then the reference's
    float32 steps: ``f32(code - x_zp) · x_s``, ``/ y_s`` exact (or ``· f32(1 / y_s)``), round, + y_zp, clamp. Scales
    in :data:`QADD_SCALE_RANGE` (bound-checked), so that no value is subnormal."""
    x, y = call.ins[0], call.outs[0]
    _layout_free(x)
    code_range(x.dtype, f"the codes {x.name!r}", "QMAXPOOL")
    lo, hi = _code_kernel(call, "QMAXPOOL", ((1, "x's scale"), (3, "y's scale")), (1, 2, 3, 4))
    in_shape, shape = shape_of(x), shape_of(y)
    if len(in_shape) != 4 or len(shape) != 4 or in_shape[:2] != shape[:2]:
        raise UnsupportedCall(f"QMAXPOOL of {in_shape} to {shape}: expected [N, C, H, W]")
    window = [call.param(k) for k in ("kernel_size", "stride", "padding", "dilation")]
    if not all(isinstance(v, list) and len(v) == 2 and all(isinstance(d, int) for d in v) for v in window):
        raise UnsupportedCall(f"QMAXPOOL: kernel_size, stride, padding and dilation must be [h, w] pairs: {window}")
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = window
    idx = [f"d{k}" for k in range(4)]
    at = offset(x, [idx[0], idx[1], "u32(ih)", "u32(iw)"])
    quotient = "div_rne(v, ld_in3(0u))" if call.param("method", "divide") == "divide" \
        else "v * div_rne(1.0, ld_in3(0u))"
    body = f"""{unravel("i", shape)}
  let sx = ld_in1(0u);
  var best = 0;
  var found = false;
  for (var i = 0; i < {kh}; i = i + 1) {{
    let ih = i32(d2) * {sh} - {ph} + i * {dh};
    if (ih < 0 || ih >= {in_shape[2]}) {{ continue; }}
    for (var j = 0; j < {kw}; j = j + 1) {{
      let iw = i32(d3) * {sw} - {pw} + j * {dw};
      if (iw < 0 || iw >= {in_shape[3]}) {{ continue; }}
      let c = ld_in0({at});
      if (!found || (sx >= 0.0 && c > best) || (sx < 0.0 && c < best)) {{ best = c; found = true; }}
    }}
  }}
  let v = select(bitcast<f32>(0xff800000u), f32(best - ld_in2(0u)) * sx, found);
  let q = round({quotient}) + f32(ld_in4(0u));
  st_out0({offset(y, idx)}, i32(clamp(q, {float(lo)!r}, {float(hi)!r})));"""
    shader = per_element(call, numel(y), body, helpers=EXACT_F32)
    scales = ((1, "x's scale", True), (3, "y's scale", False))
    return dataclasses.replace(shader, bind_check=_bound_scales("QMAXPOOL", call.dispatch.node, scales))


def qlut(call: Call) -> Shader:
    """QLUT: ``y = table[byte of x]`` per element, the 256-entry table (i32 codes, a scratch buffer) computed on the
    host by the op's numerics (``torch_ir.quant.lut.table``) when the weights are bound, so it is the reference's by
    construction. Per-tensor scales and zero points, bound before the first run."""
    x, y = call.ins[0], call.outs[0]
    _layout_free(x)
    code_range(x.dtype, f"the codes {x.name!r}", "QLUT")
    _code_kernel(call, "QLUT", (), (1, 2, 3, 4))
    shape = shape_of(y)
    if shape_of(x) != shape:
        raise UnsupportedCall(f"QLUT of {shape_of(x)} to {shape}: x and y must have one shape")
    idx = [f"d{k}" for k in range(len(shape))]
    body = [unravel("i", shape), f"st_out0({offset(y, idx)}, tmp0[u32(ld_in0({offset(x, idx)})) & 0xffu]);"]
    shader = per_element(call, numel(y), "\n  ".join(body), scratch=("i32",))
    return dataclasses.replace(shader, scratch=(256 * 4,), bind_data=_lut_table(call))


def _lut_table(call: Call) -> Callable[[Callable[[int], np.ndarray | None]], list[bytes]]:
    import torch

    from torch_ir.quant import lut

    node = call.dispatch.node

    def table(read: Callable[[int], np.ndarray | None]) -> list[bytes]:
        values = [read(i) for i in range(1, 5)]
        if any(v is None for v in values):
            raise ValueError(f"QLUT (node {node!r}): its scales and zero points are computed at run time; the WebGPU "
                             "kernel needs them bound before the first run (weights or constants) to make its "
                             "table; run the program on the CPU backend")
        scalars = [torch.from_numpy(np.array(v)) for v in values]
        codes = lut.table_of(call.ins[0].dtype, scalars, call.dispatch.params)
        return [codes.to(torch.int32).numpy().astype("<i4").tobytes()]

    return table
