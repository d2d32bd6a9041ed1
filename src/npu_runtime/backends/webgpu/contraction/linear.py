"""The generators of the NPU's linear layers: GEMM, GATE_UP and QKV_PROJ."""

from __future__ import annotations

import math

from ..wgsl import Call, Shader, UnsupportedCall, shape_of
from .kernel import run
from .operands import (
    Contraction,
    _act,
    _compute_type,
    _flag,
    _number,
    _offset,
    _rows_load,
    _select_load,
    _tensor_load,
    _weight_load,
)


def gemm(call: Call) -> Shader:
    """GEMM: y = act(x · w(ᵀ) + bias [+ residual]), x batched over its leading dims, w 2-D."""
    t = _compute_type(call)
    trans_a, trans_b = _flag(call, "trans_a", False), _flag(call, "trans_b", True)
    has_residual = _flag(call, "has_residual", False)
    has_bias = call.params.get("has_bias")
    has_bias = bool(has_bias) if has_bias is not None else len(call.ins) == 3 + has_residual
    if len(call.ins) != 2 + has_bias + has_residual:
        raise UnsupportedCall(f"{len(call.ins)} inputs for has_bias={has_bias}, has_residual={has_residual}")
    x, out = shape_of(call.ins[0]), shape_of(call.outs[0])
    w = shape_of(call.ins[1])
    n = w[0] if trans_b else w[-1]
    if trans_a:
        if len(x) < 2:
            raise UnsupportedCall("trans_a needs x of at least 2 dims")
        batch, (k, m) = x[:-2], x[-2:]
        a = _tensor_load(call, 0, t, [("b", batch), ("k", [k]), ("r", [m])], len(x) - 2, k)
        out_parts = [("b", batch), ("m", [m]), ("n", [n])]
    else:
        batch, k, m = [], x[-1], math.prod(x[:-1])
        a = _rows_load(call, t, x[:-1], k)
        out_parts = [("m", out[:-1]), ("n", [n])]
    b = _weight_load(call, 1, t, trans_b, n, k)
    lines = ["var v = v0;"]
    if has_bias:
        lines.append(f"v += {t}(ld_in2({_offset(call.ins[2], out_parts)}));")
    if has_residual:
        r = len(call.ins) - 1
        lines.append(f"v += {t}(ld_in{r}({_offset(call.ins[r], out_parts)}));")
    lines.append(f"st_out0({_offset(call.outs[0], out_parts)}, {_act(call, t, 'v')});")
    return run(call, Contraction(t, math.prod(batch), m, n, k, a, [b], "\n  ".join(lines)))


def gate_up(call: Call) -> Shader:
    """GATE_UP: silu(x · w_gateᵀ + b_gate) · (x · w_upᵀ + b_up), both products in one pass over x."""
    t = _compute_type(call)
    if t != "f32":
        raise UnsupportedCall("GATE_UP of integer tensors")
    trans_b, has_bias = _flag(call, "trans_b", True), _flag(call, "has_bias", False)
    if len(call.ins) != 3 + 2 * has_bias:
        raise UnsupportedCall(f"{len(call.ins)} inputs for has_bias={has_bias}")
    x = shape_of(call.ins[0])
    k, n = x[-1], shape_of(call.outs[0])[-1]
    a = _rows_load(call, t, x[:-1], k)
    bs = [_weight_load(call, i, t, trans_b, n, k) for i in (1, 2)]
    parts = [("m", x[:-1]), ("n", [n])]
    gate, up = "v0", "v1"
    if has_bias:
        gate, up = f"v0 + ld_in3({_offset(call.ins[3], parts)})", f"v1 + ld_in4({_offset(call.ins[4], parts)})"
    epilogue = f"st_out0({_offset(call.outs[0], parts)}, silu_({gate}) * ({up}));"
    return run(call, Contraction(t, 1, math.prod(x[:-1]), n, k, a, bs, epilogue))


def qkv_proj(call: Call) -> Shader:
    """QKV_PROJ: q, k, v = x · w_qᵀ, x · w_kᵀ, x · w_vᵀ (+ biases) as one contraction over the weights stacked
    along n (one packed weight, or three), each output [..., width] or head-major [B, heads, T, head_dim]."""
    t = _compute_type(call)
    splits = call.param("splits", [])
    splits = [int(_number(s, "splits", True)) for s in splits] if isinstance(splits, list) else []
    packed, trans_b = _flag(call, "packed", False), _flag(call, "trans_b", True)
    heads_first = _flag(call, "heads_first", False)
    n_w = 1 if packed else 3
    flags = call.param("has_bias", False)
    flags = [bool(f) for f in flags] if isinstance(flags, list) else [bool(flags)] * n_w
    if len(splits) != 3 or len(flags) != n_w or len(call.ins) != 1 + n_w + sum(flags) or len(call.outs) != 3:
        raise UnsupportedCall(f"QKV_PROJ with splits {splits}, packed={packed}, has_bias={flags} "
                              f"and {len(call.ins)} inputs")
    x = shape_of(call.ins[0])
    lead, k, n = x[:-1], x[-1], sum(splits)
    a = _rows_load(call, t, lead, k)
    if packed:
        b = _weight_load(call, 1, t, trans_b, n, k)
    else:
        b = _select_load([_weight_load(call, 1 + j, t, trans_b, splits[j], k) for j in range(3)], splits, t, "lw")
    bias_of, given = {}, iter(range(1 + n_w, len(call.ins)))
    for j, flag in enumerate(flags):
        if flag:
            bias_of[j] = next(given)
    lines, start = [], 0
    for j, width in enumerate(splits):
        local = f"(n - {start}u)"
        v = "v0"
        if packed and 0 in bias_of:
            v += f" + {t}(ld_in{bias_of[0]}(n))"
        elif not packed and j in bias_of:
            v += f" + {t}(ld_in{bias_of[j]}({local}))"
        if heads_first:
            d = int(_number(call.param("head_dim", 0), "head_dim", True))
            if d <= 0 or width % d or not lead:
                raise UnsupportedCall(f"heads_first needs a head_dim dividing {width} and x of 2 or more dims")
            seq = lead[-1]
            parts = [(f"m / {seq}u", lead[:-1]), (f"{local} / {d}u", [width // d]), (f"m % {seq}u", [seq]),
                     (f"{local} % {d}u", [d])]
        else:
            parts = [("m", lead), (local, [width])]
        test = f"if (n < {start + width}u) " if j < 2 else ""
        lines.append(f"{test}{{ st_out{j}({_offset(call.outs[j], parts)}, {v}); return; }}")
        start += width
    return run(call, Contraction(t, 1, math.prod(lead), n, k, a, [b], "\n  ".join(lines)))
