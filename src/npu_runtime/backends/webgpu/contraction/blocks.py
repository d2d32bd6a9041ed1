"""GGUF block-quantized weights as a contraction's B operand: WGSL that reads GGML's blocks where they lie.

A weight slot ``TensorSpec([N, K], "float32", quant=QuantSpec(block=...))`` is bound as its blocks' bytes
(``spec.storage``: uint8 ``[N, K / elements · block bytes]``, the GGUF rows as they are, padded to a whole u32
word on upload), declared ``array<u32>``. Every layout is read as *groups* of consecutive k along a row whose
values are ``a · q + b``, ``(a, b)`` the group's parameters and ``q`` its unsigned or signed codes:

=======  ======  =====  =====================================================================================
layout   bytes   group  a, b (``d``, ``dmin``: the block's fp16 scales, read with ``unpack2x16float``)
=======  ======  =====  =====================================================================================
q8_0     34      32     d, 0 (int8 codes)
q4_0     18      32     d, -8 d (4-bit codes, low nibbles then high nibbles)
q5_0     22      32     d, -16 d (q4_0's nibbles at byte 6, each code's 5th bit in the u32 ``qh`` at byte 2: bit e)
q4_K     144     32     d · sc, -dmin · m (6-bit sc, m of the 8 sub-blocks in 12 bytes: ggml's get_scale_min_k4)
q6_K     210     16     d · sc, -32 d · sc (low 4 bits in ql, high 2 in qh, int8 sc per 16 elements)
=======  ======  =====  =====================================================================================

so a dot product over a group is ``a · Σ q x + b · Σ x``: the GEMV (``qgemv``) reads each group's parameters once
and its codes four at a time (one u32 word: 4 int8 codes, or 4 nibbles of a word shifted and masked). Blocks of
q8_0, q4_0, q5_0 and q6_K are 2-byte aligned only (34, 18, 22, 210 bytes), so a word at an address ≡ 2 (mod 4) is put
together from the halves of two; q4_K's are word-aligned.

For input ``i`` the natural functions are ``bp{i}(r, g) -> vec2<f32>`` (a, b of group g of row r) and
``bq{i}(r, g, c) -> vec4<f32>`` (codes 4c .. 4c + 3 of that group); a contraction whose operands have different
groups (a q6_K v beside q4_K q and k) reads them all at the smallest group (``adapt``). The per-element load
(the tiled kernel: prefill) is ``a · q + b`` of one code, its group's parameters read again for each element.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from npu_program.kernel_record import BLOCK_WEIGHT_INPUTS
from npu_program.program import block_of

from ..wgsl import Call, UnsupportedCall, shape_of

U8X4 = "vec4<f32>(vec4<u32>({v}, {v} >> 8u, {v} >> 16u, {v} >> 24u) & vec4<u32>(0xffu))"
S8X4 = "vec4<f32>(bitcast<vec4<i32>>(vec4<u32>({v} << 24u, {v} << 16u, {v} << 8u, {v})) >> vec4<u32>(24u))"

# per layout: (elements per block, bytes per block, elements per group, params body, codes body); ``A`` is the
# block's byte address, ``s`` the group within the block, ``c`` the word of codes in the group
_LAYOUTS: dict[str, tuple[int, int, int, str, str]] = {
    "q8_0": (32, 34, 32, "return vec2<f32>(H(A), 0.0);",
             "let v = W4(A + 2u + 4u * c); return " + S8X4.format(v="v") + ";"),
    "q4_0": (32, 18, 32, "let d = H(A); return vec2<f32>(d, -8.0 * d);",
             "let v = (W4(A + 2u + 4u * (c % 4u)) >> (4u * (c / 4u))) & 0x0f0f0f0fu; return "
             + U8X4.format(v="v") + ";"),
    # word c: nibbles as q4_0's, and qh's bits 4c .. 4c + 3 moved to bit 4 of bytes 0 .. 3 (codes 0 .. 31)
    "q5_0": (32, 22, 32, "let d = H(A); return vec2<f32>(d, -16.0 * d);",
             "let n = (W4(A + 6u + 4u * (c % 4u)) >> (4u * (c / 4u))) & 0x0f0f0f0fu; let h = (W4(A + 2u) >> (4u * c)); "
             "let v = n | ((h & 1u) << 4u) | ((h & 2u) << 11u) | ((h & 4u) << 18u) | ((h & 8u) << 25u); return "
             + U8X4.format(v="v") + ";"),
    "q4_K": (256, 144, 32,
             "let w = A / 4u; let dd = unpack2x16float(IN[w]); let t = (s % 4u) * 8u; "
             "let lo = IN[w + 1u] >> t; let mid = IN[w + 2u] >> t; let hi = IN[w + 3u] >> t; "
             "var sc = lo & 63u; var m = mid & 63u; "
             "if (s >= 4u) { sc = (hi & 15u) | (((lo >> 6u) & 3u) << 4u); m = ((hi >> 4u) & 15u) | "
             "(((mid >> 6u) & 3u) << 4u); } "
             "return vec2<f32>(dd.x * f32(sc), -dd.y * f32(m));",
             "let v = (IN[(A + 16u + 32u * (s / 2u) + 4u * c) / 4u] >> (4u * (s % 2u))) & 0x0f0f0f0fu; return "
             + U8X4.format(v="v") + ";"),
    "q6_K": (256, 210, 16,
             "let sc = f32(bitcast<i32>(B1(A + 192u + s) << 24u) >> 24u); let a = H(A + 208u) * f32(sc); "
             "return vec2<f32>(a, -32.0 * a);",
             "let u = s % 8u; let h = s / 8u; "
             "let lo = (W4(A + 64u * h + 16u * (u % 4u) + 4u * c) >> (4u * (u / 4u))) & 0x0f0f0f0fu; "
             "let hi = (W4(A + 128u + 32u * h + 16u * (u % 2u) + 4u * c) >> (2u * (u / 2u))) & 0x03030303u; "
             "let v = lo | (hi << 4u); return " + U8X4.format(v="v") + ";"),
}


@dataclass(frozen=True)
class Blocks:
    """A B operand read by groups: ``params(r, g)`` and ``codes(r, g, c)`` (WGSL function names), ``size``
    elements per group, ``deps`` the WGSL defining them."""

    size: int
    params: str
    codes: str
    deps: str


def check_block_call(call: Call) -> None:
    """Refuse, before any WGSL is made, a dispatch that would read block bytes as floats: a block-quantized
    tensor may only be a weight ``[N, K]`` of GEMM, GATE_UP or QKV_PROJ (whose loads decode the blocks)."""
    kernel = call.dispatch.kernel
    if call.dispatch.params.get("x_int8_group") is not None:
        raise UnsupportedCall(f"{kernel} rounds x to int8 groups (x_int8_group, llama.cpp's quantized activations); "
                              "the WebGPU kernels compute with x as it is: load the model without int8 activations")
    for spec in call.outs:
        if block_of(spec) is not None:
            raise UnsupportedCall(f"output {spec.name!r} of {kernel} is {block_of(spec)} blocks; no WebGPU kernel "
                                  "writes block-quantized tensors")
    for i, spec in enumerate(call.ins):
        if block_of(spec) is not None and i not in BLOCK_WEIGHT_INPUTS.get(kernel, ()):
            raise UnsupportedCall(
                f"input {i} ({spec.name!r}) of {kernel} is a {block_of(spec)} block-quantized tensor; the WebGPU "
                f"backend reads GGUF blocks only as the weights of {', '.join(BLOCK_WEIGHT_INPUTS)} (dequantize it to "
                "floats at load time, or compile with fallback='cpu')")


def _bytes(i: int) -> str:
    """Byte reads of input ``i`` (an ``array<u32>`` of little-endian bytes); addresses of W4, H are even."""
    return f"""
