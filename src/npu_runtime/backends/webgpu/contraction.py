"""WGSL generators of the contraction kernels: GEMM, GATE_UP, QKV_PROJ, CONV (with its residual add), and the ATen
matrix products (mm, bmm, matmul, baddbmm).

Every one of them is the same batched product ``C[b, m, n] = sum_k A(b, m, k) · B(b, n, k)`` with its own
operand loads (``Load``: WGSL functions of (b, row, k), layout-aware) and epilogue (bias, folded batch norm,
residual, activation, the output's index mapping), run by one of two kernels:

* the *tiled* kernel: a workgroup of 8x8 invocations computes a 64x64 tile of C, 8x8 outputs per invocation,
  staging 16-deep slices of A and B through workgroup memory as vec4s, double-buffered (one barrier per
  slice); any M, N, K (the edges load zeros);
* the *GEMV* kernel, when C has at most ``GEMV_ROWS`` rows and B is the same for every batch (one-token LLM
  decode): a workgroup of 32 invocations computes 8 outputs n, the invocations splitting K, reading B's rows
  coalesced (two bfloat16/float16 values per u32 word where the layout allows), then a tree reduction in
  workgroup memory.

A convolution is an implicit GEMM over NHWC (M = output pixels, N = output channels of a group, K = kernel
window x input channels of the group, channels fastest, so A's loads are contiguous), batched over groups; a
1x1 convolution of stride 1 is a plain GEMM over the NHWC pixels; depthwise and other narrow-group
convolutions run a direct kernel (one invocation per output). Floating tensors accumulate in f32 (rounded
once, at the store), integer ones in i32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from npu_program.program import TensorSpec

from .wgsl import (
    ENTRY_ARGS,
    FLOAT_DTYPES,
    GROUP_ID,
    WORKGROUP,
    Call,
    Shader,
    UnsupportedCall,
    activation,
    groups,
    literal,
    logical_strides,
    shape_of,
    storage_shape,
    strides,
    unravel,
)

#: Rows of C (the product of x's leading dims) up to which a contraction with a fixed B runs the GEMV kernel.
GEMV_ROWS = 4
#: The GEMV kernel's workgroup: GEMV_THREADS invocations (one warp) computing GEMV_OUTS outputs (see ``_gemv``),
#: their partial sums added GEMV_RADIX at a time (each level of the tree is a barrier, which lavapipe runs as a
#: switch between the workgroup's SIMD chunks: small workgroups and few levels make its GEMV several times faster).
GEMV_THREADS, GEMV_OUTS, GEMV_RADIX = 32, 8, 8
#: The direct convolution runs groups with fewer output channels than this (depthwise ones above all).
DIRECT_CONV_CHANNELS = 16


# -- offsets ------------------------------------------------------------------------------------------------

def _aligned_strides(spec: TensorSpec, full: Sequence[int]) -> list[int]:
    """``spec``'s storage stride per dim of the iteration shape ``full`` it broadcasts to (0 where it repeats)."""
    shape, st = shape_of(spec), logical_strides(spec)
    pad = len(full) - len(shape)
    if pad < 0:
        raise UnsupportedCall(f"a tensor of shape {shape} does not broadcast to {list(full)}")
    return [0] * pad + [0 if d == 1 else s for d, s in zip(shape, st)]


def _offset(spec: TensorSpec, parts: Sequence[tuple[str, Sequence[int]]]) -> str:
    """The storage offset of ``spec`` where each part ``(index, dims)`` is a row-major flat index over a run of
    consecutive iteration dims (the parts' dims concatenated are the iteration shape ``spec`` broadcasts to).

    A run whose strides are those of a contiguous block costs one multiply; others are unravelled."""
    full = [d for _, dims in parts for d in dims]
    st = _aligned_strides(spec, full)
    terms, at = [], 0
    for var, dims in parts:
        sts, at = st[at:at + len(dims)], at + len(dims)
        live = [(d, cs, s) for d, cs, s in zip(dims, strides(dims), sts) if d > 1]
        if not any(s for _, _, s in live):
            continue
        scale = live[-1][2] // live[-1][1]
        if all(s == cs * scale for _, cs, s in live):  # a broadcast dim (stride 0) among others breaks this
            terms.append(f"({var})" if scale == 1 else f"({var}) * {scale}u")
            continue
        total = math.prod(dims)
        for d, cs, s in (x for x in live if x[2]):
            q = f"({var})" if cs == 1 else f"({var}) / {cs}u"
            q = f"({q}) % {d}u" if cs * d < total else q
            terms.append(f"({q}) * {s}u")
    return " + ".join(terms) if terms else "0u"


