"""The GEMV kernel of a contraction: few rows of C (one-token LLM decode) and a B that is the same for every
batch, K split over the invocations of a workgroup and the partial sums added in a tree in workgroup memory."""

from __future__ import annotations

from collections.abc import Sequence

from ..wgsl import ENTRY_ARGS, GROUP_ID, Call, Shader, groups
from .operands import Contraction

#: Rows of C (the product of x's leading dims) up to which a contraction with a fixed B runs the GEMV kernel.
GEMV_ROWS = 4
#: The GEMV kernel's workgroup: GEMV_THREADS invocations (one warp) computing GEMV_OUTS outputs (see ``_gemv``),
#: their partial sums added GEMV_RADIX at a time (each level of the tree is a barrier, which lavapipe runs as a
#: switch between the workgroup's SIMD chunks: small workgroups and few levels make its GEMV several times faster).
GEMV_THREADS, GEMV_OUTS, GEMV_RADIX = 32, 8, 8


def _gemv(call: Call, c: Contraction) -> Shader:
    """Few rows (C has at most GEMV_ROWS): a workgroup computes GEMV_OUTS consecutive outputs n for every row,
    its GEMV_THREADS invocations splitting K, each reading a row's x once for all those outputs. Where B is
    contiguous along k, an invocation takes 4 consecutive k at a time (two u32 words of 16-bit values where
    possible) and its neighbours the next 4 of the same rows of B (coalesced); else GEMV_THREADS / 4 groups
    of GEMV_OUTS outputs, 4 invocations splitting K for each (neighbours read neighbouring n). The partial
    sums meet in a tree reduction in workgroup memory."""
    t, nb, rows, outs, wg = c.t, len(c.bs), c.batch * c.m, GEMV_OUTS, GEMV_THREADS
    along_k = all(b.k_fast for b in c.bs)
    slices = wg if along_k else 4  # invocations splitting K for one output
    per_group = outs * (wg // slices)
    n_groups = -(-c.n // per_group)
    coords = [(f"{r // c.m}u", f"{r % c.m}u") for r in range(rows)]
    body, n = [], [f"min(n0 + {o}u, {c.n - 1}u)" for o in range(outs)]  # past N: row N - 1 again, not stored
    if along_k:
        body, tail = _by_fours(c, coords, n)
    else:
        tail = (f"lid / {wg // slices}u", f"{slices}u")
    if tail is not None:
        body += _one_by_one(c, coords, n, tail)
    sums = [f"s{q}_{o}_{r}" for q in range(nb) for o in range(outs) for r in range(rows)]
    width = len(sums)  # partial sums per invocation
    body += [f"red[lid * {width}u + {i}u] = {v};" for i, v in enumerate(sums)]
    body += _tree(c, slices, width, per_group)
    stride = wg // slices
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


def _by_fours(c: Contraction, coords: Sequence[tuple[str, str]], n: Sequence[str]
              ) -> tuple[list[str], tuple[str, str] | None]:
    """The loop over K where B is contiguous along k: 4 consecutive k an invocation at a time, as dot products of
    vec4s; also where the remaining K % 4 start and step (None when there are none)."""
    nb, rows, wg, vec = len(c.bs), c.batch * c.m, GEMV_THREADS, f"vec4<{c.t}>"
    full = c.k // 4 * 4  # groups of 4 k; the last K % 4 are added one by one
    pairs = c.k % 2 == 0 and all(b.pair_body is not None for b in c.bs)
    a_pairs = c.k % 2 == 0 and c.a.pair_body is not None

    def four(fn: str, x: str, y: str, paired: bool) -> str:
        if paired:
            return f"{vec}({fn}2({x}, {y}, k), {fn}2({x}, {y}, k + 2u))"
        return f"{vec}({', '.join(f'{fn}({x}, {y}, k + {q}u)' for q in range(4))})"

    body = [f"for (var k = 4u * lid; k < {full}u; k += {4 * wg}u) {{"]
    for r, (bi, mi) in enumerate(coords):
        body.append(f"  let x{r} = {four('la', bi, mi, a_pairs)};")
    for o in range(GEMV_OUTS):
        for q in range(nb):
            body.append(f"  let w{q}_{o} = {four(f'lb{q}', '0u', n[o], pairs)};")
            body += [f"  s{q}_{o}_{r} += dot(x{r}, w{q}_{o});" for r in range(rows)]
    body.append("}")
    return body, (f"{full}u + lid", f"{wg}u") if full < c.k else None


def _one_by_one(c: Contraction, coords: Sequence[tuple[str, str]], n: Sequence[str], tail: tuple[str, str]
                ) -> list[str]:
    """The loop over K one k at a time, from ``tail[0]`` in steps of ``tail[1]``."""
    nb, rows = len(c.bs), c.batch * c.m
    body = [f"for (var k = {tail[0]}; k < {c.k}u; k += {tail[1]}) {{"]
    body += [f"  let x{r} = la({bi}, {mi}, k);" for r, (bi, mi) in enumerate(coords)]
    for o in range(GEMV_OUTS):
        body += [f"  let w{q}_{o} = lb{q}(0u, {n[o]}, k);" for q in range(nb)]
        body += [f"  s{q}_{o}_{r} += x{r} * w{q}_{o};" for q in range(nb) for r in range(rows)]
    body.append("}")
    return body


def _tree(c: Contraction, slices: int, width: int, per_group: int) -> list[str]:
    """The tree: partial sums of slice s of output group p at red[(s · stride + p) · width + i]; each level
    adds GEMV_RADIX slices into one, its sums spread over every invocation; the last level adds the rest and
    stores through the epilogue."""
    t, nb, rows, outs, wg = c.t, len(c.bs), c.batch * c.m, GEMV_OUTS, GEMV_THREADS
    stride = wg // slices  # output groups per workgroup (invocations between two slices of one group)
    count = slices
    body = ["workgroupBarrier();"]
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
    return body