fn qw4_{i}(a: u32) -> u32 {{
  let w = a >> 2u;
  if ((a & 2u) == 0u) {{ return in{i}[w]; }}
  return (in{i}[w] >> 16u) | (in{i}[w + 1u] << 16u);
}}
fn qh_{i}(a: u32) -> f32 {{ return unpack2x16float(in{i}[a >> 2u] >> ((a & 2u) * 8u)).x; }}
fn qb_{i}(a: u32) -> u32 {{ return (in{i}[a >> 2u] >> ((a & 3u) * 8u)) & 0xffu; }}"""


def block_operand(call: Call, i: int, n: int, k: int) -> tuple[str, Blocks]:
    """Input ``i``, a block-quantized ``[n, k]`` weight: the per-element load's body and its group reads."""
    spec = call.ins[i]
    layout = block_of(spec)
    if layout not in _LAYOUTS:
        raise UnsupportedCall(f"weight {spec.name!r} is in block layout {layout!r}, which the WebGPU kernels do not "
                              f"read (they read {', '.join(_LAYOUTS)})")
    if shape_of(spec) != [n, k]:
        raise UnsupportedCall(f"block-quantized weight {spec.name!r} has shape {shape_of(spec)}, not {[n, k]}: "
                              "its blocks run along K")
    elems, nbytes, size, params, codes = _LAYOUTS[layout]
    row = k // elems * nbytes
    per_block = elems // size

    def fill(body: str) -> str:
        for key, value in (("W4(", f"qw4_{i}("), ("H(", f"qh_{i}("), ("B1(", f"qb_{i}("), ("IN[", f"in{i}[")):
            body = body.replace(key, value)
        return body

    where = f"let A = r * {row}u + (g / {per_block}u) * {nbytes}u; let s = g % {per_block}u;"
    deps = (_bytes(i) + f"\nfn bp{i}(r: u32, g: u32) -> vec2<f32> {{ {where} {fill(params)} }}"
            f"\nfn bq{i}(r: u32, g: u32, c: u32) -> vec4<f32> {{ {where} {fill(codes)} }}")
    body = (f"let p = bp{i}(r, k / {size}u); "
            f"return p.x * bq{i}(r, k / {size}u, (k % {size}u) / 4u)[k % 4u] + p.y;")
    return body, Blocks(size, f"bp{i}", f"bq{i}", deps)