def _even_strides(spec: TensorSpec, skip: int) -> bool:
    """Whether every stride of ``spec`` but that of logical dim ``skip`` is even (a pair at an even k is then
    one aligned u32 word)."""
    st = logical_strides(spec)
    return all(s % 2 == 0 or d == 1 for i, (d, s) in enumerate(zip(shape_of(spec), st)) if i != skip % len(st))


def _pair_loader(call: Call, i: int, t: str) -> str | None:
    """``fn ld2_in{i}(o) -> vec2<t>``: elements ``o`` and ``o + 1`` (``o`` even) of input ``i``, one u32 word for
    16-bit floats (halving the loads); None where the dtype or binding does not allow it."""
    dtype = call.ins[i].dtype
    if t != "f32" or dtype not in FLOAT_DTYPES or i in call.in_place.values():
        return None
    head = f"fn ld2_in{i}(o: u32) -> vec2<f32> {{"
    if dtype == "bfloat16":  # a word holds element o in its low half, o + 1 in its high half
        return f"{head} let w = in{i}[o / 2u]; return vec2<f32>(bitcast<f32>(w << 16u), " \
               f"bitcast<f32>(w & 0xffff0000u)); }}"
    if dtype == "float16" and not call.has_f16:
        return f"{head} return unpack2x16float(in{i}[o / 2u]); }}"
    return f"{head} return vec2<f32>(ld_in{i}(o), ld_in{i}(o + 1u)); }}"


# -- operands -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Load:
    """How a kernel reads one operand: ``fn NAME(b, r, k) -> T`` (``r`` is m for A, n for B; in-range indices),
    and ``fn NAME2(b, r, k) -> vec2<T>`` of k and k + 1 for even k where a pair is one load (else None)."""

    body: str  # the element function's body
    pair_body: str | None = None
    k_fast: bool = True  # k has storage stride 1: a tile is loaded k-fastest (coalesced)
    batched: bool = False  # depends on b
    deps: str = ""  # WGSL the bodies call

    def code(self, name: str, t: str) -> str:
        text = f"{self.deps}\nfn {name}(b: u32, r: u32, k: u32) -> {t} {{ {self.body} }}"
        if self.pair_body is not None:
            text += f"\nfn {name}2(b: u32, r: u32, k: u32) -> vec2<{t}> {{ {self.pair_body} }}"
        return text


def _tensor_load(call: Call, i: int, t: str, parts: Sequence[tuple[str, Sequence[int]]], k_dim: int,
                 k_size: int) -> Load:
    """A load of input ``i`` whose logical dims are ``parts`` (flat indices over runs of dims, among them ``k``,
    which is logical dim ``k_dim`` of the input)."""
    spec = call.ins[i]
    off = _offset(spec, parts)
    k_stride = logical_strides(spec)[k_dim] if shape_of(spec) else 0
    pair = _pair_loader(call, i, t)
    pairs = pair is not None and k_stride == 1 and k_size % 2 == 0 and _even_strides(spec, k_dim)
    full = [d for _, dims in parts for d in dims]
    lead = len(parts[0][1]) if parts[0][0] == "b" else 0  # the batch dims come first
    batched = any(s for s in _aligned_strides(spec, full)[:lead])
    return Load(f"return {t}(ld_in{i}({off}));", f"return ld2_in{i}({off});" if pairs else None,
                k_fast=k_stride == 1, batched=batched, deps=pair if pairs else "")


def _select_load(loads: Sequence[Load], widths: Sequence[int], t: str, name: str) -> Load:
    """One B operand of several stacked along n (QKV_PROJ's three weights): row r of the ``j``-th
    when r is in its range."""
    deps, body, pair_body, start = [], [], [], 0
    for j, (load, width) in enumerate(zip(loads, widths)):
        deps.append(load.code(f"{name}_{j}", t))
        test = f"if (r < {start + width}u) " if j < len(loads) - 1 else ""
        body.append(f"{test}{{ return {name}_{j}(b, r - {start}u, k); }}")
        pair_body.append(f"{test}{{ return {name}_{j}2(b, r - {start}u, k); }}")
        start += width
    pairs = all(load.pair_body is not None for load in loads)
    return Load(" ".join(body), " ".join(pair_body) if pairs else None, k_fast=all(x.k_fast for x in loads),
                batched=any(x.batched for x in loads), deps="\n".join(deps))


