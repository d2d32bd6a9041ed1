"""WGSL generators of QGEMM and QCONV: integer matrix products and 2-D convolutions of 8-bit codes, accumulated in
i32, with the int32 bias and the requantize of the reference (``torch_ir.ops.npu_quant._finish``).

One invocation computes up to 8 output channels of one output position (``_tile``: each x word it reads serves
them all): the reduction runs over *segments* (the kernel window's positions of a convolution; the one row of K of a
product) of C consecutive channels, read four at a time as u32 words of four bytes. Every byte is moved into the
signed range first (a uint8 code minus 128: ``x' = x - cx``, the zero point likewise ``xz' = xz - cx``), so that one
signed 4x8-bit dot product serves every mix of int8 and uint8 operands, and the centred sum is taken apart as

    Σ (x - xz)(w - wz) = Σ (x' - xz')(w' - wz') = Σ x'w' - wz' Σ x' - xz' Σ w' + KT · xz' · wz'

over the KT = segments x 4 · ceil(C / 4) byte lanes read, where a lane outside the tensor (the convolution's
padding, the tail of a segment past C) holds x' = xz' on the x side, so its centred product is 0 whatever w' is.
Each dot product of four bytes is ``dot4I8Packed`` where the device has it (``gpu.has_packed_dot4``), else the same
sum of four i32 products (the emulated path, chosen also with ``USE_PACKED_DOT4 = False``): both exact.

Exactness: the centred operands lie in [-255, 255], so the true sum is bounded by K · 255² and the generator
refuses K > 33025 (where it could leave i32). Every intermediate term (Σ x'w' ≤ KT · 128², the corrections) is
computed in i32, whose + - * wrap modulo 2³² in WGSL; the true result being within i32, the wrapped one equals
it. The bias is added in i32: the reference stops with an error where that overflows, where this kernel would wrap,
so a bias beyond 2³¹ - 1 - K · 255² is refused when the weights are bound (``_checking_bias``). Then, as
``_finish``: int32 out stores the accumulator; float32 out
``i2f(acc) · (x_s · w_s)``; a code type ``round(i2f(acc) · m) + y_zp`` clamped (relu: from y_zp), with
``m = div_rne(x_s · w_s, y_s)``: the reference's float32 product and quotient in its order, each correctly rounded
(``quant``), so m has the bits of ``requant_multiplier``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from torch_ir.ops.npu_quant import int_bias

from ..quant import EXACT_F32, check_scale, code_range
from ..wgsl import Call, Shader, UnsupportedCall, logical_strides, numel, offset, per_element, shape_of, unravel

#: The longest reduction whose centred sum stays within i32 for any 8-bit codes and zero points (K · 255² < 2³¹).
MAX_K = (2 ** 31 - 1) // (255 * 255)
_ONES = "0x01010101u"


@dataclass(frozen=True)
class _Side:
    """How one operand's words are read: element ``base + c · cs`` for channel c < C; ``fast`` when those are
    whole aligned words of storage (cs = 1, C and every base a multiple of 4)."""

    name: str  # the binding (in0, in1)
    cs: int
    c: int
    fast: bool
    flip: int  # 128 for uint8 (bytes moved to the signed range), else 0


def _side(name: str, cs: int, c: int, base_strides: Sequence[int], dtype: str) -> _Side:
    fast = cs == 1 and c % 4 == 0 and all(s % 4 == 0 for s in base_strides)
    return _Side(name, cs, c, fast, 128 if dtype == "uint8" else 0)


def _word(side: _Side, pad: str) -> str:
    """``fn {name}_word(base, j) -> u32``: bytes 4j .. 4j + 3 of the segment at ``base``, each minus ``flip``,
    lanes past C set to the byte ``pad`` (an i32 expression)."""
    flip = f" ^ {0x80808080}u" if side.flip else ""
    head = f"fn {side.name}_word(base: u32, j: u32) -> u32 {{"
    if side.fast:
        return f"{head} return {side.name}[(base + 4u * j) / 4u]{flip}; }}"
    lanes = []
    for i in range(4):
        c = f"4u * j + {i}u"
        lanes.append(f"  let b{i} = select({pad}, ld_{side.name}(base + ({c}) * {side.cs}u) - {side.flip}, "
                     f"{c} < {side.c}u);")
    join = " | ".join(f"((u32(b{i}) & 0xffu) << {8 * i}u)" for i in range(4))
    return "\n".join([head, *lanes, f"  return {join};", "}"])


def _dot(call: Call) -> str:
    """``fn d4(a, b) -> i32``: the signed dot product of two words of four bytes."""
    if call.has_dot4:
        return "fn d4(a: u32, b: u32) -> i32 { return dot4I8Packed(a, b); }"
    unpack = "(bitcast<vec4<i32>>(vec4<u32>({v} << 24u, {v} << 16u, {v} << 8u, {v})) >> vec4<u32>(24u))"
    return f"fn d4(a: u32, b: u32) -> i32 {{ return dot({unpack.format(v='a')}, {unpack.format(v='b')}); }}"


@dataclass(frozen=True)
class _Epilogue:
    """Inputs and types of the bias and requantize (``_finish``)."""

    bias: int | None
    out: str
    relu: bool
    y: tuple[int, int] | None  # y_scale, y_zero_point inputs
    lo: int = 0
    hi: int = 0


def _operands(call: Call, kernel: str, channels: int) -> tuple[str, str, _Epilogue]:
    """Check the dtypes and the per-tensor / per-channel inputs; (x dtype, w dtype, epilogue)."""
    x, w = call.ins[0], call.ins[1]
    code_range(x.dtype, f"x {x.name!r}", kernel)
    w_dtype = call.param("w_dtype", "int8")
    code_range(w_dtype, f"w {w.name!r} (w_dtype)", kernel)
    if w.dtype != w_dtype:
        raise UnsupportedCall(f"{kernel}: w {w.name!r} is {w.dtype}, not w_dtype={w_dtype}")
    for i, what in ((2, "x_scale"), (4, "w_scale")):
        check_scale(call, i, what)
    for i, what, most in ((2, "x_scale", 1), (3, "x_zero_point", 1), (4, "w_scale", channels),
                          (5, "w_zero_point", channels)):
        if numel(call.ins[i]) not in (1, most):
            raise UnsupportedCall(f"{kernel}: {what} {call.ins[i].name!r} holds {numel(call.ins[i])} values; it is "
                                  f"per tensor (1){f' or per output channel ({most})' if most > 1 else ''}")
        codes = {3: x.dtype, 5: w_dtype}.get(i)
        if codes is not None and call.ins[i].dtype != codes:  # then it fits the byte lanes (module docstring)
            raise UnsupportedCall(f"{kernel}: {what} {call.ins[i].name!r} is {call.ins[i].dtype}; the WebGPU kernels "
                                  f"take a zero point of its codes' type ({codes}), as ONNX's are")
    out = call.param("out_dtype", "int8")
    if call.outs[0].dtype != out:
        raise UnsupportedCall(f"{kernel}: y {call.outs[0].name!r} is {call.outs[0].dtype}, not out_dtype={out}")
    act = call.param("activation")
    if act not in (None, "relu"):
        raise UnsupportedCall(f"{kernel}: a quantized kernel fuses only relu, got activation={act!r}")
    bias = 6 if call.param("has_bias", False) else None
    if bias is not None:
        spec = call.ins[6]
        if spec.dtype not in ("int32", "float32", "float16", "bfloat16"):
            raise UnsupportedCall(f"{kernel}: bias {spec.name!r} is {spec.dtype}; the WebGPU kernels add int32 or "
                                  "float biases (cast it at import, or compile with fallback='cpu')")
        if numel(spec) not in (1, channels):
            raise UnsupportedCall(f"{kernel}: bias {spec.name!r} holds {numel(spec)} values, not {channels}")
    if out in ("int32", "float32"):
        if len(call.ins) != 6 + (bias is not None):
            raise UnsupportedCall(f"{kernel}: out_dtype={out} takes no y_scale or y_zero_point")
        return x.dtype, w_dtype, _Epilogue(bias, out, act == "relu", None)
    lo, hi = code_range(out, f"y {call.outs[0].name!r}", kernel)
    first = 6 + (bias is not None)
    if len(call.ins) != first + 2 or numel(call.ins[first]) != 1 or numel(call.ins[first + 1]) != 1:
        raise UnsupportedCall(f"{kernel}: out_dtype={out} takes a one-element y_scale and y_zero_point last")
    check_scale(call, first, "y_scale")
    return x.dtype, w_dtype, _Epilogue(bias, out, act == "relu", (first, first + 1), lo, hi)


def _finish(call: Call, ep: _Epilogue, n: str, out_at: str) -> list[str]:
    """WGSL lines from the i32 ``acc`` of output channel ``n`` to the store at ``out_at`` (module docstring)."""
    lines = []
    scale = f"ld_in2(0u) * ld_in4({n if numel(call.ins[4]) > 1 else '0u'})"
    if ep.bias is not None:
        bias = f"ld_in6({n if numel(call.ins[6]) > 1 else '0u'})"
        if call.ins[6].dtype != "int32":  # int_bias: round_half_even(bias / (x_s · w_s)) in f32, saturated
            bias = f"i32(clamp(round(div_rne({bias}, {scale})), -2147483648.0, 2147483520.0))"
        lines.append(f"acc = acc + {bias};")
    if ep.out == "int32":
        lines.append(f"st_out0({out_at}, acc);")
    elif ep.out == "float32":
        value = f"i2f(acc) * ({scale})"
        lines.append(f"st_out0({out_at}, {f'max({value}, 0.0)' if ep.relu else value});")
    else:
        ys, yz = ep.y
        lines += [f"let m = div_rne({scale}, ld_in{ys}(0u));",
                  f"let yz = f32(ld_in{yz}(0u));",
                  "let y = round(i2f(acc) * m) + yz;",
                  f"let lo = {'max(' + repr(float(ep.lo)) + ', yz)' if ep.relu else repr(float(ep.lo))};",
                  f"st_out0({out_at}, i32(clamp(y, lo, {float(ep.hi)!r})));"]
    return lines


def _tile(channels: int) -> int:
    """Output channels per invocation: the most of 8, 4, 2, 1 that divide ``channels`` (each x word read is then
    used that many times)."""
    return next(t for t in (8, 4, 2, 1) if channels % t == 0)


def _reduction(call: Call, xs: _Side, ws: _Side, segments: int, nt: int) -> list[str]:
    """The accumulators' opening lines for the ``nt`` output channels from ``n0``, with their zero points."""
    head = [f"let xz = ld_in3(0u) - {xs.flip};", "let xzw = (u32(xz) & 0xffu) * 0x01010101u;", "var sx = 0;"]
    for t in range(nt):
        at = f"n0 + {t}u" if numel(call.ins[5]) > 1 else "0u"
        head.append(f"let wz{t} = ld_in5({at}) - {ws.flip}; var sxw{t} = 0; var sw{t} = 0;")
    return head