def adapt(blocks: Blocks | None, element: str, size: int, name: str) -> str:
    """``fn {name}p(r, g)`` and ``fn {name}q(r, g, c)``: an operand read in groups of ``size`` (which divides its
    own); a float operand (``blocks`` None) through its per-element load ``element(b, r, k)``, as a = 1, b = 0."""
    head_p, head_q = f"fn {name}p(r: u32, g: u32) -> vec2<f32>", f"fn {name}q(r: u32, g: u32, c: u32) -> vec4<f32>"
    if blocks is None:
        at = f"g * {size}u + 4u * c"
        return (f"{head_p} {{ return vec2<f32>(1.0, 0.0); }}\n{head_q} {{ return vec4<f32>("
                + ", ".join(f"{element}(0u, r, {at} + {q}u)" for q in range(4)) + "); }")
    ratio = blocks.size // size
    if ratio == 1:
        return (f"{head_p} {{ return {blocks.params}(r, g); }}\n"
                f"{head_q} {{ return {blocks.codes}(r, g, c); }}")
    return (f"{head_p} {{ return {blocks.params}(r, g / {ratio}u); }}\n"
            f"{head_q} {{ return {blocks.codes}(r, g / {ratio}u, (g % {ratio}u) * {size // 4}u + c); }}")


def select_blocks(parts: Sequence[Blocks | None], widths: Sequence[int], name: str) -> Blocks | None:
    """Group reads of operands stacked along n (QKV_PROJ's three weights, per-element loads ``{name}_{j}``):
    None when none is block-quantized, else each read at the smallest group and chosen by the row's range."""
    if all(p is None for p in parts):
        return None
    size = min(p.size for p in parts if p is not None)
    deps, ps, qs, start = [], [], [], 0
    for j, (part, width) in enumerate(zip(parts, widths)):
        deps.append(adapt(part, f"{name}_{j}", size, f"{name}_g{j}"))
        test = f"if (r < {start + width}u) " if j < len(parts) - 1 else ""
        ps.append(f"{test}{{ return {name}_g{j}p(r - {start}u, g); }}")
        qs.append(f"{test}{{ return {name}_g{j}q(r - {start}u, g, c); }}")
        start += width
    deps.append(f"fn {name}_gp(r: u32, g: u32) -> vec2<f32> {{ {' '.join(ps)} }}")
    deps.append(f"fn {name}_gq(r: u32, g: u32, c: u32) -> vec4<f32> {{ {' '.join(qs)} }}")
    return Blocks(size, f"{name}_gp", f"{name}_gq", "\n".join(deps))