@dataclass
class Contraction:
    """``C[b, m, n] = sum_k A(b, m, k) · B_j(b, n, k)`` for each B operand j, then ``epi(b, m, n, c_0, ...)``."""

    t: str  # the computation type: f32, or i32 for integer tensors
    batch: int
    m: int
    n: int
    k: int
    a: Load
    bs: list[Load]
    epilogue: str  # body of fn epi(b: u32, m: u32, n: u32, v0: T[, v1: T])

    def functions(self) -> str:
        """The WGSL of ``la``, ``lb0``, ... and ``epi``."""
        args = ", ".join(f"v{j}: {self.t}" for j in range(len(self.bs)))
        loads = [self.a.code("la", self.t), *(b.code(f"lb{j}", self.t) for j, b in enumerate(self.bs))]
        return "\n".join([*loads, f"fn epi(b: u32, m: u32, n: u32, {args}) {{\n  {self.epilogue}\n}}"])


def run(call: Call, c: Contraction) -> Shader:
    """The GEMV kernel where C has few rows and B is fixed, else the tiled one."""
    if 0 < c.batch * c.m <= GEMV_ROWS and c.n and not any(b.batched for b in c.bs):
        return _gemv(call, c)
    return _tiled(call, c)


@dataclass(frozen=True)
class Tiling:
    """The tiled kernel's shape: threads_m x threads_n invocations, each computing per_m x per_n outputs
    (multiples of 4: vec4s of workgroup memory), over slices of ``depth`` (a multiple of 4) along K."""

    threads_m: int = 8
    threads_n: int = 8
    per_m: int = 8
    per_n: int = 8
    depth: int = 16

    @property
    def size(self) -> int:
        return self.threads_m * self.threads_n


#: The tiled kernel's shape: 64x64 tiles, 8x8 outputs per invocation. Every workgroup-memory access is a vec4
#: and each invocation does 16 of them per 256 multiply-adds (a software rasterizer such as lavapipe runs
#: each access as a loop over its SIMD lanes, so the ratio sets its speed).
TILING = Tiling()


