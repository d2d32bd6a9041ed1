"""What the row-wise and per-element kernels of the ``transformer`` family share: workgroup sizes and tree
reductions, float checks and rounding, and the WGSL functions that address a row's elements in any layout.

Masked scores are kept finite: a score at or below ``MASKED`` (-3e38: a bool mask's False, a causal
future, an additive -inf) counts as masked, so no shader relies on infinities, which WGSL lets an
implementation assume away.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from npu_program.program import TensorSpec

from ..wgsl import FLOAT_DTYPES, Call, UnsupportedCall, offset, shape_of, storage_shape, unravel

NAN = "bitcast<f32>(0x7fc00000u)"
#: The score of a masked position (see the module docstring).
MASKED = "-3.0e38"
#: Workgroup memory a shader may use (WebGPU's portable minimum of the limit).
SHARED_BYTES = 16384


def workgroup_size(n: int, lo: int = 64, hi: int = 256) -> int:
    """A power-of-two workgroup size for rows of ``n`` elements: no wider than the row needs, within [lo, hi]."""
    return max(lo, min(hi, 1 << max(0, n - 1).bit_length()))


def reductions(wg: int) -> str:
    """Module-scope WGSL: the workgroup size ``WG``, the scratch ``red`` and the tree reductions ``wg_sum`` and
    ``wg_max``, which every invocation of the workgroup must call (they hold barriers)."""
    fns = []
    for name, op in (("wg_sum", "red[lid] + red[lid + s]"), ("wg_max", "max(red[lid], red[lid + s])")):
        fns.append(f"""fn {name}(v: f32, lid: u32) -> f32 {{
  workgroupBarrier();  // every invocation has read the previous result out of red
  red[lid] = v;
  for (var s = WG / 2u; s > 0u; s = s / 2u) {{
    workgroupBarrier();
    if (lid < s) {{ red[lid] = {op}; }}
  }}
  workgroupBarrier();
  return red[0];
}}""")
    return f"const WG: u32 = {wg}u;\nconst MASKED: f32 = {MASKED};\nvar<workgroup> red: array<f32, {wg}>;\n" + \
        "\n".join(fns)


def require_floats(call: Call, *specs: TensorSpec) -> None:
    for spec in specs:
        if spec.dtype not in FLOAT_DTYPES:
            raise UnsupportedCall(f"{call.record.name} computes in floating point; {spec.name} is {spec.dtype}")


def round_to(dtype: str, expr: str) -> str:
    """``expr`` (f32) rounded to ``dtype``'s precision, kept as f32 (where the reference rounds mid-way)."""
    if dtype == "bfloat16":
        return f"bitcast<f32>(bf16_bits({expr}) << 16u)"
    if dtype == "float16":
        return f"unpack2x16float(pack2x16float(vec2<f32>({expr}, 0.0))).x"
    return expr


def checked_dim(value: object, rank: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -max(rank, 1) <= value < max(rank, 1):
        raise UnsupportedCall(f"{what} = {value!r} is not a dim of a rank-{rank} tensor")
    return value % max(rank, 1)


def row_fn(name: str, spec: TensorSpec, shape: Sequence[int], a: int, b: int) -> str:
    """WGSL ``fn name(r: u32, j: u32) -> u32``: the storage offset in ``spec`` of element ``j`` of row ``r`` of the
    logical ``shape`` (``spec``'s own, or one it broadcasts to), whose rows run over dims [a, b) and are counted
    row-major over the other dims."""
    shape = list(shape)
    if spec.layout != "NHWC" and shape_of(spec) == shape:  # row-major: no unravelling
        row, post = math.prod(shape[a:b]), math.prod(shape[b:])
        if post == 1:
            return f"fn {name}(r: u32, j: u32) -> u32 {{ return r * {row}u + j; }}"
        return (f"fn {name}(r: u32, j: u32) -> u32 {{ "
                f"return (r / {post}u) * {row * post}u + j * {post}u + r % {post}u; }}")
    outer, inner = shape[:a] + shape[b:], shape[a:b]
    o = [f"o{k}" for k in range(len(outer))]
    e = [f"e{k}" for k in range(len(inner))]
    idx = o[:a] + e + o[a:]
    lines = [line for line in (unravel("r", outer, "o"), unravel("j", inner, "e")) if line]
    body = "\n  ".join([*lines, f"return {offset(spec, idx, shape)};"])
    return f"fn {name}(r: u32, j: u32) -> u32 {{\n  {body}\n}}"


def storage_order(spec: TensorSpec, index: str = "i") -> tuple[str, list[str]]:
    """WGSL splitting storage index ``index`` of ``spec`` into its logical indices, and their names."""
    code = unravel(index, storage_shape(spec))
    rank = len(shape_of(spec))
    if spec.layout == "NHWC":
        return code, ["d0", "d3", "d1", "d2"]
    return code, [f"d{k}" for k in range(rank)]


def optional_inputs(call: Call, names: Sequence[str], first: int) -> dict[str, int]:
    """Input position of each optional tensor argument ``names`` (after the ``first`` required ones) that the
    dispatch has: they fill the inputs in order, skipping arguments given as a parameter (an ATen op's
    ``weight=None``)."""
    where, k = {}, first
    for name in names:
        if name in call.params:
            if call.params[name] is not None:
                raise UnsupportedCall(f"{call.record.name}: {name} given as a constant parameter")
            continue
        if k < len(call.ins):
            where[name] = k
            k += 1
    if k != len(call.ins):
        raise UnsupportedCall(f"{call.record.name}: {len(call.ins)} inputs, expected at most {k}")
    return where
