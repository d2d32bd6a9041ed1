"""Joining and splitting along one dim: cat, split (split_with_sizes), unbind."""

from __future__ import annotations

from ..wgsl import Call, Shader, UnsupportedCall, move, numel, offset, per_element, shape_of, unravel
from .common import check_shape, indices, int_param, ints_param, norm_dim, per_output, with_dim, without_dim


def _positions(call: Call, name: str) -> list[int]:
    """A tensor-list parameter: input positions (checked: the program file is untrusted)."""
    positions = ints_param(call, name)
    if not all(0 <= p < len(call.ins) for p in positions):
        raise UnsupportedCall(f"parameter {name!r} = {positions} names inputs beyond the {len(call.ins)} given")
    return positions


def cat(call: Call) -> Shader:
    """The inputs named by ``tensors`` joined along dim: each output element reads the input whose range
    along dim holds it (an if-chain over the inputs' start offsets)."""
    out = call.outs[0]
    shape = shape_of(out)
    dim = norm_dim(int_param(call, "dim", 0), len(shape))
    # torch's legacy rule: a 1-D empty tensor joins anything and adds nothing
    parts = [p for p in _positions(call, "tensors") if shape_of(call.ins[p]) != [0]]
    branches, start = [], 0
    for p in parts:
        size = shape_of(call.ins[p])[dim] if len(shape_of(call.ins[p])) == len(shape) else -1
        check_shape(call.ins[p], with_dim(shape, dim, size), "cat")
        if size == 0:
            continue
        src = indices(len(shape))
        src[dim] = f"(d{dim} - {start}u)"
        branches.append((start + size, move(call, p, offset(call.ins[p], src), offset(out, indices(len(shape))))))
        start += size
    if start != shape[dim]:
        raise UnsupportedCall(f"cat: the inputs add up to {start} along dim {dim}, the output has {shape[dim]}")
    chain = " else ".join(f"if (d{dim} < {end}u) {{ {stmt} }}" for end, stmt in branches)
    return per_output(call, [chain] if chain else [])


def _scatter_along(call: Call, dim: int, pieces: list[tuple[int, int, int]], drop: bool) -> Shader:
    """One invocation per input element, written to the output piece that holds it along dim: ``pieces`` are
    (output, start, size); ``drop``: the outputs lack that dim (unbind)."""
    src = call.ins[0]
    shape = shape_of(src)
    idx = indices(len(shape))
    branches = []
    for j, start, size in pieces:
        dst = list(idx)
        if drop:
            del dst[dim]
        else:
            dst[dim] = f"(d{dim} - {start}u)"
        stmt = move(call, 0, offset(src, idx), offset(call.outs[j], dst), j)
        branches.append(f"if (d{dim} < {start + size}u) {{ {stmt} }}")
    return per_element(call, numel(src), "\n  ".join([unravel("i", shape), " else ".join(branches)]))


def split(call: Call) -> Shader:
    """split_with_sizes: consecutive pieces of ``split_sizes`` along dim, one output each."""
    shape = shape_of(call.ins[0])
    dim = norm_dim(int_param(call, "dim", 0), len(shape))
    sizes = ints_param(call, "split_sizes")
    if len(sizes) != len(call.outs) or sum(sizes) != shape[dim] or min(sizes, default=0) < 0:
        raise UnsupportedCall(f"split sizes {sizes} do not split {shape[dim]} into {len(call.outs)} outputs")
    pieces, start = [], 0
    for j, size in enumerate(sizes):
        check_shape(call.outs[j], with_dim(shape, dim, size), "split")
        if size:
            pieces.append((j, start, size))
        start += size
    return _scatter_along(call, dim, pieces, drop=False)


def unbind(call: Call) -> Shader:
    """Every index along dim as its own output (that dim removed)."""
    shape = shape_of(call.ins[0])
    dim = norm_dim(int_param(call, "dim", 0), len(shape))
    if len(call.outs) != shape[dim]:
        raise UnsupportedCall(f"unbind of {shape[dim]} into {len(call.outs)} outputs")
    for j in range(len(call.outs)):
        check_shape(call.outs[j], without_dim(shape, dim), "unbind")
    return _scatter_along(call, dim, [(j, j, 1) for j in range(len(call.outs))], drop=True)
