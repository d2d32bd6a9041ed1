"""RNN, GRU and LSTM as ``aten.rnn_tanh``/``aten.gru``/``aten.lstm`` (one layer, either direction).

ONNX stacks the gates of W, R and B as LSTM ``i, o, f, c`` and GRU ``z, r, h``; ATen wants
``i, f, g, o`` and ``r, z, n``, so the gate blocks are reordered with ``index_select`` (at run time
when the weights are inputs). Custom activations, clipping, peepholes, sequence lengths,
``layout=1`` and GRU's ``linear_before_reset=0`` (ATen always applies the reset after the linear
map) are left to the ONNX op.
"""

# ruff: noqa: N802 - converters are named after the ONNX op they translate

from __future__ import annotations

import numpy as np

from ..context import Ctx, UnsupportedNode
from . import converter

# ONNX gate block -> position in ATen's order, per op
_GATES = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}
_ATEN = {"LSTM": "lstm.input", "GRU": "gru.input", "RNN": "rnn_tanh.input"}
_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def _reorder(ctx: Ctx, w, op: str, hidden: int):
    """Rows of one direction's W/R/bias, gate blocks permuted from ONNX's order to ATen's."""
    if not ctx.fits([len(_GATES[op]) * hidden], 8):
        ctx.refuse_fold([len(_GATES[op]) * hidden], 8, f"{op}'s gate order")
    order = np.concatenate([np.arange(g * hidden, (g + 1) * hidden) for g in _GATES[op]]).astype(np.int64)
    return ctx.aten("index_select", w, 0, order)


def _recurrent(op: str, ctx: Ctx, x, w, r, b, sequence_lens, initial_h, initial_c=None, p=None, *, hidden_size,
               activations=None, clip=None, direction="forward", layout=0, linear_before_reset=0, input_forget=0,
               activation_alpha=None, activation_beta=None):
    if (activations and list(activations) != _DEFAULT_ACTIVATIONS[op] * (2 if direction == "bidirectional" else 1)
            or clip is not None or p is not None or sequence_lens is not None or layout or input_forget
            or (op == "GRU" and not linear_before_reset)):
        raise UnsupportedNode(f"{op} with options ATen's {_ATEN[op]} does not have")
    dirs = 2 if direction == "bidirectional" else 1
    seq, batch, _ = ctx.shape(x)
    hidden, gates = hidden_size, len(_GATES[op])
    if ctx.rank(w) != 3 or ctx.shape(w)[1] != gates * hidden or ctx.shape(w)[0] != dirs:
        raise UnsupportedNode(f"{op}'s W of shape {ctx.shape(w)} does not match hidden_size={hidden} and "
                              f"direction={direction!r}")
    params = []
    for d in range(dirs):
        wd, rd = ctx.aten("select.int", w, 0, d), ctx.aten("select.int", r, 0, d)
        params += [_reorder(ctx, wd, op, hidden), _reorder(ctx, rd, op, hidden)]
        if b is not None:
            bd = ctx.aten("select.int", b, 0, d)
            wb = ctx.aten("slice.Tensor", bd, 0, 0, gates * hidden)
            rb = ctx.aten("slice.Tensor", bd, 0, gates * hidden, 2 * gates * hidden)
            params += [_reorder(ctx, wb, op, hidden), _reorder(ctx, rb, op, hidden)]
    xs = ctx.aten("flip", x, [0]) if direction == "reverse" else x
    zeros = ctx.full([dirs, batch, hidden], np.zeros(1, dtype=ctx.dtype(x)))
    h0 = initial_h if initial_h is not None else zeros
    hx = [h0, initial_c if initial_c is not None else zeros] if op == "LSTM" else h0
    results = ctx.aten(_ATEN[op], xs, hx, params, b is not None, 1, 0.0, False, dirs == 2, False)
    y, states = results[0], results[1:]
    if direction == "reverse":
        y = ctx.aten("flip", y, [0])
    # (seq, batch, dirs*H) -> (seq, dirs, batch, H)
    y = ctx.aten("permute", ctx.aten("reshape", y, [seq, batch, dirs, hidden]), [0, 2, 1, 3])
    return (y, *states)


def _make(op: str):
    def convert(ctx: Ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, *rest, **attrs):
        return _recurrent(op, ctx, x, w, r, b, sequence_lens, initial_h, *rest, **attrs)
    convert.__name__ = convert.__qualname__ = op
    convert.__doc__ = f"{op} -> aten.{_ATEN[op]}"
    return convert


LSTM, GRU, RNN = (converter(op, since=7)(_make(op)) for op in ("LSTM", "GRU", "RNN"))
