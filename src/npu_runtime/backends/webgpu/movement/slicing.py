"""Slicing and selecting along one dim, and the scatters of static positions (slice_scatter, select_scatter)."""

from __future__ import annotations

from collections.abc import Sequence

from ..wgsl import Call, Shader, UnsupportedCall, move, offset, shape_of
from .common import check_shape, copy_from, indices, int_param, norm_dim, per_output, with_dim, without_dim


def _bound(value: int | None, default: int, size: int) -> int:
    """torch's clamping of a slice bound: None is the default, a negative one counts from the end, then the
    result is clamped into [0, size]."""
    if value is None:
        return default
    if value < 0:
        value += size
    return min(max(value, 0), size)


def _slice_params(call: Call, shape: Sequence[int]) -> tuple[int, int, int, int]:
    """(dim, start, step, length) of a slice or slice_scatter of a tensor of ``shape``, as torch clamps them."""
    dim = norm_dim(int_param(call, "dim", 0), len(shape))
    bounds = [call.params.get("start"), call.params.get("end")]
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, int)) for v in bounds):
        raise UnsupportedCall(f"slice bounds {bounds} are not integers")
    step = int_param(call, "step", 1)
    if step < 1:
        raise UnsupportedCall(f"slice step {step}: torch takes only positive steps")
    size = shape[dim]
    start = _bound(bounds[0], 0, size)
    end = max(_bound(bounds[1], size, size), start)
    return dim, start, step, -(-(end - start) // step)


def slice(call: Call) -> Shader:
    """slice.Tensor: output index j along dim reads start + j * step."""
    shape = shape_of(call.ins[0])
    dim, start, step, length = _slice_params(call, shape)
    check_shape(call.outs[0], with_dim(shape, dim, length), "slice")
    src = indices(len(shape))
    src[dim] = f"({start}u + d{dim} * {step}u)"
    return copy_from(call, src)


def _wrap(index: int, size: int) -> int:
    """A static index: negative counts from the end; clamped into [0, size) (torch would raise)."""
    if index < 0:
        index += size
    return min(max(index, 0), max(size - 1, 0))


def select(call: Call) -> Shader:
    """select.int: the input at one index along dim (a negative index counts from the end; clamped)."""
    shape = shape_of(call.ins[0])
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(call.outs[0], without_dim(shape, dim), "select")
    src = indices(len(shape) - 1)
    src.insert(dim, f"{_wrap(int_param(call, 'index'), shape[dim])}u")
    return copy_from(call, src)


def slice_scatter(call: Call) -> Shader:
    """self (input 0) with positions start, start + step, ... along dim replaced by src (input 1)."""
    out = call.outs[0]
    shape = shape_of(call.ins[0])
    dim, start, step, length = _slice_params(call, shape)
    check_shape(out, shape, "slice_scatter")
    check_shape(call.ins[1], with_dim(shape, dim, length), "slice_scatter")
    idx = indices(len(shape))
    from_src = list(idx)
    from_src[dim] = f"((d{dim} - {start}u) / {step}u)"
    dst = offset(out, idx)
    return per_output(call, [
        f"let hit = d{dim} >= {start}u && (d{dim} - {start}u) % {step}u == 0u "
        f"&& (d{dim} - {start}u) / {step}u < {length}u;",
        f"if (hit) {{ {move(call, 1, offset(call.ins[1], from_src), dst)} }} "
        f"else {{ {move(call, 0, offset(call.ins[0], idx), dst)} }}"])


def select_scatter(call: Call) -> Shader:
    """self (input 0) with one index along dim replaced by src (input 1)."""
    out = call.outs[0]
    shape = shape_of(call.ins[0])
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(out, shape, "select_scatter")
    check_shape(call.ins[1], without_dim(shape, dim), "select_scatter")
    index = _wrap(int_param(call, "index"), shape[dim])
    idx = indices(len(shape))
    dst = offset(out, idx)
    return per_output(call, [
        f"if (d{dim} == {index}u) {{ {move(call, 1, offset(call.ins[1], without_dim(idx, dim)), dst)} }} "
        f"else {{ {move(call, 0, offset(call.ins[0], idx), dst)} }}"])
