"""WGSL generators of the per-position kernels of a decoder: ROPE / ROPE_QK (rotary embedding), KV_UPDATE (the
cache write) and EMBEDDING (the token lookup), one invocation per element in storage order."""

from __future__ import annotations

from ..wgsl import Call, Shader, UnsupportedCall, move, numel, offset, per_element, shape_of
from .rows import checked_dim, require_floats, storage_order


def rope(call: Call) -> Shader:
    """ROPE (x, cos, sin -> y) and ROPE_QK (q, k, cos, sin -> q', k'): y = x·cos + rotate_half(x)·sin with
    rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]) (D odd: the reference's split at D // 2); cos and sin
    broadcast to each input. ROPE_QK is one dispatch over q's elements then k's."""
    *xs, cos, sin = call.ins
    if len(xs) != len(call.outs) or not xs:
        raise UnsupportedCall(f"{call.record.name}: {len(call.ins)} inputs for {len(call.outs)} outputs")
    require_floats(call, *call.ins, *call.outs)
    parts, start = [], 0
    for n, (x, out) in enumerate(zip(xs, call.outs)):
        shape = shape_of(x)
        if shape_of(out) != shape or not shape:
            raise UnsupportedCall(f"{call.record.name}: output {n} is not shaped as input {n}")
        dd = shape[-1]
        half, h2 = dd // 2, dd - dd // 2
        split, idx = storage_order(out, f"i - {start}u")
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
    dim = checked_dim(call.param("dim", 2), len(shape), "dim")
    nshape = shape_of(new)
    if len(nshape) != len(shape) or shape_of(out) != shape or [s for i, s in enumerate(nshape) if i != dim] != \
            [s for i, s in enumerate(shape) if i != dim] or shape_of(index) != [nshape[dim]]:
        raise UnsupportedCall(f"KV_UPDATE of {nshape} into {shape} at {shape_of(index)} along dim {dim}")
    if index.dtype not in ("int64", "int32"):
        raise UnsupportedCall(f"positions must be int64 or int32, got {index.dtype}")
    if cache.dtype != out.dtype or new.dtype != out.dtype:
        raise UnsupportedCall("KV_UPDATE writes the cache's own dtype")
    split, idx = storage_order(new)
    dst = [*idx[:dim], "u32(pos)", *idx[dim + 1:]]
    scatter = (f"{split}\n  let pos = ld_in2({offset(index, [idx[dim]])});\n"
               f"  if (pos < 0 || pos >= {shape[dim]}) {{ return; }}\n"
               f"  {move(call, 1, 'i', offset(out, dst), 0)}")
    write = per_element(call, numel(new), scatter)
    if call.in_place.get(0) == 0:
        return write
    csplit, cidx = storage_order(out)
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
    split, idx = storage_order(out)
    # ids are i32 here (an int64's low word); rows fit an i32, so id + rows cannot overflow for a negative id
    wrapped = f"select(id, id + {rows}, id < 0)" if call.params.get("negative_wraps") else "id"
    row = f"u32(clamp({wrapped}, 0, {rows - 1}))"
    body = (f"{split}\n  let id = ld_in1({offset(ids, idx[:-1])});\n"
            f"  {move(call, 0, offset(table, [row, idx[-1]]), 'i', 0)}")
    return per_element(call, numel(out), body)
