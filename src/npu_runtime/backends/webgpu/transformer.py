"""WGSL generators of the normalization, softmax, attention, rotary-embedding, KV-cache and embedding kernels.

Row-wise kernels (LAYER_NORM, RMS_NORM, group norm, SOFTMAX, the attention kernels) run one workgroup per row
and reduce in workgroup memory with a tree (no subgroup operations, so every adapter runs them); each
invocation strides over the row, so any row length works with one shader shape. Per-element kernels
(BATCH_NORM, LRN, ROPE, KV_UPDATE, EMBEDDING) run one invocation per output element in storage order.
Every tensor is addressed through its own layout (``offset``), so an NHWC activation and a row-major one
take the same path.

Masked scores are kept finite: a score at or below ``MASKED`` (-3e38: a bool mask's False, a causal
future, an additive -inf) counts as masked, so no shader relies on infinities, which WGSL lets an
implementation assume away.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from npu_program.program import TensorSpec

from .wgsl import (
    FLOAT_DTYPES,
    Call,
    Shader,
    UnsupportedCall,
    literal,
    logical_strides,
    move,
    numel,
    offset,
    per_element,
    per_group,
    shape_of,
    storage_shape,
    unravel,
)

_NAN = "bitcast<f32>(0x7fc00000u)"
#: The score of a masked position (see the module docstring).
_MASKED = "-3.0e38"
#: Workgroup memory a shader may use (WebGPU's portable minimum of the limit).
_SHARED_BYTES = 16384


# -- shared pieces --------------------------------------------------------------------------------------------

def _workgroup(n: int, lo: int = 64, hi: int = 256) -> int:
    """A power-of-two workgroup size for rows of ``n`` elements: no wider than the row needs, within [lo, hi]."""
    return max(lo, min(hi, 1 << max(0, n - 1).bit_length()))


def _reductions(wg: int) -> str:
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
    return f"const WG: u32 = {wg}u;\nconst MASKED: f32 = {_MASKED};\nvar<workgroup> red: array<f32, {wg}>;\n" + \
        "\n".join(fns)


def _floats(call: Call, *specs: TensorSpec) -> None:
    for spec in specs:
        if spec.dtype not in FLOAT_DTYPES:
            raise UnsupportedCall(f"{call.record.name} computes in floating point; {spec.name} is {spec.dtype}")


def _round(dtype: str, expr: str) -> str:
    """``expr`` (f32) rounded to ``dtype``'s precision, kept as f32 (where the reference rounds mid-way)."""
    if dtype == "bfloat16":
        return f"bitcast<f32>(bf16_bits({expr}) << 16u)"
    if dtype == "float16":
        return f"unpack2x16float(pack2x16float(vec2<f32>({expr}, 0.0))).x"
    return expr


