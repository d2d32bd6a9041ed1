"""Neural-network ONNX ops: convolution, matrix products, normalization, softmax, pooling, resize."""

# ruff: noqa: N802 - converters are named after the ONNX op they translate (Conv, MatMul, ...)

from __future__ import annotations

import math

from ..context import Ctx, UnsupportedNode
from . import converter


def _spatial_pads(ctx: Ctx, x, kernel, strides, dilations, pads, auto_pad) -> list[int]:
    """ONNX pads [b1, b2, ..., e1, e2, ...] for the spatial axes, auto_pad resolved."""
    n = len(kernel)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(ctx.shape(x)[2:], kernel, strides, dilations):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        return [b for b, _ in out] + [e for _, e in out]
    if auto_pad == "VALID":
        return [0] * (2 * n)
    return list(pads) if pads is not None else [0] * (2 * n)


def _symmetric(ctx: Ctx, x, pads: list[int], value: float):
    """(x, per-axis padding): asymmetric pads are applied to x first with constant_pad_nd."""
    n = len(pads) // 2
    if pads[:n] == pads[n:]:
        return x, pads[:n]
    return _pad_spatial(ctx, x, pads, value), [0] * n


def _pad_spatial(ctx: Ctx, x, pads: list[int], value: float):
    """``x`` padded by ONNX pads [b1, b2, ..., e1, e2, ...] on its spatial axes."""
    n = len(pads) // 2
    flat = [p for b, e in zip(pads[:n][::-1], pads[n:][::-1]) for p in (b, e)]
    return ctx.aten("constant_pad_nd", x, flat, value)


@converter("Conv")
def Conv(ctx: Ctx, x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None):
    kernel = kernel_shape or ctx.shape(w)[2:]
    n = len(kernel)
    strides, dilations = strides or [1] * n, dilations or [1] * n
    x, padding = _symmetric(ctx, x, _spatial_pads(ctx, x, kernel, strides, dilations, pads, auto_pad), 0.0)
    return ctx.aten("convolution", x, w, b, strides, padding, dilations, False, [0] * n, group)


