"""WGSL generators of the normalizations and softmax: LAYER_NORM, group norm, RMS_NORM, BATCH_NORM, LRN, SOFTMAX.

The row-wise ones (LAYER_NORM, group norm, RMS_NORM, SOFTMAX) run one workgroup per row and reduce in
workgroup memory with a tree; BATCH_NORM and LRN run one invocation per output element in storage order.
"""

from __future__ import annotations

import math

from ..wgsl import Call, Shader, UnsupportedCall, literal, numel, offset, per_element, per_group, shape_of, unravel
from .rows import (
    NAN,
    checked_dim,
    optional_inputs,
    reductions,
    require_floats,
    round_to,
    row_fn,
    storage_order,
    workgroup_size,
)


def _mean_var_norm(call: Call, rows: int, length: int, fns: str, eps: float, affine: dict[str, int]) -> Shader:
    """y = (x - mean) / sqrt(var + eps) (· weight + bias) over rows of ``length`` elements; ``fns`` defines
    ``xo``, ``yo`` (offsets of element j of row r) and ``ao`` (the affine parameters' offset of it). Two passes
    over the row (mean, then the squared deviations) for the accuracy of a long row with a large mean."""
    wg = workgroup_size(length)
    y = "(ld_in0(xo(g, j)) - mean) * rstd"
    if "weight" in affine:
        y = f"{y} * ld_in{affine['weight']}(ao(g, j))"
    if "bias" in affine:
        y = f"{y} + ld_in{affine['bias']}(ao(g, j))"
    body = f"""var acc = 0.0;
  for (var j = lid; j < {length}u; j += WG) {{ acc += ld_in0(xo(g, j)); }}
  let mean = wg_sum(acc, lid) / {float(length)!r};
  var dev = 0.0;
  for (var j = lid; j < {length}u; j += WG) {{ let d = ld_in0(xo(g, j)) - mean; dev += d * d; }}
  let rstd = 1.0 / sqrt(wg_sum(dev, lid) / {float(length)!r} + {literal(eps)});
  for (var j = lid; j < {length}u; j += WG) {{ st_out0(yo(g, j), {y}); }}"""
    return per_group(call, rows, wg, body, shared=f"{reductions(wg)}\n{fns}")


def layer_norm(call: Call) -> Shader:
    """LAYER_NORM: over the trailing ``normalized_shape`` dims, with optional weight and bias (inputs 1, 2)."""
    x, out = call.ins[0], call.outs[0]
    require_floats(call, x, out, *call.ins[1:])
    shape = shape_of(x)
    norm = call.param("normalized_shape")
    if not isinstance(norm, list) or not 0 < len(norm) <= len(shape) or [int(d) for d in norm] != \
            shape[len(shape) - len(norm):]:
        raise UnsupportedCall(f"normalized_shape {norm!r} is not the trailing dims of {shape}")
    a = len(shape) - len(norm)
    affine = optional_inputs(call, ("weight", "bias"), 1)
    fns = [row_fn("xo", x, shape, a, len(shape)), row_fn("yo", out, shape, a, len(shape))]
    if affine:
        fns.append(row_fn("ao_", call.ins[min(affine.values())], shape[a:], 0, len(norm)))
        fns.append("fn ao(r: u32, j: u32) -> u32 { return ao_(0u, j); }")
    rows, length = math.prod(shape[:a]), math.prod(shape[a:])
    return _mean_var_norm(call, rows, length, "\n".join(fns), float(call.param("eps", 1e-5)), affine)


def group_norm(call: Call) -> Shader:
    """aten.group_norm: x [N, C, *] normalized over each of ``num_groups`` channel groups, then per channel
    weight and bias (each optional)."""
    x, out = call.ins[0], call.outs[0]
    require_floats(call, x, out, *call.ins[1:])
    shape = shape_of(x)
    groups_ = call.param("num_groups")
    if len(shape) < 2 or not isinstance(groups_, int) or groups_ <= 0 or shape[1] % groups_:
        raise UnsupportedCall(f"num_groups {groups_!r} does not divide the channels of {shape}")
    n, spatial = shape[0], shape[2:]
    hw, cg = math.prod(spatial), shape[1] // groups_
    affine = optional_inputs(call, ("weight", "bias"), 1)
    fns = [f"fn ch(r: u32, j: u32) -> u32 {{ return (r % {groups_}u) * {cg}u + j / {hw}u; }}"]
    for name, spec in (("xo", x), ("yo", out)):
        sp = [f"s{k}" for k in range(len(spatial))]
        split = unravel(f"j % {hw}u", spatial, "s")
        fns.append(f"fn {name}(r: u32, j: u32) -> u32 {{\n  {split}\n  "
                   f"return {offset(spec, [f'(r / {groups_}u)', 'ch(r, j)', *sp])};\n}}")
    if affine:
        w = call.ins[min(affine.values())]
        fns.append(f"fn ao(r: u32, j: u32) -> u32 {{ return {offset(w, ['ch(r, j)'])}; }}")
    return _mean_var_norm(call, n * groups_, cg * hw, "\n".join(fns), float(call.param("eps", 1e-5)), affine)


