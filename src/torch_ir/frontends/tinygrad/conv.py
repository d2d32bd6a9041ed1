"""The conv rule: tinygrad's convolution (pad, strided window views, multiply, reduce) -> ``aten.conv2d``.

tinygrad lowers ``conv2d`` to movement ops that build a window view of the padded input, a MUL with
the reshaped weight and a REDUCE(ADD) over (cin, kh, kw). Rather than match that chain op by op
(it changes between tinygrad versions), the rule *traces indices*: it runs the view chains of
both operands on ``arange`` tensors (through the op registry, as the executor would) and accepts
the match only when the element each product reads is exactly the one ``conv2d`` with some
stride, padding, dilation and groups reads. Anything else is left to the plain contraction rule.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from torch_ir.rewrite import Match, Op, Rule, Var

from ...ir import OpNode, TensorMeta
from ...ops.registry import bind_kernel
from .rules import reduced_first

VIEWS = ("aten.reshape.default", "aten.permute.default", "aten.expand.default", "aten.constant_pad_nd.default",
         "aten.slice.Tensor", "aten.flip.default")
CONV, SUM = "aten.conv2d.default", "aten.sum.dim_IntList"
_DEFAULTS = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}
_TRACE_LIMIT = 1 << 24  # elements of the product; larger convolutions stay matmuls over a window view


def _source(m: Match, t: TensorMeta) -> tuple[TensorMeta, list[OpNode]]:
    """Follow view ops up from ``t``: the tensor they view and the chain, source first."""
    chain = []
    node = m.producer(t)
    while node is not None and node.op_type in VIEWS and len(node.inputs) == 1:
        chain.append(node)
        t = node.inputs[0]
        node = m.producer(t)
    return t, chain[::-1]


def _trace(src: TensorMeta, chain: list[OpNode]) -> torch.Tensor:
    """Which element of ``src`` (1-based; 0 = padding) each element of the chain's result reads."""
    x = torch.arange(1, math.prod(src.shape) + 1, dtype=torch.float64).reshape(src.shape)
    for node in chain:
        (x,) = bind_kernel(node, torch.device("cpu"))([x], {})
    return x


def _conv_params(m: Match) -> dict[str, Any] | None:
    """The conv parameters of the match, or None. The engine retries a rejected match on every sweep;
    tracing is the costly part, so the answer is kept in the rewrite call's cache (``m.ctx``), keyed by
    the (sum, a, b) tensor names, which keep their meaning for the whole call."""
    key = ("conv2d", m.node().outputs[0].name, m["a"].name, m["b"].name)
    return m.ctx.cached(key, lambda: _trace_conv(m))


def _trace_conv(m: Match) -> dict[str, Any] | None:
    root, mul = m.node(), m.node("mul")
    full = mul.outputs[0].shape
    if math.prod(full) > _TRACE_LIMIT:
        return None
    x, xchain = _source(m, m["a"])
    w, wchain = _source(m, m["b"])
    if len(x.shape) != 4 or len(w.shape) != 4 or not xchain or x.dtype != w.dtype:
        return None
    order = reduced_first(m)
    # both index maps over the product, reduced axes first and flattened: (R, kept...)
    ia, ib = (_trace(s, c).expand(full).permute(order).reshape(-1, *root.outputs[0].shape)
              for s, c in ((x, xchain), (w, wchain)))
    order = torch.argsort(ib, dim=0)  # the sum does not care in which order (ci, ky, kx) come
    ia, ib = torch.gather(ia, 0, order), torch.gather(ib, 0, order)
    return _match_conv(x.shape, w.shape, ia, ib, root.outputs[0].shape)


