"""WGSL generators of the attention kernels: ATTENTION (online softmax over key blocks), ATTN_SCORE, ATTN_OUTPUT.

One workgroup per query row (b, h, t); grouped-query heads read their shared key/value head.
"""

from __future__ import annotations

from npu_program.program import TensorSpec

from ..wgsl import Call, Shader, UnsupportedCall, literal, logical_strides, offset, per_group, shape_of
from .rows import SHARED_BYTES, reductions, require_floats, workgroup_size


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
    require_floats(call, q, k, v, out)
    hd = _Heads(call, q, k, v)
    d = shape_of(q)[3]
    if 4 * d > SHARED_BYTES // 4:
        raise UnsupportedCall(f"head_dim {d} is too wide for workgroup memory")
    wg = workgroup_size(max(min(hd.s, 256), hd.dv))
    block = max(1, min(hd.s, 2048, (SHARED_BYTES - 4 * d - 4 * wg) // 4))
    dc, _, npt = hd.pv_setup(wg)
    end = f"min({hd.s}u, t + 1u)" if call.param("causal", False) else f"{hd.s}u"
    qst = logical_strides(q)
    pv = hd.pv_accumulate(2, "sc[j]", "s0 + j", "nb", wg)
    fns = _score_fns(call, hd, q, k, 3 if mask is not None else None, q_shared=True)
    shared = f"{reductions(wg)}\nvar<workgroup> qs: array<f32, {d}>;\nvar<workgroup> sc: array<f32, {block}>;\n{fns}"
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
    require_floats(call, q, k, out)
    hd = _Heads(call, q, k, k)
    wg = workgroup_size(hd.s)
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
    return per_group(call, hd.b * hd.h * hd.t, wg, body, shared=f"{reductions(wg)}\n{fns}")


def attn_output(call: Call) -> Shader:
    """ATTN_OUTPUT: y = p·v (v shared by grouped-query heads), heads merged or not; one workgroup per row of p,
    the value columns over the invocations and the positions over slices of them."""
    p, v = call.ins
    out = call.outs[0]
    require_floats(call, p, v, out)
    hd = _Heads(call, p, None, v)
    if shape_of(p)[3] != hd.s:
        raise UnsupportedCall(f"p {shape_of(p)} does not match v {shape_of(v)}")
    wg = workgroup_size(max(min(hd.s, 256), hd.dv))
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
    return per_group(call, hd.b * hd.h * hd.t, wg, body, shared=reductions(wg))