def _segment(xs: _Side, xbase: str, valid: str, wbase: str, w_step: int, nt: int) -> str:
    """The loop over one segment's words, accumulating Σ x'w' and Σ w' per output channel (channel t's w at
    ``wbase + t · w_step``) and Σ x' once."""
    lines = [f"for (var j = 0u; j < {-(-xs.c // 4)}u; j = j + 1u) {{",
             f"  let a = select(xzw, in0_word({xbase}, j), {valid}); sx = sx + d4(a, {_ONES});"]
    for t in range(nt):
        lines.append(f"  let b{t} = in1_word({wbase} + {t * w_step}u, j); sxw{t} = sxw{t} + d4(a, b{t}); "
                     f"sw{t} = sw{t} + d4(b{t}, {_ONES});")
    return "\n  ".join([*lines, "}"])


def _finish_all(call: Call, ep: _Epilogue, xs: _Side, segments: int, nt: int,
                out_at: Callable[[str], str]) -> list[str]:
    """Per output channel ``n0 + t``: its exact sum (module docstring) and ``_finish``, in a block of its own."""
    kt = segments * 4 * -(-xs.c // 4)
    lines = []
    for t in range(nt):
        n = f"(n0 + {t}u)"
        lines += ["{", f"var acc = sxw{t} - wz{t} * sx - xz * sw{t} + {kt} * xz * wz{t};",
                  *_finish(call, ep, n, out_at(n)), "}"]
    return lines


def _check_k(kernel: str, k: int) -> None:
    if k > MAX_K:
        raise UnsupportedCall(f"{kernel}: a reduction over {k} products may leave i32 (at most {MAX_K} for 8-bit "
                              "codes); split it, or compile with fallback='cpu'")


def qgemm(call: Call) -> Shader:
    """QGEMM: ``y[..., m, n] = finish(Σ_k (x[..., m, k] - xz)(w[n, k] - wz[n]))`` (``w[..., k, n]`` without
    trans_b); batch dims broadcast as torch.matmul's."""
    x, w, y = call.ins[0], call.ins[1], call.outs[0]
    trans_b = bool(call.param("trans_b", True))
    ys, xsh, wsh = shape_of(y), shape_of(x), shape_of(w)
    if len(xsh) < 2 or len(wsh) < 2:
        raise UnsupportedCall(f"QGEMM: x {xsh} and w {wsh} need two dims or more")
    k = xsh[-1]
    n_out = ys[-1]
    if (wsh[-1] if trans_b else wsh[-2]) != k:
        raise UnsupportedCall(f"QGEMM: w {wsh} does not reduce over x's K = {k} (trans_b={trans_b})")
    _check_k("QGEMM", k)
    x_dtype, w_dtype, ep = _operands(call, "QGEMM", n_out)
    nt = _tile(n_out)
    idx = [f"d{i}" for i in range(len(ys))]
    batch = idx[:-2]
    xst, wst = logical_strides(x), logical_strides(w)
    x_side = _side("in0", xst[-1], k, [s for s, d in zip(xst[:-1], xsh[:-1]) if d > 1], x_dtype)
    w_k = -1 if trans_b else -2
    w_other = [s for i, (s, d) in enumerate(zip(wst, wsh)) if d > 1 and i != len(wsh) + w_k]
    w_side = _side("in1", wst[w_k], k, w_other, w_dtype)
    x_base = offset(x, [*batch, idx[-2], "0u"], [*ys[:-2], ys[-2], k])
    w_idx = [*batch, "n0", "0u"] if trans_b else [*batch, "0u", "n0"]
    w_from = [*ys[:-2], n_out, k] if trans_b else [*ys[:-2], k, n_out]
    w_base = offset(w, w_idx, w_from)
    w_step = wst[-2] if trans_b else wst[-1]
    body = [unravel("i", [*ys[:-1], n_out // nt]), f"let n0 = {idx[-1]} * {nt}u;",
            *_reduction(call, x_side, w_side, 1, nt), _segment(x_side, x_base, "true", w_base, w_step, nt),
            *_finish_all(call, ep, x_side, 1, nt, lambda n: offset(y, [*idx[:-1], n]))]
    shader = per_element(call, numel(y) // nt, "\n  ".join(body), helpers=_helpers(call, x_side, w_side))
    return _checking_bias(shader, "QGEMM", call.dispatch.node, k, ep)


def _checking_bias(shader: Shader, kernel: str, node: str, k: int, ep: _Epilogue) -> Shader:
    """``shader`` refusing, when its weights are bound, a bias that could carry the i32 sum out of range: the
    reference raises where the sum overflows, this kernel would wrap (module docstring). Conservative, as the CPU
    kernel's check: ``max |bias codes| + K · 255²`` must stay within int32. A bias computed at run time (an
    activation) is not checked."""
    if ep.bias is None:
        return shader

    def check(read: Callable[[int], np.ndarray | None]) -> None:
        bias, x_s, w_s = read(ep.bias), read(2), read(4)
        if bias is None or (np.issubdtype(bias.dtype, np.floating) and (x_s is None or w_s is None)):
            return
        codes = int_bias(torch.as_tensor(bias), torch.as_tensor(x_s if x_s is not None else 1.0),
                         torch.as_tensor(w_s if w_s is not None else 1.0))
        worst = int(codes.abs().max()) + k * 255 * 255 if codes.numel() else 0
        if worst > 2 ** 31 - 1:
            raise ValueError(f"{kernel} (node {node!r}): its bias reaches {int(codes.abs().max())} at the "
                             f"accumulator's scale, and with {k} products of 8-bit codes the int32 sum could overflow, "
                             "where the reference raises and this WGSL kernel would wrap; run the program on the CPU "
                             "backend, whose kernel checks each sum")

    return dataclasses.replace(shader, bind_check=check)


def _helpers(call: Call, x_side: _Side, w_side: _Side) -> str:
    """The functions a quantized contraction calls; x's lanes past C hold its zero point (centred product 0)."""
    return "\n".join([EXACT_F32, _dot(call), _word(x_side, f"(ld_in3(0u) - {x_side.flip})"), _word(w_side, "0")])


def _pairs(call: Call, name: str, default: int) -> tuple[int, int]:
    value = call.param(name, default)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) not in (1, 2) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise UnsupportedCall(f"QCONV: {name}={value!r} is not one or two integers")
    return values[0], values[-1]


def qconv(call: Call) -> Shader:
    """QCONV (2-D): ``y[b, o, p, q] = finish(Σ_{c, i, j} (x[b, g·cg + c, p·s - pad + i·d, ...] - xz)(w[o, c, i, j]
    - wz[o]))``, groups included (depthwise: cg = 1)."""
    x, w, y = call.ins[0], call.ins[1], call.outs[0]
    if len(shape_of(x)) != 4 or len(shape_of(w)) != 4:
        raise UnsupportedCall(f"QCONV: the WebGPU kernel is 2-D (x {shape_of(x)}, w {shape_of(w)}); compile 1-D and "
                              "3-D convolutions with fallback='cpu'")
    nb, c_in, h, wd = shape_of(x)
    c_out, cg, kh, kw = shape_of(w)
    _, _, oh, ow = shape_of(y)
    groups = int(call.param("groups", 1))
    (sh, sw), (ph, pw), (dh, dw) = _pairs(call, "stride", 1), _pairs(call, "padding", 0), _pairs(call, "dilation", 1)
    if groups < 1 or c_in != groups * cg or c_out % groups:
        raise UnsupportedCall(f"QCONV: x has {c_in} channels, w {shape_of(w)} with groups={groups}")
    _check_k("QCONV", cg * kh * kw)
    x_dtype, w_dtype, ep = _operands(call, "QCONV", c_out)
    xn, xc, xh, xw = logical_strides(x)
    wo, wc, wh, ww = logical_strides(w)
    # the strides a segment's base is made of (a dim of size 1 contributes none)
    x_side = _side("in0", xc, cg, [s for s, d in ((xn, nb), (xh, h), (xw, wd), (cg * xc, groups)) if d > 1], x_dtype)
    w_side = _side("in1", wc, cg, [s for s, d in ((wo, c_out), (wh, kh), (ww, kw)) if d > 1], w_dtype)
    nt = _tile(c_out // groups)  # the channels of one invocation are in one group
    loop = [f"let n0 = d1 * {nt}u;", f"let g0 = (n0 / {c_out // groups}u) * {cg}u;",
            f"for (var ky = 0u; ky < {kh}u; ky = ky + 1u) {{",
            f"  let iy = i32(d2 * {sh}u + ky * {dh}u) - {ph};",
            f"  for (var kx = 0u; kx < {kw}u; kx = kx + 1u) {{",
            f"    let ix = i32(d3 * {sw}u + kx * {dw}u) - {pw};",
            f"    let inside = iy >= 0 && iy < {h} && ix >= 0 && ix < {wd};",
            "    let xb = select(0u, d0 * " + f"{xn}u + g0 * {xc}u + u32(iy) * {xh}u + u32(ix) * {xw}u, inside);",
            f"    let wb = n0 * {wo}u + ky * {wh}u + kx * {ww}u;",
            "    " + _segment(x_side, "xb", "inside", "wb", wo, nt),
            "  }", "}"]
    body = [unravel("i", [nb, c_out // nt, oh, ow]), *loop[:1], *_reduction(call, x_side, w_side, kh * kw, nt),
            *loop[1:], *_finish_all(call, ep, x_side, kh * kw, nt, lambda n: offset(y, ["d0", n, "d2", "d3"]))]
    shader = per_element(call, numel(y) // nt, "\n  ".join(body), helpers=_helpers(call, x_side, w_side))
    return _checking_bias(shader, "QCONV", call.dispatch.node, cg * kh * kw, ep)