@converter("ConvTranspose")
def ConvTranspose(ctx: Ctx, x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                  output_padding=None, output_shape=None, pads=None, strides=None):
    kernel = kernel_shape or ctx.shape(w)[2:]
    n = len(kernel)
    strides, dilations = strides or [1] * n, dilations or [1] * n
    output_padding = list(output_padding or [0] * n)
    sizes = ctx.shape(x)[2:]
    full = [s * (i - 1) + op + ((k - 1) * d + 1) for i, s, op, k, d in zip(sizes, strides, output_padding, kernel,
                                                                          dilations)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        want = list(output_shape)[-n:] if output_shape is not None else [i * s for i, s in zip(sizes, strides)]
        total = [f - o for f, o in zip(full, want)]
        # an output larger than the full result is reached by output padding, not negative padding
        output_padding = [op - min(t, 0) for op, t in zip(output_padding, total)]
        total = [max(t, 0) for t in total]
        upper = auto_pad != "SAME_LOWER"  # with output_shape, ONNX puts the odd pad at the end
        pads = [t // 2 if upper else t - t // 2 for t in total] + [t - t // 2 if upper else t // 2 for t in total]
    pads = list(pads) if pads is not None else [0] * (2 * n)
    begin, end = pads[:n], pads[n:]
    if any(e < b for b, e in zip(begin, end)):
        raise UnsupportedNode("ConvTranspose with more padding at the start than at the end")
    # ATen pads both sides by `padding`; the extra end padding is removed by shrinking output_padding
    extra = [e - b for b, e in zip(begin, end)]
    out_pad = [op - e for op, e in zip(output_padding, extra)]
    if any(p < 0 for p in out_pad):
        y = ctx.aten("convolution", x, w, b, strides, begin, dilations, True, [0] * n, group)
        for axis, cut in enumerate(extra):
            if cut:
                size = ctx.shape(y)[2 + axis]
                y = ctx.aten("slice.Tensor", y, 2 + axis, 0, size - cut + output_padding[axis])
        return y
    return ctx.aten("convolution", x, w, b, strides, begin, dilations, True, out_pad, group)


@converter("MatMul")
def MatMul(ctx: Ctx, a, b):
    return ctx.aten("matmul", a, b)


@converter("Gemm")
def Gemm(ctx: Ctx, a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 - ONNX names
    if transB and not transA and alpha == 1 and beta == 1 and (c is None or ctx.rank(c) == 1):
        return ctx.aten("linear", a, b, c)  # x @ W.T + b: the fully connected layer exporters write
    a = ctx.aten("permute", a, [1, 0]) if transA else a
    b = ctx.aten("permute", b, [1, 0]) if transB else b
    if c is None or beta == 0:
        out = ctx.aten("mm", a, b)
        return out if alpha == 1 else ctx.aten("mul.Scalar", out, alpha)
    return ctx.aten("addmm", c, a, b, beta=beta, alpha=alpha)


@converter("BatchNormalization", since=7)
def BatchNormalization(ctx: Ctx, x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0,
                       spatial=1):
    if training_mode or ctx.n_outputs > 1:
        raise UnsupportedNode("BatchNormalization in training mode (running statistics as outputs)")
    if ctx.dtype(scale) != ctx.dtype(x) or ctx.dtype(mean) != ctx.dtype(x):
        raise UnsupportedNode("BatchNormalization with mixed input dtypes")
    return ctx.aten("batch_norm", x, scale, bias, mean, var, False, momentum, epsilon, False)


@converter("InstanceNormalization")
def InstanceNormalization(ctx: Ctx, x, scale, bias, *, epsilon=1e-5):
    return ctx.aten("instance_norm", x, scale, bias, None, None, True, 0.0, epsilon, False)


@converter("LayerNormalization", since=17)
def LayerNormalization(ctx: Ctx, x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    rank = ctx.rank(x)
    axis = axis + rank if axis < 0 else axis
    normalized = ctx.shape(x)[axis:]
    # ONNX broadcasts scale and bias onto the normalized shape; ATen wants them exactly that shape
    exact = ctx.shape(scale) == normalized and (bias is None or ctx.shape(bias) == normalized)
    if ctx.dtype(x) != "float32" and stash_type == 1:
        raise UnsupportedNode("LayerNormalization of a non-float32 input computes in float32 (stash_type=1)")
    out, mean, rstd = ctx.aten("native_layer_norm", x, normalized, scale if exact else None,
                               bias if exact else None, epsilon)
    if not exact:
        out = ctx.aten("mul.Tensor", out, scale)
        out = ctx.aten("add.Tensor", out, bias) if bias is not None else out
    return out, mean, rstd


@converter("GroupNormalization", since=21)
def GroupNormalization(ctx: Ctx, x, scale, bias, *, num_groups, epsilon=1e-5, stash_type=1):
    if ctx.dtype(x) != "float32":
        raise UnsupportedNode("GroupNormalization of a non-float32 input computes in float32 (stash_type=1)")
    return ctx.aten("group_norm", x, num_groups, scale, bias, epsilon)


@converter("RMSNormalization", since=23)
def RMSNormalization(ctx: Ctx, x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    rank = ctx.rank(x)
    axis = axis + rank if axis < 0 else axis
    if ctx.dtype(x) != "float32" or ctx.shape(scale) != ctx.shape(x)[axis:]:
        raise UnsupportedNode("RMSNormalization other than float32 with a full-shape scale")
    return ctx.aten("rms_norm", x, ctx.shape(x)[axis:], scale, epsilon)


def _softmax(aten_op: str):
    def v1(ctx: Ctx, x, *, axis=1):
        # before opset 13 the input is flattened to 2-D at `axis` and normalized over the second part
        shape = ctx.shape(x)
        axis = axis + len(shape) if axis < 0 else axis
        outer = math.prod(shape[:axis])
        flat = ctx.aten("reshape", x, [outer, math.prod(shape[axis:])])
        return ctx.aten("reshape", ctx.aten(aten_op, flat, 1), shape)

    def v13(ctx: Ctx, x, *, axis=-1):
        return ctx.aten(aten_op, x, axis)
    return v1, v13


Softmax_1, Softmax = _softmax("softmax.int")
LogSoftmax_1, LogSoftmax = _softmax("log_softmax.int")
for _name, _fns in (("Softmax", (Softmax_1, Softmax)), ("LogSoftmax", (LogSoftmax_1, LogSoftmax))):
    _fns[0].__name__, _fns[1].__name__ = f"{_name}_1", _name
    converter(_name, since=1)(_fns[0])
    converter(_name, since=13)(_fns[1])


def _pool_args(ctx: Ctx, x, kernel_shape, strides, pads, auto_pad, dilations=None):
    n = len(kernel_shape)
    strides, dilations = strides or [1] * n, dilations or [1] * n
    return strides, dilations, _spatial_pads(ctx, x, kernel_shape, strides, dilations, pads, auto_pad)


@converter("MaxPool", since=8)
def MaxPool(ctx: Ctx, x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None,
            storage_order=0, strides=None):
    n = len(kernel_shape)
    if ctx.n_outputs > 1 or n > 3 or ctx.dtype(x) not in ("float32", "float64", "float16"):
        raise UnsupportedNode("MaxPool with indices, more than 3 spatial axes, or an integer input")
    strides, dilations, pads = _pool_args(ctx, x, kernel_shape, strides, pads, auto_pad, dilations)
    x, padding = _symmetric(ctx, x, pads, float("-inf"))
    if any(2 * p > k for p, k in zip(padding, kernel_shape)):  # more than ATen pads: pad explicitly
        x, padding = _pad_spatial(ctx, x, pads, float("-inf")), [0] * n
    return ctx.aten(f"max_pool{n}d", x, list(kernel_shape), strides, padding, dilations, bool(ceil_mode))


@converter("AveragePool", since=7)
def AveragePool(ctx: Ctx, x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, pads=None,
                strides=None, dilations=None):
    n = len(kernel_shape)
    if (dilations and any(d != 1 for d in dilations)) or n > 3:
        raise UnsupportedNode("AveragePool with dilations or more than 3 spatial axes")
    strides, _, pads = _pool_args(ctx, x, kernel_shape, strides, pads, auto_pad)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        count_include_pad = 0  # auto padding is never counted
    pool = f"avg_pool{n}d"
    kernel = list(kernel_shape)
    if pads[:n] == pads[n:] and all(2 * p <= k for p, k in zip(pads[:n], kernel)):
        return ctx.aten(pool, x, kernel, strides, pads[:n], bool(ceil_mode), bool(count_include_pad))
    # asymmetric padding: pad first; without count_include_pad, divide by the pooled count of real elements
    padded = _pad_spatial(ctx, x, pads, 0.0)
    mean = ctx.aten(pool, padded, kernel, strides, [0] * n, bool(ceil_mode), True)
    if count_include_pad:
        return mean
    ones = _pad_spatial(ctx, ctx.aten("ones_like", x), pads, 0.0)
    return ctx.aten("div.Tensor", mean, ctx.aten(pool, ones, kernel, strides, [0] * n, bool(ceil_mode), True))


@converter("GlobalAveragePool")
def GlobalAveragePool(ctx: Ctx, x):
    return ctx.aten("mean.dim", x, list(range(2, ctx.rank(x))), True)


@converter("GlobalMaxPool")
def GlobalMaxPool(ctx: Ctx, x):
    return ctx.aten("amax", x, list(range(2, ctx.rank(x))), True)


@converter("Einsum", since=12)
def Einsum(ctx: Ctx, *xs, equation):
    return ctx.aten("einsum", equation.replace(" ", ""), list(xs))


_REDUCTION = {"none": 0, "mean": 1, "sum": 2}  # ATen's reduction enum


@converter("NegativeLogLikelihoodLoss", since=12)
def NegativeLogLikelihoodLoss(ctx: Ctx, x, target, weight=None, *, ignore_index=None, reduction="mean"):
    # without ignore_index nothing is ignored; -100 (ATen's default) is never a valid class index
    index = -100 if ignore_index is None else ignore_index
    return ctx.aten("nll_loss_nd", x, ctx.cast(target, "int64"), weight, _REDUCTION[reduction], index)


@converter("SoftmaxCrossEntropyLoss", since=12)
def SoftmaxCrossEntropyLoss(ctx: Ctx, scores, labels, weights=None, *, ignore_index=None, reduction="mean"):
    log_prob = ctx.aten("log_softmax.int", scores, 1)
    loss = NegativeLogLikelihoodLoss(ctx, log_prob, labels, weights, ignore_index=ignore_index, reduction=reduction)
    return loss, log_prob


_GRID_MODES = {"bilinear": 0, "linear": 0, "nearest": 1, "bicubic": 2, "cubic": 2}
_GRID_PADDING = {"zeros": 0, "border": 1, "reflection": 2}


@converter("GridSample", since=16)
def GridSample(ctx: Ctx, x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    if ctx.rank(x) not in (4, 5) or (mode in ("bicubic", "cubic") and ctx.rank(x) != 4):
        raise UnsupportedNode(f"GridSample {mode} of rank {ctx.rank(x)}")
    return ctx.aten("grid_sampler", x, grid, _GRID_MODES[mode], _GRID_PADDING[padding_mode], bool(align_corners))


@converter("LpNormalization")
def LpNormalization(ctx: Ctx, x, *, axis=-1, p=2):
    norm = ctx.aten("linalg_vector_norm", x, float(p), [axis], True)
    # a zero vector stays zero (ONNX divides by 1 there, not by 0)
    norm = ctx.aten("where.self", ctx.aten("eq.Scalar", norm, 0), ctx.aten("ones_like", norm), norm)
    return ctx.aten("div.Tensor", x, norm)


@converter("Hardmax", since=13)
def Hardmax(ctx: Ctx, x, *, axis=-1):
    # one-hot of the first maximum along axis: compare each position with argmax
    rank = ctx.rank(x)
    axis = axis + rank if axis < 0 else axis
    size = ctx.shape(x)[axis]
    idx = ctx.aten("argmax", x, axis, True)
    positions = [1] * rank
    positions[axis] = size
    arange = ctx.arange(size, positions)
    return ctx.cast(ctx.aten("eq.Tensor", idx, arange), ctx.dtype(x))


@converter("LRN")
def LRN(ctx: Ctx, x, *, size, alpha=0.0001, beta=0.75, bias=1.0):
    # the mean of squares over a window of `size` channels: pad the channel axis, average-pool it
    sq = ctx.aten("unsqueeze", ctx.aten("mul.Tensor", x, x), 1)  # (N, 1, C, H, W)
    rank = ctx.rank(x)
    front, back = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = ctx.aten("constant_pad_nd", sq, [0, 0] * (rank - 2) + [front, back], 0.0)
    window = [size] + [1] * (rank - 2)
    if rank != 4:
        raise UnsupportedNode("LRN of rank other than 4")
    mean = ctx.aten("squeeze.dim", ctx.aten("avg_pool3d", sq, window, [1, 1, 1]), 1)
    scale = ctx.aten("pow.Tensor_Scalar", ctx.aten("add.Scalar", ctx.aten("mul.Scalar", mean, alpha), bias), beta)
    return ctx.aten("div.Tensor", x, scale)


@converter("MeanVarianceNormalization", since=13)
def MeanVarianceNormalization(ctx: Ctx, x, *, axes=(0, 2, 3)):
    mean = ctx.aten("mean.dim", x, list(axes), True)
    centered = ctx.aten("sub.Tensor", x, mean)
    var = ctx.aten("mean.dim", ctx.aten("mul.Tensor", centered, centered), list(axes), True)
    return ctx.aten("div.Tensor", centered, ctx.aten("sqrt", ctx.aten("add.Scalar", var, 1e-9)))


@converter("Det", since=11)
def Det(ctx: Ctx, x):
    return ctx.aten("linalg_det", x)