def rms_norm(call: Call) -> Shader:
    """RMS_NORM: y = round(x · rsqrt(mean(x², last dim) + eps)) (· weight), in float32 and rounded to x's
    dtype before the weight, as the reference (and Llama/Qwen) do."""
    x, out = call.ins[0], call.outs[0]
    require_floats(call, x, out, *call.ins[1:])
    shape = shape_of(x)
    if not shape:
        raise UnsupportedCall("RMS_NORM of a 0-d tensor")
    length, rank = shape[-1], len(shape)
    wg = workgroup_size(length)
    fns = [row_fn("xo", x, shape, rank - 1, rank), row_fn("yo", out, shape, rank - 1, rank)]
    y = round_to(x.dtype, "ld_in0(xo(g, j)) * scale")
    if len(call.ins) > 1:
        fns.append(row_fn("wo", call.ins[1], [length], 0, 1))
        y = f"ld_in1(wo(0u, j)) * {y}"
    body = f"""var acc = 0.0;
  for (var j = lid; j < {length}u; j += WG) {{ let v = ld_in0(xo(g, j)); acc += v * v; }}
  let scale = 1.0 / sqrt(wg_sum(acc, lid) / {float(length)!r} + {literal(float(call.param("eps", 1e-6)))});
  for (var j = lid; j < {length}u; j += WG) {{ st_out0(yo(g, j), {y}); }}"""
    return per_group(call, math.prod(shape[:-1]), wg, body, shared=f"{reductions(wg)}\n" + "\n".join(fns))


def batch_norm(call: Call) -> Shader:
    """BATCH_NORM (inference): per channel (dim 1), y = (x - mean) / sqrt(var + eps) · weight + bias."""
    x, out = call.ins[0], call.outs[0]
    if len(call.ins) != 5:
        raise UnsupportedCall("BATCH_NORM needs weight, bias, mean and var inputs")
    require_floats(call, *call.ins, out)
    if len(shape_of(x)) < 2:
        raise UnsupportedCall("BATCH_NORM needs a channel dim")
    split, idx = storage_order(out)
    w, b, mean, var = (f"ld_in{k}({offset(call.ins[k], [idx[1]])})" for k in range(1, 5))
    eps = literal(float(call.param("eps", 1e-5)))
    body = (f"{split}\n  let x = ld_in0({offset(x, idx)});\n"
            f"  st_out0(i, (x - {mean}) / sqrt({var} + {eps}) * {w} + {b});")
    return per_element(call, numel(out), body)


def lrn(call: Call) -> Shader:
    """LRN: y = x / (k + alpha · (sum of x² over ``size`` neighbouring channels) / size)^beta, the window
    clipped at the edges but always divided by ``size`` (torch's local_response_norm pads with zeros)."""
    x, out = call.ins[0], call.outs[0]
    require_floats(call, x, out)
    shape = shape_of(x)
    size = call.param("size")
    if len(shape) < 3 or not isinstance(size, int) or size < 1:
        raise UnsupportedCall(f"LRN needs a 3-d or wider input and a window size >= 1 (got {shape}, {size!r})")
    split, idx = storage_order(out)
    at = offset(x, [idx[0], "u32(cc)", *idx[2:]])
    alpha, beta, k = (literal(float(call.param(n, d))) for n, d in (("alpha", 1e-4), ("beta", 0.75), ("k", 1.0)))
    body = f"""{split}
  let lo = max(i32({idx[1]}) - {size // 2}, 0);
  let hi = min(i32({idx[1]}) + {(size - 1) // 2}, {shape[1] - 1});
  var sq = 0.0;
  for (var cc = lo; cc <= hi; cc++) {{ let v = ld_in0({at}); sq += v * v; }}
  st_out0(i, ld_in0({offset(x, idx)}) / pow_({k} + {alpha} * sq / {float(size)!r}, {beta}));"""
    return per_element(call, numel(out), body)


def softmax(call: Call) -> Shader:
    """SOFTMAX: softmax(x · scale + mask) along ``dim`` (any axis); a bool mask keeps its True positions, a float
    one is added. A row with nothing left is NaN, as torch's softmax gives. One pass keeps a running maximum and
    sum per invocation, merged across the workgroup, then one pass writes."""
    x, out = call.ins[0], call.outs[0]
    require_floats(call, x, out)
    shape = shape_of(x)
    rank = len(shape)
    dim = checked_dim(call.param("dim", -1), rank, "dim")
    scale = float(call.param("scale", 1.0))
    if not shape:
        shape = [1]  # a 0-d softmax is one row of one element
    length, rows = shape[dim], math.prod(shape) // max(shape[dim], 1)
    wg = workgroup_size(length)
    fns = [row_fn("xo", x, shape, dim, dim + 1), row_fn("yo", out, shape, dim, dim + 1)]
    value = "ld_in0(xo(g, j))" if scale == 1.0 else f"ld_in0(xo(g, j)) * {literal(scale)}"
    if len(call.ins) > 1:
        mask = call.ins[1]
        if len(shape_of(mask)) > len(shape):
            raise UnsupportedCall("the mask has more dims than x")
        fns.append(row_fn("mo", mask, shape, dim, dim + 1))
        value = f"select(MASKED, {value}, ld_in1(mo(g, j)) != 0)" if mask.dtype == "bool" else \
            f"{value} + f32(ld_in1(mo(g, j)))"
    body = f"""var m = MASKED;
  var s = 0.0;
  for (var j = lid; j < {length}u; j += WG) {{
    let v = {value};
    if (v > m) {{ s = select(s * exp(m - v), 0.0, m <= MASKED) + 1.0; m = v; }}
    else if (v > MASKED) {{ s += exp(v - m); }}
  }}
  let mx = wg_max(m, lid);
  let total = wg_sum(select(s * exp(m - mx), 0.0, m <= MASKED), lid);
  for (var j = lid; j < {length}u; j += WG) {{
    let v = {value};
    st_out0(yo(g, j), select(select(exp(v - mx) / total, 0.0, v <= MASKED), {NAN}, mx <= MASKED));
  }}"""
    return per_group(call, rows, wg, body, shared=f"{reductions(wg)}\n" + "\n".join(fns))
