"""Resize (and the older Upsample): ATen's upsample ops where they compute the same thing.

Nearest-neighbour resizing of a static shape is exact in any ONNX mode: the source index of every
output position is computed here, with ONNX's formulas, and becomes either ``upsample_nearest``
(when it picks the same pixels) or an ``index_select`` per axis. Linear and cubic modes map to
``upsample_{linear1d,bilinear2d,trilinear3d,bicubic2d}`` for the coordinate modes ATen shares.
"""

# ruff: noqa: N802 - converters are named after the ONNX op they translate

from __future__ import annotations

import math

import numpy as np

from ..context import Ctx, UnsupportedNode
from . import converter

_LINEAR = {1: "upsample_linear1d", 2: "upsample_bilinear2d", 3: "upsample_trilinear3d"}
# ONNX coordinate mode -> ATen's align_corners, for the modes whose formulas agree
_ALIGN = {"half_pixel": False, "pytorch_half_pixel": False, "align_corners": True}


def _original(x: np.ndarray, mode: str, scale: float, size_in: int, size_out: int) -> np.ndarray:
    """ONNX's coordinate transformation: output coordinates -> input coordinates."""
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if size_out > 1 else np.zeros_like(x)
    if mode == "align_corners":
        return x * (size_in - 1) / (size_out - 1) if size_out > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adjustment = size_out / (scale * size_in)
        return size_in / 2 * (1 - adjustment) + (x + 0.5) / scale - 0.5
    raise UnsupportedNode(f"Resize with coordinate_transformation_mode {mode!r}")


def _nearest_index(mode: str, nearest: str, scale: float, size_in: int, size_out: int) -> np.ndarray:
    x = _original(np.arange(size_out, dtype=np.float64), mode, scale, size_in, size_out)
    rounded = {"round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
               "floor": np.floor, "ceil": np.ceil}[nearest](x)
    return np.clip(rounded, 0, size_in - 1).astype(np.int64)


def _resize(ctx: Ctx, x, scales, sizes, *, mode, ctm, nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75,
            exclude_outside=0, antialias=0, axes=None, keep_aspect_ratio_policy="stretch"):
    shape = ctx.shape(x)
    rank = len(shape)
    if not all(isinstance(d, int) for d in shape):
        raise UnsupportedNode("Resize of a symbolic shape")
    axes = [a + rank if a < 0 else a for a in axes] if axes is not None else list(range(rank))
    if sizes is not None:
        if keep_aspect_ratio_policy != "stretch":
            raise UnsupportedNode(f"Resize with keep_aspect_ratio_policy {keep_aspect_ratio_policy!r}")
        out = dict(zip(axes, ctx.ints(sizes, "Resize's sizes")))
        factor = {a: out[a] / shape[a] for a in axes}
    else:
        if scales is None or ctx.const(scales) is None:
            raise UnsupportedNode("Resize's scales must be known at import time")
        factor = dict(zip(axes, (float(s) for s in ctx.const(scales).reshape(-1))))
        out = {a: math.floor(shape[a] * factor[a]) for a in axes}
    out_shape = [out.get(a, shape[a]) for a in range(rank)]
    resized = [a for a in range(rank) if out_shape[a] != shape[a] or factor.get(a, 1.0) != 1.0]
    if mode == "nearest":
        return _nearest(ctx, x, shape, out_shape, factor, resized, ctm, nearest_mode)
    if antialias or exclude_outside or ctm not in _ALIGN or any(a < 2 for a in resized) or not 3 <= rank <= 5:
        raise UnsupportedNode(f"Resize {mode} with {ctm} (antialias={antialias}, exclude_outside={exclude_outside}) "
                              "over these axes")
    spatial = list(range(2, rank))
    if ctm in ("pytorch_half_pixel", "align_corners") and any(out_shape[a] == 1 for a in spatial):
        raise UnsupportedNode(f"Resize {ctm} to size 1 (ONNX and ATen place the single sample differently)")
    scale_args = [None if ctm == "align_corners" else factor.get(a, 1.0) for a in spatial]
    sizes_out = [out_shape[a] for a in spatial]
    if mode == "linear":
        return ctx.aten(_LINEAR[rank - 2], x, sizes_out, _ALIGN[ctm], *scale_args)
    if mode == "cubic" and rank == 4 and cubic_coeff_a == -0.75 and ctm != "align_corners":
        return ctx.aten("upsample_bicubic2d", x, sizes_out, _ALIGN[ctm], *scale_args)
    raise UnsupportedNode(f"Resize {mode} with cubic_coeff_a={cubic_coeff_a} on rank {rank}")


def _nearest(ctx: Ctx, x, shape, out_shape, factor, resized, ctm, nearest_mode):
    for a in resized:  # the index arrays are made here, at import time
        if not ctx.fits([out_shape[a]], 24):
            ctx.refuse_fold([out_shape[a]], 24, f"Resize's nearest indices on axis {a}")
    indices = {a: _nearest_index(ctm, nearest_mode, factor.get(a, out_shape[a] / shape[a]), shape[a], out_shape[a])
               for a in resized}
    spatial = list(range(2, len(shape)))
    integer = all(out_shape[a] % shape[a] == 0 for a in resized)
    if resized and set(resized) <= set(spatial) and len(shape) <= 5 and integer and all(
            np.array_equal(indices[a], np.arange(out_shape[a]) // (out_shape[a] // shape[a])) for a in resized):
        # the pixels ATen's upsample_nearest picks for an integer factor (floor(dst / k))
        return ctx.aten(f"upsample_nearest{len(shape) - 2}d", x, [out_shape[a] for a in spatial])
    y = x
    for a in resized:
        y = ctx.aten("index_select", y, a, indices[a])
    return y if resized else ctx.aten("clone", x)


@converter("Resize", since=10)
def Resize_10(ctx: Ctx, x, scales, *, mode="nearest"):
    return _resize(ctx, x, scales, None, mode=mode, ctm="asymmetric", nearest_mode="floor")


@converter("Resize", since=11)
def Resize(ctx: Ctx, x, roi=None, scales=None, sizes=None, *, mode="nearest", coordinate_transformation_mode=None,
           **attrs):
    ctm = coordinate_transformation_mode or "half_pixel"
    if ctm == "tf_crop_and_resize":
        raise UnsupportedNode("Resize with tf_crop_and_resize")
    if scales is not None and ctx.const(scales) is not None and ctx.const(scales).size == 0:
        scales = None  # opset 11-12 models pass an empty scales next to sizes
    return _resize(ctx, x, scales, sizes, mode=mode, ctm=ctm,
                   **{k: v for k, v in attrs.items() if k != "extrapolation_value"})


@converter("Upsample", since=9)
def Upsample(ctx: Ctx, x, scales, *, mode="nearest"):
    return _resize(ctx, x, scales, None, mode=mode, ctm="asymmetric", nearest_mode="floor")
