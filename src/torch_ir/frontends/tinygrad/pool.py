"""Pooling rules: a reduce over a window view of x -> ``aten.max_pool2d`` / ``aten.avg_pool2d``.

tinygrad pools with the same window view as its convolution, then REDUCE(MAX), or REDUCE(ADD)
times 1/window (a mean over the window, once the ``mean`` idiom has read it). As for ``conv2d``
(``conv.py``), the view chain is traced on indices and accepted only when every window reads
exactly what ``unfold`` with some kernel, stride and dilation reads.
Unpadded pools only: tinygrad pads a max pool with -inf through a mask the trace cannot see.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from torch_ir.rewrite import Match, Op, Rule, Var

from ...ir import OpNode, TensorMeta
from .conv import _TRACE_LIMIT, _source, _trace


def _window(m: Match) -> dict[str, Any] | None:
    """Kernel, stride and dilation of the window the reduce ``m.node("red")`` takes over a view of x.

    Traced once per rewrite call and reduce (kept in ``m.ctx``'s cache, as ``conv.py`` does)."""
    red = m.node("red")
    return m.ctx.cached(("pool_window", red.outputs[0].name), lambda: _trace_window(m, red))


def _trace_window(m: Match, red: OpNode) -> dict[str, Any] | None:
    view = red.inputs[0]
    x, chain = _source(m, view)
    if len(x.shape) != 4 or not chain or math.prod(view.shape) > _TRACE_LIMIT or red.attrs.get("keepdim"):
        return None
    dims = red.attrs["dim"]
    kept = [d for d in range(len(view.shape)) if d not in dims]
    idx = _trace(x, chain).permute(dims + kept).reshape(-1, math.prod(red.outputs[0].shape))
    if not bool((idx > 0).all()):
        return None  # padding: not a plain window
    idx = idx.sort(dim=0).values  # max and sum do not care about the order inside a window
    n, c, h, w = x.shape
    r, out = idx.shape[0], red.outputs[0].shape
    if len(out) < 2 or math.prod(out) != n * c * out[-2] * out[-1]:
        return None
    oh, ow = out[-2:]
    x_idx = torch.arange(1, n * c * h * w + 1, dtype=torch.float64).reshape(x.shape)
    for kh in (k for k in range(1, r + 1) if r % k == 0):
        kw = r // kh
        for (sh, dh), (sw, dw) in itertools.product(_axis(h, kh, oh), _axis(w, kw, ow)):
            cols = torch.nn.functional.unfold(x_idx, (kh, kw), dilation=(dh, dw), stride=(sh, sw))
            expected = cols.reshape(n, c, r, oh * ow).permute(2, 0, 1, 3).reshape(r, -1).sort(dim=0).values
            if torch.equal(idx, expected):
                return {"kernel_size": [kh, kw], "stride": [sh, sw], "dilation": [dh, dw], "x": x}
    return None


def _axis(size: int, k: int, out: int) -> list[tuple[int, int]]:
    """(stride, dilation) of one axis that give ``out`` windows; stride = kernel (the default) first."""
    found = [(s, d) for s, d in itertools.product(range(1, 9), range(1, 5))
             if size >= d * (k - 1) + 1 and (size - d * (k - 1) - 1) // s + 1 == out]
    return sorted(found, key=lambda sd: (sd[0] != k, sd))


def _pool_node(m: Match, op_type: str, window: dict[str, Any], attrs: dict[str, Any]) -> list[OpNode]:
    root, x = m.node(), window["x"]
    shape = [*x.shape[:2], *root.outputs[0].shape[-2:]]
    if shape == list(root.outputs[0].shape):
        return [OpNode(root.name, op_type, [x], list(root.outputs), attrs)]
    name = root.name + "_pool"
    pool = OpNode(name, op_type, [x], [TensorMeta(name, shape, x.dtype, role="activation")], attrs)
    return [pool, OpNode(root.name, "aten.reshape.default", pool.outputs, list(root.outputs),
                         {"shape": list(root.outputs[0].shape)})]


def _max_pool(m: Match) -> list[OpNode] | None:
    w = _window(m)
    if w is None:
        return None
    attrs = {"kernel_size": w["kernel_size"], "stride": w["stride"]}
    if w["dilation"] != [1, 1]:
        attrs["dilation"] = w["dilation"]
    return _pool_node(m, "aten.max_pool2d.default", w, attrs)


def _avg_pool(m: Match) -> list[OpNode] | None:
    w = _window(m)
    count = m.constant(m["c"])  # the divisor's value, as the rewrite knows it (the IR's constants)
    if w is None or w["dilation"] != [1, 1] or m["c"].shape != [] or count != math.prod(w["kernel_size"]):
        return None
    return _pool_node(m, "aten.avg_pool2d.default", w, {"kernel_size": w["kernel_size"], "stride": w["stride"]})


def _avg_pool_mean(m: Match) -> list[OpNode] | None:
    w = _window(m)  # a mean divides by the elements it reduces: the window, since the pool is unpadded
    if w is None or w["dilation"] != [1, 1]:
        return None
    return _pool_node(m, "aten.avg_pool2d.default", w, {"kernel_size": w["kernel_size"], "stride": w["stride"]})


def pool_rules() -> list[Rule]:
    return [
        Rule("max_pool2d", "pool", Op("aten.amax.default", Var("v"), name="red"), _max_pool,
             doc="amax over a window view of x -> max_pool2d(x), by index tracing"),
        Rule("avg_pool2d", "pool", Op("aten.div.Tensor", Op("aten.sum.dim_IntList", Var("v"), name="red"), Var("c")),
             _avg_pool, doc="sum over a window view of x / window size -> avg_pool2d(x), by index tracing"),
        Rule("avg_pool2d_mean", "pool", Op("aten.mean.dim", Var("v"), name="red"), _avg_pool_mean,
             doc="mean over a window view of x -> avg_pool2d(x), by index tracing"),
    ]