def _match_conv(xs: list[int], ws: list[int], ia: torch.Tensor, ib: torch.Tensor, out_shape: list[int]):
    n, cin, h, wd = xs
    cout, cin_g, kh, kw = ws
    if cin % cin_g or cout % (cin // cin_g) or len(out_shape) < 2:
        return None
    groups = cin // cin_g
    oh, ow = out_shape[-2:]
    if math.prod(out_shape) != n * cout * oh * ow or ia.shape[0] != cin_g * kh * kw:
        return None
    r = cin_g * kh * kw
    ia, ib = ia.reshape(r, n, cout, oh * ow), ib.reshape(r, n, cout, oh * ow)
    expected_b = (torch.arange(cout, dtype=torch.float64)[:, None] * r + torch.arange(r)[None, :] + 1)
    if not torch.equal(ib, expected_b.T[:, None, :, None].expand_as(ib)):
        return None
    x_idx = torch.arange(1, n * cin * h * wd + 1, dtype=torch.float64).reshape(xs)
    for ph, pw in itertools.product(_axis(h, kh, oh), _axis(wd, kw, ow)):
        (sh, dh, padh), (sw, dw, padw) = ph, pw
        cols = torch.nn.functional.unfold(x_idx, (kh, kw), dilation=(dh, dw), padding=(padh, padw), stride=(sh, sw))
        # cols: (n, cin*kh*kw, L); output channel co reads the channels of its group
        cols = cols.reshape(n, groups, r, oh * ow)
        expected_a = cols[:, torch.arange(cout) // (cout // groups)].permute(2, 0, 1, 3)
        if torch.equal(ia, expected_a):
            return {"stride": [sh, sw], "padding": [padh, padw], "dilation": [dh, dw], "groups": groups}
    return None


def _axis(size: int, k: int, out: int) -> list[tuple[int, int, int]]:
    """(stride, dilation, padding) of one spatial axis that give ``out`` positions."""
    found = []
    for s, d in itertools.product(range(1, 9), range(1, 5)):
        for p in range(0, d * (k - 1) + 1):
            if (size + 2 * p - d * (k - 1) - 1) // s + 1 == out and size + 2 * p >= d * (k - 1) + 1:
                found.append((s, d, p))
    return found[:16]


def _conv(m: Match) -> list[OpNode] | None:
    params = _conv_params(m)
    if params is None:
        return None
    root = m.node()
    x, _ = _source(m, m["a"])
    w, _ = _source(m, m["b"])
    out = [x.shape[0], w.shape[0], *root.outputs[0].shape[-2:]]
    attrs = {"bias": None, **{k: v for k, v in params.items() if v != _DEFAULTS[k]}}  # schema defaults omitted
    if out == list(root.outputs[0].shape):
        return [OpNode(root.name, CONV, [x, w], list(root.outputs), attrs)]
    name = root.name + "_conv"
    conv = OpNode(name, CONV, [x, w], [TensorMeta(name, out, x.dtype, role="activation")], attrs)
    return [conv, OpNode(root.name, "aten.reshape.default", conv.outputs, list(root.outputs),
                         {"shape": list(root.outputs[0].shape)})]


def _conv_bias(m: Match) -> list[OpNode] | None:
    conv, b, root = m.node("conv"), m["b"], m.node()
    cout = conv.outputs[0].shape[1]
    if conv.attrs.get("bias", 0) is not None or list(b.shape) != [cout]:
        return None
    if root.outputs[0].shape != conv.outputs[0].shape:  # the bias would broadcast the result: not a bias
        return None
    return [OpNode(root.name, CONV, [*conv.inputs, b], list(root.outputs),
                   {k: v for k, v in conv.attrs.items() if k != "bias"})]


def conv_rules() -> list[Rule]:
    float_sum = lambda attrs: "dtype" not in attrs  # noqa: E731 - an integer sum is no convolution
    mul = Op("aten.mul.Tensor", Var("a"), Var("b"), name="mul")
    bias = Op("aten.reshape.default", Var("b"), attrs=lambda a: len(a["shape"]) == 4)
    return [
        Rule("conv2d", "contraction", Op(SUM, Op("aten.permute.default", mul, name="perm"), attrs=float_sum),
             _conv, doc="sum(permute(mul(window view of x, view of w))) -> conv2d(x, w), by index tracing"),
        Rule("conv2d_unpermuted", "contraction", Op(SUM, mul, attrs=float_sum), _conv,
             doc="sum(mul(window view of x, view of w)) -> conv2d(x, w), by index tracing"),
        Rule("conv2d_bias", "contraction", Op("aten.add.Tensor", Op(CONV, Var("x"), Var("w"), name="conv"), bias),
             _conv_bias, doc="conv2d(x, w) + b.reshape(1, C, 1, 1) -> conv2d(x, w, b)"),
    ]
