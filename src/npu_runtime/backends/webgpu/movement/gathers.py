"""Gathers by index tensors: index (advanced indexing), gather, index_select.

Index tensors are int64 or int32; a negative index wraps once as torch's does and the result is clamped into
the dim, so an index torch would reject can never read outside the tensor (torch raises; a GPU kernel cannot,
and must not touch other tensors' memory).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..wgsl import Call, Shader, UnsupportedCall, numel, offset, shape_of
from .common import check_shape, copy_from, indices, int_param, load_index, norm_dim, with_dim


def _broadcast(shapes: Sequence[Sequence[int]]) -> list[int]:
    """numpy's broadcast shape (an index tensors' common shape)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for k, d in enumerate(s, rank - len(s)):
            if d != 1 and out[k] not in (1, d):
                raise UnsupportedCall(f"index shapes {list(shapes)} do not broadcast")
            out[k] = d if d != 1 else out[k]
    return out


def index(call: Call) -> Shader:
    """index.Tensor (advanced indexing): ``indices`` lists, per leading dim of self, the input position of its
    index tensor or None for a dim taken whole. The index tensors broadcast to one shape B; when the indexed
    dims are adjacent B replaces them in place, else B comes first (numpy's rule)."""
    src = call.ins[0]
    shape = shape_of(src)
    entries = call.param("indices", [])
    if not isinstance(entries, list) or len(entries) > len(shape):
        raise UnsupportedCall(f"indices {entries!r} for a tensor of rank {len(shape)}")
    entries = entries + [None] * (len(shape) - len(entries))
    indexed = [p for p, e in enumerate(entries) if e is not None]
    for e in entries:
        if e is not None and (isinstance(e, bool) or not isinstance(e, int) or not 1 <= e < len(call.ins)):
            raise UnsupportedCall(f"indices {entries!r}: entries must be input positions past self, or null")
    if not indexed:
        check_shape(call.outs[0], shape, "index")
        return copy_from(call, indices(len(shape)))
    b = _broadcast([shape_of(call.ins[entries[p]]) for p in indexed])
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    first = indexed[0] if adjacent else 0
    rest = [d for d in range(len(shape)) if d not in indexed]
    out_shape = shape[:first] + b + shape[indexed[-1] + 1:] if adjacent else b + [shape[d] for d in rest]
    check_shape(call.outs[0], out_shape, "index")
    out_idx = indices(len(out_shape))
    b_idx = out_idx[first:first + len(b)]
    rest_idx = out_idx[:first] + out_idx[first + len(b):]
    lines, src_idx = [], [""] * len(shape)
    for p in indexed:
        k = entries[p]
        lines.append(load_index(call, k, offset(call.ins[k], b_idx, b), shape[p], f"x{p}"))
        src_idx[p] = f"x{p}"
    for d, name in zip(rest, rest_idx):
        src_idx[d] = name
    return copy_from(call, src_idx, lines=lines)


def gather(call: Call) -> Shader:
    """out[..., j, ...] = self[..., index[..., j, ...], ...] along dim (the output has the index's shape)."""
    shape, index_shape = shape_of(call.ins[0]), shape_of(call.ins[1])
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(call.outs[0], index_shape, "gather")
    if len(index_shape) != len(shape) or any(i > s for d, (i, s) in enumerate(zip(index_shape, shape)) if d != dim):
        raise UnsupportedCall(f"gather: an index of {index_shape} does not fit self of {shape} off dim {dim}")
    idx = indices(len(index_shape))
    lines = [load_index(call, 1, offset(call.ins[1], idx), shape[dim] if shape else 1, "x")]
    src = list(idx)
    if src:
        src[dim] = "x"
    return copy_from(call, src, lines=lines)


def index_select(call: Call) -> Shader:
    """The input at the indices of a 1-D (or 0-d) index tensor along dim."""
    shape = shape_of(call.ins[0])
    if not shape or len(shape_of(call.ins[1])) > 1:
        raise UnsupportedCall(f"index_select of {shape} by an index of {shape_of(call.ins[1])}: expected a 1-D index "
                              "into a tensor of at least one dim")
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(call.outs[0], with_dim(shape, dim, numel(call.ins[1])), "index_select")
    idx = indices(len(shape))
    lines = [load_index(call, 1, offset(call.ins[1], idx[dim:dim + 1]), shape[dim], "x")]
    src = list(idx)
    src[dim] = "x"
    return copy_from(call, src, lines=lines)
