"""The tiled kernel of a contraction: a workgroup computes a tile of C, staging slices of A and B along K
through workgroup memory as vec4s, double-buffered (one barrier per slice)."""

from __future__ import annotations

from dataclasses import dataclass

from ..wgsl import ENTRY_ARGS, GROUP_ID, Call, Shader, groups
from .operands import Contraction, Load


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
    """C in tiles of TILING's shape: any M, N, K (the edges load zeros)."""
    tiling = TILING
    nb, wg = len(c.bs), tiling.size
    bk = tiling.depth // nb  # two B operands (GATE_UP): half as deep, to stay in 16 KiB of workgroup memory
    pm, pn = tiling.per_m, tiling.per_n
    bm, bn = tiling.threads_m * pm, tiling.threads_n * pn
    tiles_m, tiles_n = -(-c.m // bm), -(-c.n // bn)
    n_groups = c.batch * tiles_m * tiles_n
    loads = [_stage(c, bk, "As", "la", c.a, bm, c.m, "m0")]
    loads += [_stage(c, bk, f"Bs{j}", f"lb{j}", b, bn, c.n, "n0") for j, b in enumerate(c.bs)]
    fma = _multiply(c, bk)
    accs, keep, values, shared = _results(c, bk)
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


def _stage(c: Contraction, bk: int, array: str, fn: str, load: Load, width: int, limit: int, base: str) -> str:
    """Load a depth x width slice into ``array``, a vec4 of 4 consecutive elements per store: along k as
    [r][k / 4] where k is contiguous in storage, else along r as [k][r / 4] (either way neighbouring
    invocations read neighbouring elements)."""
    vec, wg = f"vec4<{c.t}>", TILING.size
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


def _operand(bk: int, array: str, load: Load, width: int, per: int, first: str) -> tuple[list[str], list[list[str]]]:
    """The loads of one k4 step of an invocation's ``per`` rows (``first`` the first), and the
    expression of each (row, kk) value."""
    at = f"buf * {width * bk // 4}u"
    if load.k_fast:
        lines = [f"let {array}{i} = {array}[{at} + ({first} + {i}u) * {bk // 4}u + k4];" for i in range(per)]
        return lines, [[f"{array}{i}[{kk}]" for kk in range(4)] for i in range(per)]
    lines = [f"let {array}{kk}_{q} = {array}[{at} + (k4 * 4u + {kk}u) * {width // 4}u + {first} / 4u + {q}u];"
             for kk in range(4) for q in range(per // 4)]
    return lines, [[f"{array}{kk}_{i // 4}[{i % 4}]" for kk in range(4)] for i in range(per)]


def _multiply(c: Contraction, bk: int) -> list[str]:
    """One k4 step of an invocation: its operands' loads from workgroup memory and its multiply-adds."""
    tiling, vec = TILING, f"vec4<{c.t}>"
    pm, pn = tiling.per_m, tiling.per_n
    bm, bn = tiling.threads_m * pm, tiling.threads_n * pn
    fma, a_of = _operand(bk, "As", c.a, bm, pm, f"ty * {pm}u")
    for j, b in enumerate(c.bs):
        lines, b_of = _operand(bk, f"Bs{j}", b, bn, pn, f"tx * {pn}u")
        fma += lines
        for kk in range(4):
            for i in range(pm):
                fma += [f"c{j}_{i}_{q} += {a_of[i][kk]} * {vec}({', '.join(b_of[4 * q + x][kk] for x in range(4))});"
                        for q in range(pn // 4)]
    return fma


def _results(c: Contraction, bk: int) -> tuple[list[str], list[str], str, str]:
    """The accumulators, their copy into arrays, the epilogue's arguments and the workgroup memory."""
    tiling, nb, vec = TILING, len(c.bs), f"vec4<{c.t}>"
    pm, pn = tiling.per_m, tiling.per_n
    bm, bn = tiling.threads_m * pm, tiling.threads_n * pn
    accs = [f"var c{j}_{i}_{q} = {vec}();" for j in range(nb) for i in range(pm) for q in range(pn // 4)]
    # the results into arrays, so that the epilogue is written (and compiled) once, not per output
    keep = [f"var r{j}: array<{vec}, {pm * pn // 4}>;" for j in range(nb)]
    keep += [f"r{j}[{i * (pn // 4) + q}] = c{j}_{i}_{q};" for j in range(nb) for i in range(pm) for q in range(pn // 4)]
    values = ", ".join(f"r{j}[i * {pn // 4}u + x / 4u][x % 4u]" for j in range(nb))
    # two buffers of each slice: the next slice is staged while this one is read, one barrier between them
    shared = "\n".join([f"var<workgroup> As: array<{vec}, {2 * bk * bm // 4}>;",
                        *(f"var<workgroup> Bs{j}: array<{vec}, {2 * bk * bn // 4}>;" for j in range(nb))])
    return accs, keep, values, shared