def _tiled(call: Call, c: Contraction) -> Shader:
    tiling = TILING
    t, nb, wg = c.t, len(c.bs), tiling.size
    bk = tiling.depth // nb  # two B operands (GATE_UP): half as deep, to stay in 16 KiB of workgroup memory
    pm, pn = tiling.per_m, tiling.per_n
    bm, bn = tiling.threads_m * pm, tiling.threads_n * pn
    tiles_m, tiles_n = -(-c.m // bm), -(-c.n // bn)
    n_groups = c.batch * tiles_m * tiles_n
    vec = f"vec4<{t}>"

    def stage(array: str, fn: str, load: Load, width: int, limit: int, base: str) -> str:
        """Load a depth x width slice into ``array``, a vec4 of 4 consecutive elements per store: along k as
        [r][k / 4] where k is contiguous in storage, else along r as [k][r / 4] (either way neighbouring
        invocations read neighbouring elements)."""
        count = width * bk // 4
        if load.k_fast:
            where = f"let r = e / {bk // 4}u; let kk = (e % {bk // 4}u) * 4u;"
            rr, kk, index = "r", "kk + q", f"r * {bk // 4}u + kk / 4u"
        else:
            where = f"let r = (e % {width // 4}u) * 4u; let kk = e / {width // 4}u;"
            rr, kk, index = "r + q", "kk", f"kk * {width // 4}u + r / 4u"
        # one load in a loop rather than four: each load site is a loop over the SIMD lanes in lavapipe,
        # and the sites, not the iterations, set how long the shader takes to compile
        if load.k_fast and load.pair_body is not None and c.k % 2 == 0:  # two 16-bit values per word
            values = [f"var v = {vec}();", "for (var q = 0u; q < 4u; q += 2u) {",
                      f"  if ({base} + r < {limit}u && k0 + kk + q < {c.k}u) {{ let p = {fn}2(b, {base} + r, "
                      "k0 + kk + q); v[q] = p.x; v[q + 1u] = p.y; }", "}"]
        else:
            values = [f"var v = {vec}();", "for (var q = 0u; q < 4u; q++) {",
                      f"  if ({base} + {rr} < {limit}u && k0 + {kk} < {c.k}u) {{ v[q] = {fn}(b, {base} + {rr}, "
                      f"k0 + {kk}); }}", "}"]
        body = "\n      ".join([where, *values, f"{array}[buf * {width * bk // 4}u + {index}] = v;"])
        return f"for (var e = lid; e < {count}u; e += {wg}u) {{\n      {body}\n    }}"

    def operand(array: str, load: Load, width: int, per: int, first: str) -> tuple[list[str], list[list[str]]]:
        """The loads of one k4 step of an invocation's ``per`` rows (``first`` the first), and the
        expression of each (row, kk) value."""
        at = f"buf * {width * bk // 4}u"
        if load.k_fast:
            lines = [f"let {array}{i} = {array}[{at} + ({first} + {i}u) * {bk // 4}u + k4];" for i in range(per)]
            return lines, [[f"{array}{i}[{kk}]" for kk in range(4)] for i in range(per)]
        lines = [f"let {array}{kk}_{q} = {array}[{at} + (k4 * 4u + {kk}u) * {width // 4}u + {first} / 4u + {q}u];"
                 for kk in range(4) for q in range(per // 4)]
        return lines, [[f"{array}{kk}_{i // 4}[{i % 4}]" for kk in range(4)] for i in range(per)]

    loads = [stage("As", "la", c.a, bm, c.m, "m0")]
    loads += [stage(f"Bs{j}", f"lb{j}", b, bn, c.n, "n0") for j, b in enumerate(c.bs)]
    fma, a_of = operand("As", c.a, bm, pm, f"ty * {pm}u")
    for j, b in enumerate(c.bs):
        lines, b_of = operand(f"Bs{j}", b, bn, pn, f"tx * {pn}u")
        fma += lines
        for kk in range(4):
            for i in range(pm):
                fma += [f"c{j}_{i}_{q} += {a_of[i][kk]} * {vec}({', '.join(b_of[4 * q + x][kk] for x in range(4))});"
                        for q in range(pn // 4)]
    accs = [f"var c{j}_{i}_{q} = {vec}();" for j in range(nb) for i in range(pm) for q in range(pn // 4)]
    # the results into arrays, so that the epilogue is written (and compiled) once, not per output
    keep = [f"var r{j}: array<{vec}, {pm * pn // 4}>;" for j in range(nb)]
    keep += [f"r{j}[{i * (pn // 4) + q}] = c{j}_{i}_{q};" for j in range(nb) for i in range(pm) for q in range(pn // 4)]
    values = ", ".join(f"r{j}[i * {pn // 4}u + x / 4u][x % 4u]" for j in range(nb))
    # two buffers of each slice: the next slice is staged while this one is read, one barrier between them
    shared = "\n".join([f"var<workgroup> As: array<{vec}, {2 * bk * bm // 4}>;",
                        *(f"var<workgroup> Bs{j}: array<{vec}, {2 * bk * bn // 4}>;" for j in range(nb))])
    nl = "\n"
    code = f"""{call.header()}
{c.functions()}
{shared}
@compute @workgroup_size({wg})
fn main({ENTRY_ARGS}) {{
  let g = {GROUP_ID};
  if (g >= {n_groups}u) {{ return; }}
  let tn = g % {tiles_n}u; let rest = g / {tiles_n}u;
  let m0 = (rest % {tiles_m}u) * {bm}u; let b = rest / {tiles_m}u; let n0 = tn * {bn}u;
  let tx = lid % {tiling.threads_n}u; let ty = lid / {tiling.threads_n}u;
  {' '.join(accs)}
  {{ let buf = 0u; let k0 = 0u;
    {(nl + '    ').join(loads)}
  }}
  workgroupBarrier();
  for (var k = 0u; k < {c.k}u; k += {bk}u) {{
    {{ let buf = (k / {bk}u) % 2u;
      for (var k4 = 0u; k4 < {bk // 4}u; k4++) {{
        {(nl + '        ').join(fma)}
      }}
    }}
    let k0 = k + {bk}u;
    if (k0 < {c.k}u) {{ let buf = (k0 / {bk}u) % 2u;
      {(nl + '      ').join(loads)}
    }}
    workgroupBarrier();
  }}
  {(nl + '  ').join(keep)}
  for (var i = 0u; i < {pm}u; i++) {{
    let m = m0 + ty * {pm}u + i;
    for (var x = 0u; x < {pn}u; x++) {{
      let n = n0 + tx * {pn}u + x;
      if (m < {c.m}u && n < {c.n}u) {{ epi(b, m, n, {values}); }}
    }}
  }}
}}
"""
    return Shader(code, groups(n_groups))


def _gemv(call: Call, c: Contraction) -> Shader:
    """Few rows (C has at most GEMV_ROWS): a workgroup computes GEMV_OUTS consecutive outputs n for every row,
    its GEMV_THREADS invocations splitting K, each reading a row's x once for all those outputs. Where B is
    contiguous along k, an invocation takes 4 consecutive k at a time (two u32 words of 16-bit values where
    possible) and its neighbours the next 4 of the same rows of B (coalesced); else GEMV_THREADS / 4 groups
    of GEMV_OUTS outputs, 4 invocations splitting K for each (neighbours read neighbouring n). The partial
    sums meet in a tree reduction in workgroup memory."""
    t, nb, rows, outs, wg = c.t, len(c.bs), c.batch * c.m, GEMV_OUTS, GEMV_THREADS
    vec = f"vec4<{t}>"
    along_k = all(b.k_fast for b in c.bs)
    slices = wg if along_k else 4  # invocations splitting K for one output
    per_group = outs * (wg // slices)
    n_groups = -(-c.n // per_group)
    coords = [(f"{r // c.m}u", f"{r % c.m}u") for r in range(rows)]
    body, n = [], [f"min(n0 + {o}u, {c.n - 1}u)" for o in range(outs)]  # past N: row N - 1 again, not stored
    if along_k:
        full = c.k // 4 * 4  # groups of 4 k; the last K % 4 are added one by one
        pairs = c.k % 2 == 0 and all(b.pair_body is not None for b in c.bs)
        a_pairs = c.k % 2 == 0 and c.a.pair_body is not None

        def four(fn: str, x: str, y: str, paired: bool) -> str:
            if paired:
                return f"{vec}({fn}2({x}, {y}, k), {fn}2({x}, {y}, k + 2u))"
            return f"{vec}({', '.join(f'{fn}({x}, {y}, k + {q}u)' for q in range(4))})"

        body.append(f"for (var k = 4u * lid; k < {full}u; k += {4 * wg}u) {{")
        for r, (bi, mi) in enumerate(coords):
            body.append(f"  let x{r} = {four('la', bi, mi, a_pairs)};")
        for o in range(outs):
            for q in range(nb):
                body.append(f"  let w{q}_{o} = {four(f'lb{q}', '0u', n[o], pairs)};")
                body += [f"  s{q}_{o}_{r} += dot(x{r}, w{q}_{o});" for r in range(rows)]
        body.append("}")
        tail = (f"{full}u + lid", f"{wg}u") if full < c.k else None
    else:
        tail = (f"lid / {wg // slices}u", f"{slices}u")
    if tail is not None:
        body.append(f"for (var k = {tail[0]}; k < {c.k}u; k += {tail[1]}) {{")
        body += [f"  let x{r} = la({bi}, {mi}, k);" for r, (bi, mi) in enumerate(coords)]
        for o in range(outs):
            body += [f"  let w{q}_{o} = lb{q}(0u, {n[o]}, k);" for q in range(nb)]
            body += [f"  s{q}_{o}_{r} += x{r} * w{q}_{o};" for q in range(nb) for r in range(rows)]
        body.append("}")
    sums = [f"s{q}_{o}_{r}" for q in range(nb) for o in range(outs) for r in range(rows)]
    width = len(sums)  # partial sums per invocation
    body += [f"red[lid * {width}u + {i}u] = {v};" for i, v in enumerate(sums)]
    # the tree: partial sums of slice s of output group p at red[(s · stride + p) · width + i]; each level
    # adds GEMV_RADIX slices into one, its sums spread over every invocation; the last level adds the rest and
    # stores through the epilogue
    stride = wg // slices  # output groups per workgroup (invocations between two slices of one group)
    count = slices
    body.append("workgroupBarrier();")
    while count > GEMV_RADIX:
        nxt = -(-count // GEMV_RADIX)
        adds = [f"if (d + {j * nxt}u < {count}u) {{ v += red[((d + {j * nxt}u) * {stride}u + p) * {width}u + i]; }}"
                if (j + 1) * nxt > count else f"v += red[((d + {j * nxt}u) * {stride}u + p) * {width}u + i];"
                for j in range(1, GEMV_RADIX) if j * nxt < count]
        body += [f"for (var e = lid; e < {nxt * stride * width}u; e += {wg}u) {{",
                 f"  let i = e % {width}u; let p = (e / {width}u) % {stride}u; let d = e / {width * stride}u;",
                 f"  var v = red[(d * {stride}u + p) * {width}u + i]; {' '.join(adds)}",
                 f"  red[(d * {stride}u + p) * {width}u + i] = v;", "}", "workgroupBarrier();"]
        count = nxt
    body += [f"for (var e = lid; e < {stride * outs * rows}u; e += {wg}u) {{",
             f"  let i = e % {outs * rows}u; let p = e / {outs * rows}u;",
             f"  let n = g * {per_group}u + p * {outs}u + i / {rows}u; let r = i % {rows}u;",
             f"  var v = array<{t}, {nb}>();",
             f"  for (var s = 0u; s < {count}u; s++) {{",
             *(f"    v[{q}] += red[(s * {stride}u + p) * {width}u + {q * outs * rows}u + i];" for q in range(nb)),
             "  }",
             f"  if (n < {c.n}u) {{ epi(r / {c.m}u, r % {c.m}u, n, {', '.join(f'v[{q}]' for q in range(nb))}); }}",
             "}"]
    first = f"g * {per_group}u" if along_k else f"g * {per_group}u + (lid % {stride}u) * {outs}u"
    nl = "\n  "
    code = f"""{call.header()}
{c.functions()}
var<workgroup> red: array<{t}, {wg * width}>;
@compute @workgroup_size({wg})
fn main({ENTRY_ARGS}) {{
  let g = {GROUP_ID};
  if (g >= {n_groups}u) {{ return; }}
  let n0 = {first};
  {' '.join(f'var {v} = {t}(0);' for v in sums)}
  {nl.join(body)}
}}
"""
    return Shader(code, groups(n_groups))


# -- shared pieces ------------------------------------------------------------------------------------------

def _compute_type(call: Call) -> str:
    return "f32" if any(s.dtype in FLOAT_DTYPES for s in (*call.ins, *call.outs)) else "i32"


def _act(call: Call, t: str, x: str) -> str:
    name = call.param("activation")
    if name is not None and t != "f32":
        raise UnsupportedCall(f"activation {name!r} of an integer contraction")
    return activation(name, x)


def _flag(call: Call, name: str, default: bool) -> bool:
    return bool(call.param(name, default))


def _number(value: object, name: str, integer: bool = False) -> float:
    """A parameter that must be a number (an integer with ``integer``): a program file is untrusted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise UnsupportedCall(f"{name}={value!r} is not {'an integer' if integer else 'a number'}")
    return int(value) if integer else float(value)


def _weight_load(call: Call, i: int, t: str, trans_b: bool, n: int, k: int) -> Load:
    """A 2-D weight ``[N, K]`` (``trans_b``) or ``[K, N]`` as operand B."""
    w = shape_of(call.ins[i])
    if len(w) != 2 or (w != [n, k] if trans_b else w != [k, n]):
        raise UnsupportedCall(f"weight {i} has shape {w}, not {[n, k] if trans_b else [k, n]}")
    if trans_b:
        return _tensor_load(call, i, t, [("r", [n]), ("k", [k])], 1, k)
    return _tensor_load(call, i, t, [("k", [k]), ("r", [n])], 0, k)


def _rows_load(call: Call, t: str, lead: Sequence[int], k: int) -> Load:
    """Input 0 ``[*lead, K]`` as operand A with m flat over ``lead`` (no batch)."""
    return _tensor_load(call, 0, t, [("r", lead), ("k", [k])], len(lead), k)


# -- GEMM, GATE_UP, QKV_PROJ --------------------------------------------------------------------------------

def gemm(call: Call) -> Shader:
    """GEMM: y = act(x · w(ᵀ) + bias [+ residual]), x batched over its leading dims, w 2-D."""
    t = _compute_type(call)
    trans_a, trans_b = _flag(call, "trans_a", False), _flag(call, "trans_b", True)
    has_residual = _flag(call, "has_residual", False)
    has_bias = call.params.get("has_bias")
    has_bias = bool(has_bias) if has_bias is not None else len(call.ins) == 3 + has_residual
    if len(call.ins) != 2 + has_bias + has_residual:
        raise UnsupportedCall(f"{len(call.ins)} inputs for has_bias={has_bias}, has_residual={has_residual}")
    x, out = shape_of(call.ins[0]), shape_of(call.outs[0])
    w = shape_of(call.ins[1])
    n = w[0] if trans_b else w[-1]
    if trans_a:
        if len(x) < 2:
            raise UnsupportedCall("trans_a needs x of at least 2 dims")
        batch, (k, m) = x[:-2], x[-2:]
        a = _tensor_load(call, 0, t, [("b", batch), ("k", [k]), ("r", [m])], len(x) - 2, k)
        out_parts = [("b", batch), ("m", [m]), ("n", [n])]
    else:
        batch, k, m = [], x[-1], math.prod(x[:-1])
        a = _rows_load(call, t, x[:-1], k)
        out_parts = [("m", out[:-1]), ("n", [n])]
    b = _weight_load(call, 1, t, trans_b, n, k)
    lines = ["var v = v0;"]
    if has_bias:
        lines.append(f"v += {t}(ld_in2({_offset(call.ins[2], out_parts)}));")
    if has_residual:
        r = len(call.ins) - 1
        lines.append(f"v += {t}(ld_in{r}({_offset(call.ins[r], out_parts)}));")
    lines.append(f"st_out0({_offset(call.outs[0], out_parts)}, {_act(call, t, 'v')});")
    return run(call, Contraction(t, math.prod(batch), m, n, k, a, [b], "\n  ".join(lines)))


def gate_up(call: Call) -> Shader:
    """GATE_UP: silu(x · w_gateᵀ + b_gate) · (x · w_upᵀ + b_up), both products in one pass over x."""
    t = _compute_type(call)
    if t != "f32":
        raise UnsupportedCall("GATE_UP of integer tensors")
    trans_b, has_bias = _flag(call, "trans_b", True), _flag(call, "has_bias", False)
    if len(call.ins) != 3 + 2 * has_bias:
        raise UnsupportedCall(f"{len(call.ins)} inputs for has_bias={has_bias}")
    x = shape_of(call.ins[0])
    k, n = x[-1], shape_of(call.outs[0])[-1]
    a = _rows_load(call, t, x[:-1], k)
    bs = [_weight_load(call, i, t, trans_b, n, k) for i in (1, 2)]
    parts = [("m", x[:-1]), ("n", [n])]
    gate, up = "v0", "v1"
    if has_bias:
        gate, up = f"v0 + ld_in3({_offset(call.ins[3], parts)})", f"v1 + ld_in4({_offset(call.ins[4], parts)})"
    epilogue = f"st_out0({_offset(call.outs[0], parts)}, silu_({gate}) * ({up}));"
    return run(call, Contraction(t, 1, math.prod(x[:-1]), n, k, a, bs, epilogue))


def qkv_proj(call: Call) -> Shader:
    """QKV_PROJ: q, k, v = x · w_qᵀ, x · w_kᵀ, x · w_vᵀ (+ biases) as one contraction over the weights stacked
    along n (one packed weight, or three), each output [..., width] or head-major [B, heads, T, head_dim]."""
    t = _compute_type(call)
    splits = call.param("splits", [])
    splits = [int(_number(s, "splits", True)) for s in splits] if isinstance(splits, list) else []
    packed, trans_b = _flag(call, "packed", False), _flag(call, "trans_b", True)
    heads_first = _flag(call, "heads_first", False)
    n_w = 1 if packed else 3
    flags = call.param("has_bias", False)
    flags = [bool(f) for f in flags] if isinstance(flags, list) else [bool(flags)] * n_w
    if len(splits) != 3 or len(flags) != n_w or len(call.ins) != 1 + n_w + sum(flags) or len(call.outs) != 3:
        raise UnsupportedCall(f"QKV_PROJ with splits {splits}, packed={packed}, has_bias={flags} "
                              f"and {len(call.ins)} inputs")
    x = shape_of(call.ins[0])
    lead, k, n = x[:-1], x[-1], sum(splits)
    a = _rows_load(call, t, lead, k)
    if packed:
        b = _weight_load(call, 1, t, trans_b, n, k)
    else:
        b = _select_load([_weight_load(call, 1 + j, t, trans_b, splits[j], k) for j in range(3)], splits, t, "lw")
    bias_of, given = {}, iter(range(1 + n_w, len(call.ins)))
    for j, flag in enumerate(flags):
        if flag:
            bias_of[j] = next(given)
    lines, start = [], 0
    for j, width in enumerate(splits):
        local = f"(n - {start}u)"
        v = "v0"
        if packed and 0 in bias_of:
            v += f" + {t}(ld_in{bias_of[0]}(n))"
        elif not packed and j in bias_of:
            v += f" + {t}(ld_in{bias_of[j]}({local}))"
        if heads_first:
            d = int(_number(call.param("head_dim", 0), "head_dim", True))
            if d <= 0 or width % d or not lead:
                raise UnsupportedCall(f"heads_first needs a head_dim dividing {width} and x of 2 or more dims")
            seq = lead[-1]
            parts = [(f"m / {seq}u", lead[:-1]), (f"{local} / {d}u", [width // d]), (f"m % {seq}u", [seq]),
                     (f"{local} % {d}u", [d])]
        else:
            parts = [("m", lead), (local, [width])]
        test = f"if (n < {start + width}u) " if j < 2 else ""
        lines.append(f"{test}{{ st_out{j}({_offset(call.outs[j], parts)}, {v}); return; }}")
        start += width
    return run(call, Contraction(t, 1, math.prod(lead), n, k, a, [b], "\n  ".join(lines)))


# -- ATen matrix products -----------------------------------------------------------------------------------

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


# -- convolution --------------------------------------------------------------------------------------------

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


def conv(call: Call) -> Shader:
    """CONV: act(bn(conv(x, w) + bias) [+ residual]); an implicit GEMM, or a direct kernel for
    depthwise and other narrow groups."""
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
    cog = c_out // n_groups
    m_total, k_total = batch * oh * ow, cg * kh * kw
    xs, ws = call.ins[0], call.ins[1]

    # the epilogue: channel co = b·COG + n of pixel m
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
    epilogue = "\n  ".join(lines)

    def pixel(m: str) -> list[str]:
        return [f"let nb = ({m}) / {oh * ow}u;", f"let oh = (({m}) / {ow}u) % {oh}u;", f"let ow = ({m}) % {ow}u;"]

    def tap(c: str, r: str, s: str) -> list[str]:
        """x at channel c of the window tap (r, s) of pixel (nb, oh, ow); 0 in the padding (u32 wraps below 0)."""
        lines = [f"let ih = oh * {sh}u + ({r}) * {dh}u - {ph}u;", f"let iw = ow * {sw}u + ({s}) * {dw}u - {pw}u;"]
        value = f"ld_in0({_pixel_offset(xs, 'nb', c, 'ih', 'iw')})"
        if ph or pw:
            return [*lines, f"if (ih >= {h}u || iw >= {wd}u) {{ return 0.0; }}", f"return {value};"]
        return [*lines, f"return {value};"]

    if cog < DIRECT_CONV_CHANNELS:
        functions = (f"fn tap(nb: u32, oh: u32, ow: u32, c: u32, r: u32, s: u32) -> f32 {{ "
                     f"{' '.join(tap('c', 'r', 's'))} }}\nfn epi(b: u32, m: u32, n: u32, v0: f32) {{\n  {epilogue}\n}}")
        return _direct_conv(call, functions, cog, cg, kh, kw, out)

    if kh == kw == 1 and sh == sw == 1 and ph == pw == 0 and [oh, ow] == [h, wd]:
        a_body = f"return ld_in0({_image_offset(xs, 'r', f'b * {cg}u + k')});"
    elif kh * kw == 1:
        a_body = " ".join([*pixel("r"), *tap(f"b * {cg}u + k", "0u", "0u")])
    else:  # k = (r · KW + s) · CG + c: channels fastest, contiguous in NHWC
        a_body = " ".join([*pixel("r"), f"let c = k % {cg}u;", f"let rs = k / {cg}u;",
                           *tap(f"b * {cg}u + c", f"rs / {kw}u", f"rs % {kw}u")])
    if kh * kw == 1:
        b_body = f"return ld_in1({_pixel_offset(ws, f'b * {cog}u + r', 'k', '0u', '0u')});"
    else:
        b_body = (f"let c = k % {cg}u; let rs = k / {cg}u; "
                  f"return ld_in1({_pixel_offset(ws, f'b * {cog}u + r', 'c', f'rs / {kw}u', f'rs % {kw}u')});")
    c_stride = logical_strides(xs)[1]
    a = Load(a_body, k_fast=c_stride == 1, batched=n_groups > 1)
    b = Load(b_body, k_fast=kh * kw == 1, batched=n_groups > 1)
    return run(call, Contraction("f32", n_groups, m_total, cog, k_total, a, [b], epilogue))


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
