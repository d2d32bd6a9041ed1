"""Shape and movement ONNX ops: reshape, transpose, slice, gather, concat, pad, expand, ...

Shape-like inputs (reshape targets, axes, pads, slice bounds) must be known at import time;
the importer folds the subgraphs that compute them when the input shapes are static.
"""

# ruff: noqa: N802 - converters are named after the ONNX op they translate (Conv, MatMul, ...)

from __future__ import annotations

import numpy as np
import torch

from ..context import Ctx, Sym, UnsupportedNode
from ..dtypes import ONNX_TO_IR
from . import converter


def _axis(axis: int, rank: int) -> int:
    """``axis`` in ``[0, rank)`` (a negative one counts from the end); out of range, the node is refused."""
    if not -rank <= axis < max(rank, 1):
        raise UnsupportedNode(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


@converter("Reshape", since=5)
def Reshape(ctx: Ctx, x, shape, *, allowzero=0):
    target = ctx.ints(shape, "Reshape's shape")
    if not allowzero:  # 0 copies the input's size on that axis
        target = [ctx.shape(x)[i] if d == 0 else d for i, d in enumerate(target)]
    return ctx.aten("reshape", x, _sizes(ctx, target))


def _sizes(ctx: Ctx, dims: list) -> list:
    """Sizes for an ATen size argument: a symbolic dim becomes a ``Sym`` (stored as ``{"sym": name}``)."""
    return [d if isinstance(d, int) else Sym(d) for d in dims]


@converter("Flatten")
def Flatten(ctx: Ctx, x, *, axis=1):
    shape = ctx.shape(x)
    axis = len(shape) if axis == len(shape) else _axis(axis, len(shape))  # ONNX allows axis = rank: [N, 1]
    outer, inner = shape[:axis], shape[axis:]
    static = lambda dims: all(isinstance(d, int) for d in dims)  # noqa: E731
    if not (static(outer) or static(inner)):
        raise UnsupportedNode("Flatten with symbolic dimensions on both sides of the axis")
    # -1 stands for the side with symbols, so the target holds no symbolic product
    target = [int(np.prod(outer)) if static(outer) else -1, int(np.prod(inner)) if static(inner) else -1]
    if static(outer) and static(inner):
        target = [int(np.prod(outer)), int(np.prod(inner))]
    return ctx.aten("reshape", x, target)


@converter("Transpose")
def Transpose(ctx: Ctx, x, *, perm=None):
    perm = perm if perm is not None else list(range(ctx.rank(x)))[::-1]
    return ctx.aten("permute", x, list(perm))


@converter("Squeeze", since=1)
def Squeeze_1(ctx: Ctx, x, *, axes=None):
    rank = ctx.rank(x)
    dims = [_axis(a, rank) for a in axes] if axes is not None else [i for i, d in enumerate(ctx.shape(x)) if d == 1]
    return ctx.aten("squeeze.dims", x, dims)


@converter("Squeeze", since=13)
def Squeeze(ctx: Ctx, x, axes=None):
    return Squeeze_1(ctx, x, axes=None if axes is None else ctx.ints(axes, "Squeeze's axes"))


@converter("Unsqueeze", since=1)
def Unsqueeze_1(ctx: Ctx, x, *, axes):
    rank = ctx.rank(x) + len(axes)
    target = list(ctx.shape(x))
    for a in sorted(_axis(a, rank) for a in axes):
        target.insert(a, 1)
    return ctx.aten("reshape", x, _sizes(ctx, target))


@converter("Unsqueeze", since=13)
def Unsqueeze(ctx: Ctx, x, axes):
    return Unsqueeze_1(ctx, x, axes=ctx.ints(axes, "Unsqueeze's axes"))


@converter("Concat", since=4)
def Concat(ctx: Ctx, *xs, axis):
    return ctx.aten("cat", list(xs), _axis(axis, ctx.rank(xs[0])))


@converter("Split", since=2)
def Split_2(ctx: Ctx, x, *, axis=0, split=None, num_outputs=None):
    return _split(ctx, x, axis, split, num_outputs)


@converter("Split", since=13)
def Split(ctx: Ctx, x, split=None, *, axis=0, num_outputs=None):
    return _split(ctx, x, axis, None if split is None else ctx.ints(split, "Split's split"), num_outputs)


def _split(ctx: Ctx, x, axis: int, split, num_outputs):
    axis = _axis(axis, ctx.rank(x))
    size = ctx.shape(x)[axis]
    if split is None:
        n = num_outputs or ctx.n_outputs
        if n != ctx.n_outputs or not isinstance(size, int) or n < 1:
            raise UnsupportedNode(f"Split into {n} pieces of an axis of size {size}, for {ctx.n_outputs} outputs")
        chunk = -(-size // n)  # ceil: the last piece is the smaller one (opset 18)
        split = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
    outs = ctx.aten("split_with_sizes", x, list(split), axis)
    return tuple(outs) if isinstance(outs, list) else (outs,)


@converter("Slice", since=1)
def Slice_1(ctx: Ctx, x, *, starts, ends, axes=None):
    return _slice(ctx, x, list(starts), list(ends), axes, None)


@converter("Slice", since=10)
def Slice(ctx: Ctx, x, starts, ends, axes=None, steps=None):
    return _slice(ctx, x, ctx.ints(starts, "Slice's starts"), ctx.ints(ends, "Slice's ends"),
                  None if axes is None else ctx.ints(axes, "Slice's axes"),
                  None if steps is None else ctx.ints(steps, "Slice's steps"))


def _slice(ctx: Ctx, x, starts, ends, axes, steps):
    rank = ctx.rank(x)
    axes = [_axis(a, rank) for a in (axes if axes is not None else range(len(starts)))]
    steps = steps or [1] * len(starts)
    out = x
    for axis, start, end, step in zip(axes, starts, ends, steps):
        size = ctx.shape(x)[axis]
        if isinstance(start, str) or isinstance(end, str):
            # a symbolic bound (x[:, :seq]) is taken as it is: ONNX's clamping needs its value
            if step < 0:
                raise UnsupportedNode("Slice with a symbolic bound and a negative step")
            if step != 1 or not isinstance(end, str) or start != 0:
                raise UnsupportedNode("Slice with symbolic bounds other than [0, n)")
            out = ctx.aten("slice.Tensor", out, axis, 0, Sym(end), 1)
            out.shape[axis] = end  # the meta run clamps the symbol's stand-in size to the axis; the size is `end`
            continue
        if not isinstance(size, int):
            raise UnsupportedNode("Slice on a symbolic axis")
        start, end = _clamp(start, size, step), _clamp(end, size, step)
        if step < 0:
            # ATen slices with positive steps only: flip, then slice the mirrored range
            out = ctx.aten("flip", out, [axis])
            start, end = size - 1 - start, size - 1 - end
            step = -step
        out = ctx.aten("slice.Tensor", out, axis, start, max(start, end), step)
    return out if out is not x else ctx.aten("clone", x)


def _clamp(index: int, size: int, step: int) -> int:
    """ONNX's clamping of a slice bound into [0, size] (or [-1, size-1] for negative steps)."""
    if index < 0:
        index += size
    return max(-1, min(size - 1, index)) if step < 0 else max(0, min(size, index))


@converter("Expand", since=8)
def Expand(ctx: Ctx, x, shape):
    # ONNX broadcasts both ways (a 1 in `shape` keeps x's size), unlike aten.expand
    target = _broadcast(ctx.shape(x), ctx.ints(shape, "Expand's shape"))
    rank = len(target)
    if ctx.rank(x) < rank:
        x = ctx.aten("reshape", x, [1] * (rank - ctx.rank(x)) + ctx.shape(x))
    return ctx.aten("expand", x, target) if target != ctx.shape(x) else ctx.aten("clone", x)


def _broadcast(a: list, b: list) -> list:
    """numpy broadcasting of two shapes whose sizes may be symbols (a symbol against n > 1 is n)."""
    rank = max(len(a), len(b))
    a, b = [1] * (rank - len(a)) + list(a), [1] * (rank - len(b)) + list(b)
    out = []
    for p, q in zip(a, b):
        if p == q or q == 1:
            out.append(p)
        elif p == 1:
            out.append(q)
        elif isinstance(p, str) != isinstance(q, str):
            out.append(p if isinstance(p, int) else q)
        else:
            raise UnsupportedNode(f"cannot broadcast sizes {p} and {q}")
    return out


@converter("Tile", since=6)
def Tile(ctx: Ctx, x, repeats):
    return ctx.aten("repeat", x, ctx.ints(repeats, "Tile's repeats"))


@converter("Pad", since=2)
def Pad_2(ctx: Ctx, x, *, pads, mode="constant", value=0.0):
    return _pad(ctx, x, list(pads), mode, value, None)


@converter("Pad", since=11)
def Pad(ctx: Ctx, x, pads, constant_value=None, axes=None, *, mode="constant"):
    value = ctx.const(constant_value)
    if constant_value is not None and value is None:
        raise UnsupportedNode("Pad's constant_value must be known at import time")
    value = 0 if value is None or value.size == 0 else value.reshape(-1)[0].item()
    return _pad(ctx, x, ctx.ints(pads, "Pad's pads"), mode, value,
                None if axes is None else ctx.ints(axes, "Pad's axes"))


def _pad(ctx: Ctx, x, pads, mode, value, axes):
    rank = ctx.rank(x)
    axes = [_axis(a, rank) for a in axes] if axes is not None else list(range(rank))
    n = len(axes)
    if len(pads) != 2 * n:
        raise UnsupportedNode(f"Pad's pads has {len(pads)} values for {n} axes")
    begin, end = dict(zip(axes, pads[:n])), dict(zip(axes, pads[n:]))
    # ATen lists (begin, end) pairs from the last axis back, and only as far as the first padded axis
    first = min((a for a in axes if begin[a] or end[a]), default=rank)
    flat = [p for a in range(rank - 1, first - 1, -1) for p in (begin.get(a, 0), end.get(a, 0))]
    if not flat:
        return ctx.aten("clone", x)
    if mode == "constant":
        return ctx.aten("constant_pad_nd", x, flat, value)
    aten_mode = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}[mode]
    if any(p < 0 for p in flat) or len(flat) // 2 > 3 or len(flat) // 2 >= rank:
        raise UnsupportedNode(f"Pad mode {mode!r} with these pads has no ATen form")
    return ctx.aten("pad", x, flat, aten_mode)


@converter("ConstantOfShape", since=9)
def ConstantOfShape(ctx: Ctx, shape, *, value=None):
    # a constant under the fold limit; over it (or with symbolic sizes) an aten.full node
    dims = ctx.ints(shape, "ConstantOfShape's input")
    fill = value if value is not None else np.zeros(1, np.float32)
    if fill.size != 1:
        raise UnsupportedNode(f"ConstantOfShape's value has {fill.size} elements, not 1")
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise UnsupportedNode(f"ConstantOfShape of a negative size {dims}")
    return ctx.full(dims, fill)


@converter("Constant")
def Constant(ctx: Ctx, *, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
             sparse_value=None, value_string=None, value_strings=None):
    if value is not None:
        return np.asarray(value)
    for v, dtype in ((value_float, np.float32), (value_floats, np.float32), (value_int, np.int64),
                     (value_ints, np.int64)):
        if v is not None:
            return np.array(v, dtype=dtype)
    raise UnsupportedNode("string and sparse constants have no IR form")


@converter("Trilu", since=14)
def Trilu(ctx: Ctx, x, k=None, *, upper=1):
    diagonal = 0 if k is None else ctx.ints(k, "Trilu's k")[0]
    return ctx.aten("triu" if upper else "tril", x, diagonal)


@converter("Dropout", since=7)
def Dropout(ctx: Ctx, x, ratio=None, training_mode=None, *, seed=None, ratio_attr=None, is_test=None):
    if training_mode is not None and ctx.const(training_mode) is not None and bool(ctx.const(training_mode)):
        raise UnsupportedNode("Dropout in training mode is random")
    if ctx.n_outputs < 2:
        return x
    return x, ctx.full(ctx.shape(x), np.ones(1, dtype=bool))  # the mask: a constant, or aten.full when large


@converter("Shape", since=1)
def Shape(ctx: Ctx, x, *, start=0, end=None):
    raise UnsupportedNode("Shape of a tensor with symbolic dimensions (bind them with input_shapes=)")


@converter("EyeLike")
def EyeLike(ctx: Ctx, x, *, dtype=None, k=0):
    n, m = ctx.shape(x)
    out_dtype = ONNX_TO_IR[dtype] if dtype is not None else ctx.dtype(x)
    itemsize = np.dtype(out_dtype).itemsize
    if not ctx.fits([n, m], itemsize):  # over the fold limit: the ONNX op computes it at run time
        ctx.refuse_fold([n, m], itemsize, "EyeLike's output")
    return np.eye(n, m, k, dtype=np.dtype(out_dtype))


@converter("DepthToSpace", since=11)
def DepthToSpace(ctx: Ctx, x, *, blocksize, mode="DCR"):
    b, c, h, w = ctx.shape(x)
    bs = blocksize
    if mode == "DCR":
        y = ctx.aten("reshape", x, [b, bs, bs, c // bs**2, h, w])
        y = ctx.aten("permute", y, [0, 3, 4, 1, 5, 2])
    else:
        y = ctx.aten("reshape", x, [b, c // bs**2, bs, bs, h, w])
        y = ctx.aten("permute", y, [0, 1, 4, 2, 5, 3])
    return ctx.aten("reshape", y, [b, c // bs**2, h * bs, w * bs])


@converter("SpaceToDepth")
def SpaceToDepth(ctx: Ctx, x, *, blocksize):
    b, c, h, w = ctx.shape(x)
    bs = blocksize
    y = ctx.aten("reshape", x, [b, c, h // bs, bs, w // bs, bs])
    y = ctx.aten("permute", y, [0, 3, 5, 1, 2, 4])
    return ctx.aten("reshape", y, [b, c * bs * bs, h // bs, w // bs])


@converter("Range", since=11)
def Range(ctx: Ctx, start, limit, delta):
    # reached when a bound is a symbolic size (aten.arange takes SymInts), or when constant bounds make a
    # range over the fold limit
    bounds = [ctx.ints(v, "Range's bounds")[0] for v in (start, limit, delta)]
    dtype = ctx.dtype(start) if ctx.dtype(start) != "object" else "int64"
    if dtype != "int64":
        raise UnsupportedNode("Range of symbolic bounds other than int64")
    return ctx.aten("arange.start_step", *[Sym(b) if isinstance(b, str) else b for b in bounds],
                    dtype=torch.int64, device=torch.device("cpu"))  # the device: the meta run allocates nothing


@converter("CenterCropPad", since=18)
def CenterCropPad(ctx: Ctx, x, shape, *, axes=None):
    rank = ctx.rank(x)
    axes = [_axis(a, rank) for a in axes] if axes is not None else list(range(rank))
    out = x
    for axis, target in zip(axes, ctx.ints(shape, "CenterCropPad's shape")):
        size = ctx.shape(out)[axis]
        if target < size:  # crop: the larger half is cut from the end
            start = (size - target) // 2
            out = ctx.aten("slice.Tensor", out, axis, start, start + target)
        elif target > size:  # pad: the larger half goes at the end
            front = (target - size) // 2
            flat = [0, 0] * (rank - 1 - axis) + [front, target - size - front]
            out = ctx.aten("constant_pad_nd", out, flat, 0)
    return out if out is not x else ctx.aten("clone", x)
