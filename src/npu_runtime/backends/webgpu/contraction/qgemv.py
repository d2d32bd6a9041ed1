"""The GEMV kernel over GGUF block-quantized weights (``blocks``): few rows of C (one-token decode), B's blocks read
where they lie, fp32 activations and accumulation.

A workgroup of GEMV_THREADS invocations computes GEMV_OUTS consecutive outputs n for every row; its invocations
take the groups of K in turn (neighbours read neighbouring groups of a weight row: coalesced), each reading a group's
x once for all those outputs, and per output and group its two parameters and its codes a word at a time:
``s += a · dot(q, x) + b · Σ x``. The partial sums meet in the float GEMV's tree reduction (``gemv._tree``), whose
last level stores through the contraction's epilogue (bias, residual, SiLU gate, QKV's head-major stores)."""

from __future__ import annotations

from ..wgsl import ENTRY_ARGS, GROUP_ID, Call, Shader, UnsupportedCall, groups
from .blocks import adapt
from .gemv import GEMV_OUTS, GEMV_THREADS, _tree
from .operands import Contraction


def has_blocks(c: Contraction) -> bool:
    """Whether a B operand of ``c`` is block-quantized (then no float kernel may read it as floats)."""
    return any(b.blocks is not None for b in c.bs)


def _qgemv(call: Call, c: Contraction) -> Shader:
    """Few rows: the block GEMV (module docstring)."""
    if c.t != "f32":
        raise UnsupportedCall("block-quantized weights with integer activations")
    nb, rows, outs, wg = len(c.bs), c.batch * c.m, GEMV_OUTS, GEMV_THREADS
    size = min(b.blocks.size for b in c.bs if b.blocks is not None)
    if c.k % size:
        raise UnsupportedCall(f"K = {c.k} is not a whole number of {size}-element groups")
    chunks = size // 4
    adapters = [adapt(b.blocks, f"lb{q}", size, f"gb{q}") for q, b in enumerate(c.bs)]
    n_groups = -(-c.n // outs)
    coords = [(f"{r // c.m}u", f"{r % c.m}u") for r in range(rows)]
    body = [f"for (var kg = lid; kg < {c.k // size}u; kg += {wg}u) {{", f"  let k0 = kg * {size}u;"]
    for r, (bi, mi) in enumerate(coords):
        for j in range(chunks):
            at = f"k0 + {4 * j}u"
            body.append(f"  let x{r}_{j} = vec4<f32>({', '.join(f'la({bi}, {mi}, {at} + {q}u)' for q in range(4))});")
        body.append(f"  let sx{r} = dot({' + '.join(f'x{r}_{j}' for j in range(chunks))}, vec4<f32>(1.0));")
    for o in range(outs):
        n = f"min(n0 + {o}u, {c.n - 1}u)"  # past N: row N - 1 again, not stored
        for q in range(nb):
            body.append(f"  {{ let p = gb{q}p({n}, kg);")
            body += [f"    let w{j} = gb{q}q({n}, kg, {j}u);" for j in range(chunks)]
            body += [f"    s{q}_{o}_{r} += p.x * ({' + '.join(f'dot(x{r}_{j}, w{j})' for j in range(chunks))}) "
                     f"+ p.y * sx{r};" for r in range(rows)]
            body.append("  }")
    body.append("}")
    sums = [f"s{q}_{o}_{r}" for q in range(nb) for o in range(outs) for r in range(rows)]
    width = len(sums)
    body += [f"red[lid * {width}u + {i}u] = {v};" for i, v in enumerate(sums)]
    body += _tree(c, wg, width, outs)
    nl = "\n  "
    adapted = "\n".join(adapters)
    code = f"""{call.header()}
{c.functions()}
{adapted}
var<workgroup> red: array<f32, {wg * width}>;
@compute @workgroup_size({wg})
fn main({ENTRY_ARGS}) {{
  let g = {GROUP_ID};
  if (g >= {n_groups}u) {{ return; }}
  let n0 = g * {outs}u;
  {' '.join(f'var {v} = 0.0;' for v in sums)}
  {nl.join(body)}
}}
"""
    return Shader(code, groups(n_groups))
