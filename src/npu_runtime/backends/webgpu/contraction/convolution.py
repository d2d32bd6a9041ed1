"""The generator of CONV: a 2-D convolution over NHWC (or row-major) images as an implicit GEMM, a 1x1 one of
stride 1 as a plain GEMM over the pixels, depthwise and other narrow groups as a direct kernel (one invocation
per output); bias, folded batch norm, residual add and activation in the epilogue."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from npu_program.program import TensorSpec

from ..wgsl import (
    ENTRY_ARGS,
    FLOAT_DTYPES,
    GROUP_ID,
    WORKGROUP,
    Call,
    Shader,
    UnsupportedCall,
    groups,
    literal,
    logical_strides,
    shape_of,
    storage_shape,
    unravel,
)
from .kernel import run
from .operands import Contraction, Load, _act, _flag, _number

#: The direct convolution runs groups with fewer output channels than this (depthwise ones above all).
DIRECT_CONV_CHANNELS = 16


def _pair_param(call: Call, name: str, default: int) -> tuple[int, int]:
    value = call.param(name, default)
    values = list(value) if isinstance(value, list) else [value]
    if len(values) not in (1, 2):
        raise UnsupportedCall(f"{name}={value!r} is not one or two integers")
    values = [int(_number(v, name, True)) for v in values]
    return (values[0], values[-1])


def _pixel_offset(spec: TensorSpec, nb: str, c: str, h: str, w: str) -> str:
    """The offset of element (nb, c, h, w) of a 4-D tensor (terms of size-1 dims dropped)."""
    shape, st = shape_of(spec), logical_strides(spec)
    terms = [f"({v}) * {s}u" if s != 1 else f"({v})" for v, s, d in zip((nb, c, h, w), st, shape) if d > 1]
    return " + ".join(terms) if terms else "0u"


def _image_offset(spec: TensorSpec, m: str, c: str) -> str:
    """The offset of channel ``c`` of pixel ``m`` (flat over N, H, W): one multiply where N, H, W are one run
    of storage (NHWC), else unravelled."""
    n_, _, h, w = shape_of(spec)
    sn, sc, sh, sw = logical_strides(spec)
    if sh == w * sw and sn == h * w * sw:
        return f"({m}) * {sw}u + ({c}) * {sc}u"
    return _pixel_offset(spec, f"({m}) / {h * w}u", c, f"(({m}) / {w}u) % {h}u", f"({m}) % {w}u")


@dataclass(frozen=True)
class _Window:
    """A convolution's sizes: x [batch, c_in, h, wd], w [c_out, cg, kh, kw] in ``n_groups`` groups, output
    pixels oh x ow; stride (sh, sw), padding (ph, pw), dilation (dh, dw)."""

    batch: int
    c_in: int
    h: int
    wd: int
    c_out: int
    cg: int
    kh: int
    kw: int
    oh: int
    ow: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    n_groups: int

    @property
    def cog(self) -> int:
        return self.c_out // self.n_groups

    def pixel(self, m: str) -> list[str]:
        oh, ow = self.oh, self.ow
        return [f"let nb = ({m}) / {oh * ow}u;", f"let oh = (({m}) / {ow}u) % {oh}u;", f"let ow = ({m}) % {ow}u;"]

    def tap(self, xs: TensorSpec, c: str, r: str, s: str) -> list[str]:
        """x at channel c of the window tap (r, s) of pixel (nb, oh, ow); 0 in the padding (u32 wraps below 0)."""
        sh, sw, ph, pw, dh, dw = self.sh, self.sw, self.ph, self.pw, self.dh, self.dw
        lines = [f"let ih = oh * {sh}u + ({r}) * {dh}u - {ph}u;", f"let iw = ow * {sw}u + ({s}) * {dw}u - {pw}u;"]
        value = f"ld_in0({_pixel_offset(xs, 'nb', c, 'ih', 'iw')})"
        if ph or pw:
            return [*lines, f"if (ih >= {self.h}u || iw >= {self.wd}u) {{ return 0.0; }}", f"return {value};"]
        return [*lines, f"return {value};"]


def conv(call: Call) -> Shader:
    """CONV: act(bn(conv(x, w) + bias) [+ residual]); an implicit GEMM, or a direct kernel for
    depthwise and other narrow groups."""
    g, has_bias, eps, residual = _window(call)
    epilogue = _epilogue(call, g.cog, has_bias, eps, residual)
    if g.cog < DIRECT_CONV_CHANNELS:
        functions = (f"fn tap(nb: u32, oh: u32, ow: u32, c: u32, r: u32, s: u32) -> f32 {{ "
                     f"{' '.join(g.tap(call.ins[0], 'c', 'r', 's'))} }}\nfn epi(b: u32, m: u32, n: u32, v0: f32) {{\n"
                     f"  {epilogue}\n}}")
        return _direct_conv(call, functions, g.cog, g.cg, g.kh, g.kw, shape_of(call.outs[0]))
    a, b = _implicit_gemm(call, g)
    return run(call, Contraction("f32", g.n_groups, g.batch * g.oh * g.ow, g.cog, g.cg * g.kh * g.kw, a, [b],
                                 epilogue))


def _window(call: Call) -> tuple[_Window, bool, float | None, bool]:
    """The convolution's sizes, whether it has a bias, its batch norm's eps (None without one) and whether it has a
    residual, all checked against its tensors."""
    if call.ins[0].dtype not in FLOAT_DTYPES:
        raise UnsupportedCall(f"convolution of {call.ins[0].dtype}")
    x, w, out = shape_of(call.ins[0]), shape_of(call.ins[1]), shape_of(call.outs[0])
    if len(x) != 4 or len(w) != 4:
        raise UnsupportedCall(f"only 2-D convolutions (x of shape {x})")
    residual = _flag(call, "has_residual", False)
    has_bias, eps = _flag(call, "has_bias", False), call.param("bn_eps")
    eps = None if eps is None else _number(eps, "bn_eps")
    if len(call.ins) != 2 + has_bias + 4 * (eps is not None) + residual:
        raise UnsupportedCall(f"{len(call.ins)} inputs for has_bias={has_bias}, bn_eps={eps}")
    (sh, sw), (ph, pw) = _pair_param(call, "stride", 1), _pair_param(call, "padding", 0)
    dh, dw = _pair_param(call, "dilation", 1)
    if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise UnsupportedCall(f"stride {[sh, sw]}, padding {[ph, pw]}, dilation {[dh, dw]}")
    n_groups = int(_number(call.param("groups", 1), "groups", True))
    batch, c_in, h, wd = x
    c_out, cg, kh, kw = w
    _, _, oh, ow = out
    if n_groups < 1 or c_in != cg * n_groups or c_out % n_groups or out[:2] != [batch, c_out] \
            or oh != (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1 or ow != (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1:
        raise UnsupportedCall(f"convolution of {x} by {w} to {out} with groups={n_groups}")
    window = _Window(batch, c_in, h, wd, c_out, cg, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, n_groups)
    return window, has_bias, eps, residual


def _epilogue(call: Call, cog: int, has_bias: bool, eps: float | None, residual: bool) -> str:
    """The epilogue: channel co = b·COG + n of pixel m."""
    lines = [f"let co = b * {cog}u + n;", "var v = v0;"]
    if has_bias:
        lines.append("v += ld_in2(co);")
    if eps is not None:
        g0 = 2 + has_bias  # gamma, beta, mean, var
        lines.append(f"v = (v - ld_in{g0 + 2}(co)) / sqrt(ld_in{g0 + 3}(co) + {literal(eps)}) * ld_in{g0}(co) "
                     f"+ ld_in{g0 + 1}(co);")
    if residual:  # read before the store: with inplace_residual the output overwrites this very element
        r = len(call.ins) - 1
        lines.append(f"v += ld_in{r}({_image_offset(call.ins[r], 'm', 'co')});")
    lines.append(f"st_out0({_image_offset(call.outs[0], 'm', 'co')}, {_act(call, 'f32', 'v')});")
    return "\n  ".join(lines)


def _implicit_gemm(call: Call, g: _Window) -> tuple[Load, Load]:
    """Operands A (the pixels' windows) and B (the weights) of the convolution as a GEMM per group."""
    xs, ws = call.ins[0], call.ins[1]
    cg, cog, kh, kw = g.cg, g.cog, g.kh, g.kw
    if kh == kw == 1 and g.sh == g.sw == 1 and g.ph == g.pw == 0 and [g.oh, g.ow] == [g.h, g.wd]:
        a_body = f"return ld_in0({_image_offset(xs, 'r', f'b * {cg}u + k')});"
    elif kh * kw == 1:
        a_body = " ".join([*g.pixel("r"), *g.tap(xs, f"b * {cg}u + k", "0u", "0u")])
    else:  # k = (r · KW + s) · CG + c: channels fastest, contiguous in NHWC
        a_body = " ".join([*g.pixel("r"), f"let c = k % {cg}u;", f"let rs = k / {cg}u;",
                           *g.tap(xs, f"b * {cg}u + c", f"rs / {kw}u", f"rs % {kw}u")])
    if kh * kw == 1:
        b_body = f"return ld_in1({_pixel_offset(ws, f'b * {cog}u + r', 'k', '0u', '0u')});"
    else:
        b_body = (f"let c = k % {cg}u; let rs = k / {cg}u; "
                  f"return ld_in1({_pixel_offset(ws, f'b * {cog}u + r', 'c', f'rs / {kw}u', f'rs % {kw}u')});")
    c_stride = logical_strides(xs)[1]
    a = Load(a_body, k_fast=c_stride == 1, batched=g.n_groups > 1)
    b = Load(b_body, k_fast=kh * kw == 1, batched=g.n_groups > 1)
    return a, b


def _direct_conv(call: Call, functions: str, cog: int, cg: int, kh: int, kw: int, out: Sequence[int]) -> Shader:
    """One invocation per output element, in storage order (neighbours: neighbouring channels in NHWC)."""
    spec = call.outs[0]
    names = ["nb", "oh", "ow", "co"] if spec.layout == "NHWC" else ["nb", "co", "oh", "ow"]
    lines = [unravel("i", storage_shape(spec), "e"), *(f"let {name} = e{q};" for q, name in enumerate(names)),
             f"let m = (nb * {out[2]}u + oh) * {out[3]}u + ow;", f"let b = co / {cog}u;", "var acc = 0.0;",
             f"for (var c = 0u; c < {cg}u; c++) {{",
             f"  for (var r = 0u; r < {kh}u; r++) {{",
             f"    for (var s = 0u; s < {kw}u; s++) {{",
             f"      acc += tap(nb, oh, ow, b * {cg}u + c, r, s) * "
             f"ld_in1({_pixel_offset(call.ins[1], 'co', 'c', 'r', 's')});",
             "    }", "  }", "}", f"epi(b, m, co % {cog}u, acc);"]
    n = math.prod(out)
    code = f"""{call.header()}
{functions}
@compute @workgroup_size({WORKGROUP})
fn main({ENTRY_ARGS}) {{
  let i = {GROUP_ID} * {WORKGROUP}u + lid;
  if (i >= {n}u) {{ return; }}
  {(chr(10) + '  ').join(lines)}
}}
"""
    return Shader(code, groups(-(-n // WORKGROUP)))