def _dim(value: object, rank: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -max(rank, 1) <= value < max(rank, 1):
        raise UnsupportedCall(f"{what} = {value!r} is not a dim of a rank-{rank} tensor")
    return value % max(rank, 1)


def _row_fn(name: str, spec: TensorSpec, shape: Sequence[int], a: int, b: int) -> str:
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


def _storage_order(spec: TensorSpec, index: str = "i") -> tuple[str, list[str]]:
    """WGSL splitting storage index ``index`` of ``spec`` into its logical indices, and their names."""
    code = unravel(index, storage_shape(spec))
    rank = len(shape_of(spec))
    if spec.layout == "NHWC":
        return code, ["d0", "d3", "d1", "d2"]
    return code, [f"d{k}" for k in range(rank)]


def _present(call: Call, names: Sequence[str], first: int) -> dict[str, int]:
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


# -- normalizations -------------------------------------------------------------------------------------------

def _mean_var_norm(call: Call, rows: int, length: int, fns: str, eps: float, affine: dict[str, int]) -> Shader:
    """y = (x - mean) / sqrt(var + eps) (· weight + bias) over rows of ``length`` elements; ``fns`` defines
    ``xo``, ``yo`` (offsets of element j of row r) and ``ao`` (the affine parameters' offset of it). Two passes
    over the row (mean, then the squared deviations) for the accuracy of a long row with a large mean."""
    wg = _workgroup(length)
    y = "(ld_in0(xo(g, j)) - mean) * rstd"
    if "weight" in affine:
        y = f"{y} * ld_in{affine['weight']}(ao(g, j))"
    if "bias" in affine:
        y = f"{y} + ld_in{affine['bias']}(ao(g, j))"
    body = f"""var acc = 0.0;
  for (var j = lid; j < {length}u; j += WG) {{ acc += ld_in0(xo(g, j)); }}
  let mean = wg_sum(acc, lid) / {float(length)!r};
  var dev = 0.0;
  for (var j = lid; j < {length}u; j += WG) {{ let d = ld_in0(xo(g, j)) - mean; dev += d * d; }}
  let rstd = 1.0 / sqrt(wg_sum(dev, lid) / {float(length)!r} + {literal(eps)});
  for (var j = lid; j < {length}u; j += WG) {{ st_out0(yo(g, j), {y}); }}"""
    return per_group(call, rows, wg, body, shared=f"{_reductions(wg)}\n{fns}")


def layer_norm(call: Call) -> Shader:
    """LAYER_NORM: over the trailing ``normalized_shape`` dims, with optional weight and bias (inputs 1, 2)."""
    x, out = call.ins[0], call.outs[0]
    _floats(call, x, out, *call.ins[1:])
    shape = shape_of(x)
    norm = call.param("normalized_shape")
    if not isinstance(norm, list) or not 0 < len(norm) <= len(shape) or [int(d) for d in norm] != \
            shape[len(shape) - len(norm):]:
        raise UnsupportedCall(f"normalized_shape {norm!r} is not the trailing dims of {shape}")
    a = len(shape) - len(norm)
    affine = _present(call, ("weight", "bias"), 1)
    fns = [_row_fn("xo", x, shape, a, len(shape)), _row_fn("yo", out, shape, a, len(shape))]
    if affine:
        fns.append(_row_fn("ao_", call.ins[min(affine.values())], shape[a:], 0, len(norm)))
        fns.append("fn ao(r: u32, j: u32) -> u32 { return ao_(0u, j); }")
    rows, length = math.prod(shape[:a]), math.prod(shape[a:])
    return _mean_var_norm(call, rows, length, "\n".join(fns), float(call.param("eps", 1e-5)), affine)


def group_norm(call: Call) -> Shader:
    """aten.group_norm: x [N, C, *] normalized over each of ``num_groups`` channel groups, then per channel
    weight and bias (each optional)."""
    x, out = call.ins[0], call.outs[0]
    _floats(call, x, out, *call.ins[1:])
    shape = shape_of(x)
    groups_ = call.param("num_groups")
    if len(shape) < 2 or not isinstance(groups_, int) or groups_ <= 0 or shape[1] % groups_:
        raise UnsupportedCall(f"num_groups {groups_!r} does not divide the channels of {shape}")
    n, spatial = shape[0], shape[2:]
    hw, cg = math.prod(spatial), shape[1] // groups_
    affine = _present(call, ("weight", "bias"), 1)
    fns = [f"fn ch(r: u32, j: u32) -> u32 {{ return (r % {groups_}u) * {cg}u + j / {hw}u; }}"]
    for name, spec in (("xo", x), ("yo", out)):
        sp = [f"s{k}" for k in range(len(spatial))]
        split = unravel(f"j % {hw}u", spatial, "s")
        fns.append(f"fn {name}(r: u32, j: u32) -> u32 {{\n  {split}\n  "
                   f"return {offset(spec, [f'(r / {groups_}u)', 'ch(r, j)', *sp])};\n}}")
    if affine:
        w = call.ins[min(affine.values())]
        fns.append(f"fn ao(r: u32, j: u32) -> u32 {{ return {offset(w, ['ch(r, j)'])}; }}")
    return _mean_var_norm(call, n * groups_, cg * hw, "\n".join(fns), float(call.param("eps", 1e-5)), affine)


def rms_norm(call: Call) -> Shader:
    """RMS_NORM: y = round(x · rsqrt(mean(x², last dim) + eps)) (· weight), in float32 and rounded to x's
    dtype before the weight, as the reference (and Llama/Qwen) do."""
    x, out = call.ins[0], call.outs[0]
    _floats(call, x, out, *call.ins[1:])
    shape = shape_of(x)
    if not shape:
        raise UnsupportedCall("RMS_NORM of a 0-d tensor")
    length, rank = shape[-1], len(shape)
    wg = _workgroup(length)
    fns = [_row_fn("xo", x, shape, rank - 1, rank), _row_fn("yo", out, shape, rank - 1, rank)]
    y = _round(x.dtype, "ld_in0(xo(g, j)) * scale")
    if len(call.ins) > 1:
        fns.append(_row_fn("wo", call.ins[1], [length], 0, 1))
        y = f"ld_in1(wo(0u, j)) * {y}"
    body = f"""var acc = 0.0;
  for (var j = lid; j < {length}u; j += WG) {{ let v = ld_in0(xo(g, j)); acc += v * v; }}
  let scale = 1.0 / sqrt(wg_sum(acc, lid) / {float(length)!r} + {literal(float(call.param("eps", 1e-6)))});
  for (var j = lid; j < {length}u; j += WG) {{ st_out0(yo(g, j), {y}); }}"""
    return per_group(call, math.prod(shape[:-1]), wg, body, shared=f"{_reductions(wg)}\n" + "\n".join(fns))


def batch_norm(call: Call) -> Shader:
    """BATCH_NORM (inference): per channel (dim 1), y = (x - mean) / sqrt(var + eps) · weight + bias."""
    x, out = call.ins[0], call.outs[0]
    if len(call.ins) != 5:
        raise UnsupportedCall("BATCH_NORM needs weight, bias, mean and var inputs")
    _floats(call, *call.ins, out)
    if len(shape_of(x)) < 2:
        raise UnsupportedCall("BATCH_NORM needs a channel dim")
    split, idx = _storage_order(out)
    w, b, mean, var = (f"ld_in{k}({offset(call.ins[k], [idx[1]])})" for k in range(1, 5))
    eps = literal(float(call.param("eps", 1e-5)))
    body = (f"{split}\n  let x = ld_in0({offset(x, idx)});\n"
            f"  st_out0(i, (x - {mean}) / sqrt({var} + {eps}) * {w} + {b});")
    return per_element(call, numel(out), body)


def lrn(call: Call) -> Shader:
    """LRN: y = x / (k + alpha · (sum of x² over ``size`` neighbouring channels) / size)^beta, the window
    clipped at the edges but always divided by ``size`` (torch's local_response_norm pads with zeros)."""
    x, out = call.ins[0], call.outs[0]
    _floats(call, x, out)
    shape = shape_of(x)
    size = call.param("size")
    if len(shape) < 3 or not isinstance(size, int) or size < 1:
        raise UnsupportedCall(f"LRN needs a 3-d or wider input and a window size >= 1 (got {shape}, {size!r})")
    split, idx = _storage_order(out)
    at = offset(x, [idx[0], "u32(cc)", *idx[2:]])
    alpha, beta, k = (literal(float(call.param(n, d))) for n, d in (("alpha", 1e-4), ("beta", 0.75), ("k", 1.0)))
    body = f"""{split}
  let lo = max(i32({idx[1]}) - {size // 2}, 0);
  let hi = min(i32({idx[1]}) + {(size - 1) // 2}, {shape[1] - 1});
  var sq = 0.0;
  for (var cc = lo; cc <= hi; cc++) {{ let v = ld_in0({at}); sq += v * v; }}
  st_out0(i, ld_in0({offset(x, idx)}) / pow_({k} + {alpha} * sq / {float(size)!r}, {beta}));"""
    return per_element(call, numel(out), body)


def softmax(call: Call) -> Shader:
    """SOFTMAX: softmax(x · scale + mask) along ``dim`` (any axis); a bool mask keeps its True positions, a float
    one is added. A row with nothing left is NaN, as torch's softmax gives. One pass keeps a running maximum and
    sum per invocation, merged across the workgroup, then one pass writes."""
    x, out = call.ins[0], call.outs[0]
    _floats(call, x, out)
    shape = shape_of(x)
    rank = len(shape)
    dim = _dim(call.param("dim", -1), rank, "dim")
    scale = float(call.param("scale", 1.0))
    if not shape:
        shape = [1]  # a 0-d softmax is one row of one element
    length, rows = shape[dim], math.prod(shape) // max(shape[dim], 1)
    wg = _workgroup(length)
    fns = [_row_fn("xo", x, shape, dim, dim + 1), _row_fn("yo", out, shape, dim, dim + 1)]
    value = "ld_in0(xo(g, j))" if scale == 1.0 else f"ld_in0(xo(g, j)) * {literal(scale)}"
    if len(call.ins) > 1:
        mask = call.ins[1]
        if len(shape_of(mask)) > len(shape):
            raise UnsupportedCall("the mask has more dims than x")
        fns.append(_row_fn("mo", mask, shape, dim, dim + 1))
        value = f"select(MASKED, {value}, ld_in1(mo(g, j)) != 0)" if mask.dtype == "bool" else \
            f"{value} + f32(ld_in1(mo(g, j)))"
    body = f"""var m = MASKED;
  var s = 0.0;
  for (var j = lid; j < {length}u; j += WG) {{
    let v = {value};
    if (v > m) {{ s = select(s * exp(m - v), 0.0, m <= MASKED) + 1.0; m = v; }}
    else if (v > MASKED) {{ s += exp(v - m); }}
  }}
  let mx = wg_max(m, lid);
  let total = wg_sum(select(s * exp(m - mx), 0.0, m <= MASKED), lid);
  for (var j = lid; j < {length}u; j += WG) {{
    let v = {value};
    st_out0(yo(g, j), select(select(exp(v - mx) / total, 0.0, v <= MASKED), {_NAN}, mx <= MASKED));
  }}"""
    return per_group(call, rows, wg, body, shared=f"{_reductions(wg)}\n" + "\n".join(fns))


# -- attention ------------------------------------------------------------------------------------------------

class _Heads:
    """The dims of an attention call: q [B, H, T, D], keys [B, Hkv, S, D], values [B, Hkv, S, Dv]."""

    def __init__(self, call: Call, rows: TensorSpec, keys: TensorSpec | None, values: TensorSpec) -> None:
        kv = shape_of(values)
        if len(shape_of(rows)) != 4 or len(kv) != 4 or (keys is not None and len(shape_of(keys)) != 4):
            raise UnsupportedCall(f"{call.record.name} needs 4-d [B, heads, T, D] tensors")
        self.b, self.h, self.t = shape_of(rows)[:3]
        self.hkv, self.s, self.dv = kv[1], kv[2], kv[3]
        if self.hkv <= 0 or self.h % self.hkv or kv[0] != self.b:
            raise UnsupportedCall(f"{self.h} query heads cannot share {self.hkv} key/value heads")
        self.group = self.h // self.hkv
        self.merge = bool(call.param("merge_heads", True))
        self.values = values

    def prologue(self) -> str:
        """WGSL naming the workgroup's row: batch b, head h (its key/value head hk), query t."""
        return (f"let b = g / {self.h * self.t}u;\n  let h = (g / {self.t}u) % {self.h}u;\n  let t = g % {self.t}u;\n"
                f"  let hk = h / {self.group}u;")

    def out_offset(self, out: TensorSpec, d: str) -> str:
        if self.merge:
            return offset(out, ["b", "t", f"h * {self.dv}u + {d}"])
        return offset(out, ["b", "h", "t", d])

    def pv_setup(self, wg: int) -> tuple[int, int, int]:
        """How the workgroup splits p·v: ``dc`` columns at a time, ``sl`` slices of the positions, ``npt``
        columns per invocation."""
        dc = min(self.dv, wg)
        return dc, wg // dc, -(-self.dv // dc)

    def pv_accumulate(self, values: int, p: str, s_global: str, count: str, wg: int) -> str:
        """WGSL adding ``p``·v (v: input ``values``) over the ``count`` positions ``j`` of this block (``p`` reads
        position ``j``, which is ``s_global`` of v) into this invocation's columns ``acc``."""
        dc, sl, npt = self.pv_setup(wg)
        vst = logical_strides(self.values)
        vbase = offset(self.values, ["b", "hk", s_global, "0u"])
        return f"""if (slice < {sl}u) {{
      for (var j = slice; j < {count}; j += {sl}u) {{
        let p = {p};
        let vb = {vbase};
        for (var k = 0u; k < {npt}u; k++) {{
          let d = col + k * {dc}u;
          if (d < {self.dv}u) {{ acc[k] += p * ld_in{values}(vb + d * {vst[3]}u); }}
        }}
      }}
    }}"""

    def pv_store(self, out: TensorSpec, wg: int, norm: str) -> str:
        """WGSL summing the slices' ``acc`` and storing each column times ``norm``."""
        dc, sl, npt = self.pv_setup(wg)
        return f"""for (var k = 0u; k < {npt}u; k++) {{
    workgroupBarrier();
    red[lid] = acc[k];
    workgroupBarrier();
    let d = col + k * {dc}u;
    if (slice == 0u && d < {self.dv}u) {{
      var total = 0.0;
      for (var q = 0u; q < {sl}u; q++) {{ total += red[q * {dc}u + col]; }}
      st_out0({self.out_offset(out, 'd')}, total * {norm});
    }}
  }}"""


def _score_fns(call: Call, hd: _Heads, q: TensorSpec, k: TensorSpec, mask: int | None, q_shared: bool) -> str:
    """WGSL ``fn score(b, h, hk, t, s) -> f32``: q·k·scale + mask (input ``mask``) of one position (MASKED where
    masked). With ``q_shared`` the query row is read from workgroup memory ``qs``."""
    d = shape_of(q)[3]
    if shape_of(k)[3] != d or shape_of(k)[:2] != [hd.b, hd.hkv]:
        raise UnsupportedCall(f"keys {shape_of(k)} do not match queries {shape_of(q)}")
    scale = literal(float(call.param("scale", 1.0)))
    kst, qst = logical_strides(k), logical_strides(q)
    lines = ["fn score(b: u32, h: u32, hk: u32, t: u32, s: u32) -> f32 {"]
    if call.param("causal", False):  # torch's is_causal: top-left aligned, query t sees positions 0..t
        lines.append("  if (s > t) { return MASKED; }")
    at = ""
    if mask is not None:
        spec = call.ins[mask]
        if len(shape_of(spec)) > 4:
            raise UnsupportedCall("the mask has more than 4 dims")
        at = offset(spec, ["b", "h", "t", "s"], [hd.b, hd.h, hd.t, hd.s])
        if spec.dtype == "bool":
            lines.append(f"  if (ld_in{mask}({at}) == 0) {{ return MASKED; }}")
    if not q_shared:
        lines.append(f"  let qb = {offset(q, ['b', 'h', 't', '0u'])};")
    qv = "qs[d]" if q_shared else f"ld_in0(qb + d * {qst[3]}u)"
    lines += [f"  let kb = {offset(k, ['b', 'hk', 's', '0u'])};",
              "  var dot = 0.0;",
              f"  for (var d = 0u; d < {d}u; d++) {{ dot += {qv} * ld_in1(kb + d * {kst[3]}u); }}",
              f"  var x = dot * {scale};"]
    if mask is not None and call.ins[mask].dtype != "bool":
        lines.append(f"  x += f32(ld_in{mask}({at}));")
    lines += ["  return max(x, MASKED);  // an additive -inf is masked too", "}"]
    return "\n".join(lines)


def attention(call: Call) -> Shader:
    """ATTENTION: softmax(q·kᵀ·scale + mask)·v, one workgroup per query row (b, h, t). Keys are scored a block
    at a time into workgroup memory with an online softmax (a running maximum rescales the running sum and the
    accumulated p·v), so any cache length runs in fixed memory; p·v spreads the value columns over the
    invocations (several slices of the positions when the head is narrower than the workgroup). Grouped-query
    heads read their shared key/value head; ``causal`` stops a row at its own position (top-left aligned, as
    the reference); a row with every position masked is zeros."""
    q, k, v = call.ins[:3]
    mask = call.ins[3] if len(call.ins) > 3 else None
    out = call.outs[0]
    _floats(call, q, k, v, out)
    hd = _Heads(call, q, k, v)
    d = shape_of(q)[3]
    if 4 * d > _SHARED_BYTES // 4:
        raise UnsupportedCall(f"head_dim {d} is too wide for workgroup memory")
    wg = _workgroup(max(min(hd.s, 256), hd.dv))
    block = max(1, min(hd.s, 2048, (_SHARED_BYTES - 4 * d - 4 * wg) // 4))
    dc, _, npt = hd.pv_setup(wg)
    end = f"min({hd.s}u, t + 1u)" if call.param("causal", False) else f"{hd.s}u"
    qst = logical_strides(q)
    pv = hd.pv_accumulate(2, "sc[j]", "s0 + j", "nb", wg)
    fns = _score_fns(call, hd, q, k, 3 if mask is not None else None, q_shared=True)
    shared = f"{_reductions(wg)}\nvar<workgroup> qs: array<f32, {d}>;\nvar<workgroup> sc: array<f32, {block}>;\n{fns}"
    body = f"""{hd.prologue()}
  let qb = {offset(q, ['b', 'h', 't', '0u'])};
  for (var d = lid; d < {d}u; d += WG) {{ qs[d] = ld_in0(qb + d * {qst[3]}u); }}
  let col = lid % {dc}u;
  let slice = lid / {dc}u;
  var acc: array<f32, {npt}>;
  var m = MASKED;
  var l = 0.0;
  let end = {end};
  for (var s0 = 0u; s0 < end; s0 += {block}u) {{
    let nb = min({block}u, end - s0);
    workgroupBarrier();  // qs is written; the previous block's sc is read
    var bm = MASKED;
    for (var j = lid; j < nb; j += WG) {{ let x = score(b, h, hk, t, s0 + j); sc[j] = x; bm = max(bm, x); }}
    let mn = max(m, wg_max(bm, lid));
    let alpha = select(exp(m - mn), 0.0, m <= MASKED);
    var ls = 0.0;
    for (var j = lid; j < nb; j += WG) {{
      let x = sc[j];
      let p = select(exp(x - mn), 0.0, x <= MASKED);
      sc[j] = p;
      ls += p;
    }}
    l = l * alpha + wg_sum(ls, lid);  // its barriers also publish sc
    m = mn;
    for (var k = 0u; k < {npt}u; k++) {{ acc[k] *= alpha; }}
    {pv}
  }}
  {hd.pv_store(out, wg, "select(1.0 / l, 0.0, l <= 0.0)")}"""
    return per_group(call, hd.b * hd.h * hd.t, wg, body, shared=shared)


def attn_score(call: Call) -> Shader:
    """ATTN_SCORE: p = softmax(q·kᵀ·scale + mask) [B, H, T, S], one workgroup per query row; the scores are
    computed twice (once for the row's maximum and sum, once to write) rather than held. A row with every
    position masked is zeros, as the reference."""
    q, k = call.ins[:2]
    mask = call.ins[2] if len(call.ins) > 2 else None
    out = call.outs[0]
    _floats(call, q, k, out)
    hd = _Heads(call, q, k, k)
    wg = _workgroup(hd.s)
    fns = _score_fns(call, hd, q, k, 2 if mask is not None else None, q_shared=False)
    body = f"""{hd.prologue()}
  var m = MASKED;
  var s = 0.0;
  for (var j = lid; j < {hd.s}u; j += WG) {{
    let v = score(b, h, hk, t, j);
    if (v > m) {{ s = select(s * exp(m - v), 0.0, m <= MASKED) + 1.0; m = v; }}
    else if (v > MASKED) {{ s += exp(v - m); }}
  }}
  let mx = wg_max(m, lid);
  let total = wg_sum(select(s * exp(m - mx), 0.0, m <= MASKED), lid);
  for (var j = lid; j < {hd.s}u; j += WG) {{
    let v = score(b, h, hk, t, j);
    st_out0({offset(out, ['b', 'h', 't', 'j'])}, select(exp(v - mx) / total, 0.0, v <= MASKED || total <= 0.0));
  }}"""
    return per_group(call, hd.b * hd.h * hd.t, wg, body, shared=f"{_reductions(wg)}\n{fns}")


def attn_output(call: Call) -> Shader:
    """ATTN_OUTPUT: y = p·v (v shared by grouped-query heads), heads merged or not; one workgroup per row of p,
    the value columns over the invocations and the positions over slices of them."""
    p, v = call.ins
    out = call.outs[0]
    _floats(call, p, v, out)
    hd = _Heads(call, p, None, v)
    if shape_of(p)[3] != hd.s:
        raise UnsupportedCall(f"p {shape_of(p)} does not match v {shape_of(v)}")
    wg = _workgroup(max(min(hd.s, 256), hd.dv))
    dc, _, npt = hd.pv_setup(wg)
    pst = logical_strides(p)
    pv = hd.pv_accumulate(1, f"ld_in0(pb + j * {pst[3]}u)", "j", f"{hd.s}u", wg)
    body = f"""{hd.prologue()}
  let pb = {offset(p, ['b', 'h', 't', '0u'])};
  let col = lid % {dc}u;
  let slice = lid / {dc}u;
  var acc: array<f32, {npt}>;
  {pv}
  {hd.pv_store(out, wg, "1.0")}"""
    return per_group(call, hd.b * hd.h * hd.t, wg, body, shared=_reductions(wg))


# -- rotary embedding, cache writes, lookups --------------------------------------------------------------------

def rope(call: Call) -> Shader:
    """ROPE (x, cos, sin -> y) and ROPE_QK (q, k, cos, sin -> q', k'): y = x·cos + rotate_half(x)·sin with
    rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]) (D odd: the reference's split at D // 2); cos and sin
    broadcast to each input. ROPE_QK is one dispatch over q's elements then k's."""
    *xs, cos, sin = call.ins
    if len(xs) != len(call.outs) or not xs:
        raise UnsupportedCall(f"{call.record.name}: {len(call.ins)} inputs for {len(call.outs)} outputs")
    _floats(call, *call.ins, *call.outs)
    parts, start = [], 0
    for n, (x, out) in enumerate(zip(xs, call.outs)):
        shape = shape_of(x)
        if shape_of(out) != shape or not shape:
            raise UnsupportedCall(f"{call.record.name}: output {n} is not shaped as input {n}")
        dd = shape[-1]
        half, h2 = dd // 2, dd - dd // 2
        split, idx = _storage_order(out, f"i - {start}u")
        last = idx[-1]
        other = offset(x, [*idx[:-1], f"select({last} - {h2}u, {last} + {half}u, {last} < {h2}u)"])
        parts.append(f"""if (i < {start + numel(out)}u) {{
    {split}
    let xo = ld_in{n}({offset(x, idx)});
    let xr = ld_in{n}({other});
    let rot = select(xr, -xr, {last} < {h2}u);
    let c = ld_in{len(xs)}({offset(cos, idx, shape)});
    st_out{n}(i - {start}u, xo * c + rot * ld_in{len(xs) + 1}({offset(sin, idx, shape)}));
    return;
  }}""")
        start += numel(out)
    return per_element(call, start, "\n  ".join(parts))


def kv_update(call: Call) -> Shader | list[Shader]:
    """KV_UPDATE: ``new`` written into the cache at ``index`` (int64 positions) along ``dim``. In a program the
    output is the cache's state slot (input 0) and only the written rows are touched; an output of its own (a
    one-node program) first gets a copy of the whole cache. Positions outside the cache are skipped: a write
    never leaves the tensor."""
    cache, new, index = call.ins
    out = call.outs[0]
    shape = shape_of(cache)
    dim = _dim(call.param("dim", 2), len(shape), "dim")
    nshape = shape_of(new)
    if len(nshape) != len(shape) or shape_of(out) != shape or [s for i, s in enumerate(nshape) if i != dim] != \
            [s for i, s in enumerate(shape) if i != dim] or shape_of(index) != [nshape[dim]]:
        raise UnsupportedCall(f"KV_UPDATE of {nshape} into {shape} at {shape_of(index)} along dim {dim}")
    if index.dtype not in ("int64", "int32"):
        raise UnsupportedCall(f"positions must be int64 or int32, got {index.dtype}")
    if cache.dtype != out.dtype or new.dtype != out.dtype:
        raise UnsupportedCall("KV_UPDATE writes the cache's own dtype")
    split, idx = _storage_order(new)
    dst = [*idx[:dim], "u32(pos)", *idx[dim + 1:]]
    scatter = (f"{split}\n  let pos = ld_in2({offset(index, [idx[dim]])});\n"
               f"  if (pos < 0 || pos >= {shape[dim]}) {{ return; }}\n"
               f"  {move(call, 1, 'i', offset(out, dst), 0)}")
    write = per_element(call, numel(new), scatter)
    if call.in_place.get(0) == 0:
        return write
    csplit, cidx = _storage_order(out)
    copy = move(call, 0, "i", "i", 0) if cache.layout == out.layout else \
        f"{csplit}\n  {move(call, 0, offset(cache, cidx), 'i', 0)}"
    return [per_element(call, numel(out), copy), write]


def embedding(call: Call) -> Shader:
    """EMBEDDING: y[..., e] = table[id, e] for int64 ids of any shape; with ``negative_wraps`` (ONNX Gather) a
    negative id counts from the end.

    A shader cannot raise, so an id outside the table is refused on the host: the Executor checks every graph
    input that feeds an EMBEDDING's ids at copy-in (``npu_runtime.embedding_ids``), and ids the program computes
    (an argmax) are in range by construction. The row is clamped into the table all the same, so that no id,
    however it got here, reads outside the table's buffer."""
    table, ids = call.ins
    out = call.outs[0]
    if len(shape_of(table)) != 2 or ids.dtype not in ("int64", "int32"):
        raise UnsupportedCall("EMBEDDING needs a 2-d table and integer ids")
    rows = shape_of(table)[0]
    if rows == 0:
        raise UnsupportedCall("EMBEDDING of an empty table")
    split, idx = _storage_order(out)
    # ids are i32 here (an int64's low word); rows fit an i32, so id + rows cannot overflow for a negative id
    wrapped = f"select(id, id + {rows}, id < 0)" if call.params.get("negative_wraps") else "id"
    row = f"u32(clamp({wrapped}, 0, {rows - 1}))"
    body = (f"{split}\n  let id = ld_in1({offset(ids, idx[:-1])});\n"
            f"  {move(call, 0, offset(table, [row, idx[-1]]), 'i', 0)}")
    return per_element(call, numel(out), body)
