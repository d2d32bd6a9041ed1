"""The NPU op set: each op declared once, with its inputs, attributes, reference implementation,
shape rule and documentation.

The normalization passes (``npu_compiler.passes.normalize``) rewrite ATen graphs into these ops; the
compiler's kernel libraries implement them; ``docs/npu_ops.md`` is generated from this table
(``torch-ir ops --npu --markdown``). The reference implementations are registered in the op
registry, so a normalized IR runs in ``IRExecutor`` and is verified like any other.

Optional inputs are trailing and their presence is told by an attribute (``has_bias``, ``bn_eps``)
or by the input count, never by a placeholder tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from ..activations import activations_doc, activations_markdown, apply_activation
from ..ir import TensorMeta
from ..quant.numerics import int8_groups
from .registry import register_op

Shape = list[int | str]
ShapeRule = Callable[[Sequence[TensorMeta], dict[str, Any]], list[Shape]]


@dataclass(frozen=True)
class NpuOp:
    name: str
    inputs: tuple[str, ...]  # names; a trailing "?" marks an optional input
    outputs: tuple[str, ...]
    attrs: dict[str, str]  # attribute -> meaning
    impl: Callable[..., Any]
    shape: ShapeRule
    doc: str
    layouts: dict[str, str] = field(default_factory=dict)  # input/output name -> layout it implies


NPU_OPS: dict[str, NpuOp] = {}


def npu_op(name: str, *, inputs: str, outputs: str, attrs: dict[str, str], shape: ShapeRule,
           layouts: dict[str, str] | None = None) -> Callable:
    """Declare an NPU op: its reference implementation is the decorated function (doc = its docstring)."""
    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        doc = " ".join((fn.__doc__ or "").split())
        NPU_OPS[name] = NpuOp(name, tuple(inputs.split()), tuple(outputs.split()), attrs, fn, shape, doc,
                              layouts or {})
        register_op(name, doc=doc, override=True)(fn)
        return fn

    return decorator


# -- shape rules ----------------------------------------------------------------------------------

def _same_as_first(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    return [list(inputs[0].shape)]


def _gemm_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    x, w = inputs[0].shape, inputs[1].shape
    rows = x[:-2] + [x[-1], x[-2]] if attrs.get("trans_a") else list(x)
    n = w[0] if attrs.get("trans_b", True) else w[1]
    return [rows[:-1] + [n]]


def _conv_out(size: int | str, k: int, s: int, p: int, d: int) -> int | str:
    if isinstance(size, str):
        return f"(({size})+{2 * p - d * (k - 1) - 1})//{s}+1"
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    x, w = inputs[0].shape, inputs[1].shape
    spatial = [
        _conv_out(size, k, s, p, d)
        for size, k, s, p, d in zip(x[2:], w[2:], attrs["stride"], attrs["padding"], attrs["dilation"])
    ]
    return [[x[0], w[0], *spatial]]


def _qkv_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    lead = list(inputs[0].shape[:-1])
    if not attrs.get("heads_first"):
        return [lead + [n] for n in attrs["splits"]]
    d = attrs["head_dim"]
    return [[*lead[:-1], n // d, lead[-1], d] for n in attrs["splits"]]


def _attn_score_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    q, k = inputs[0].shape, inputs[1].shape
    return [list(q[:-1]) + [k[-2]]]


def _heads_out_shape(rows: Sequence[Any], v: Sequence[Any], attrs: dict[str, Any]) -> list[Shape]:
    """[B, H, T, D] of an attention's output (B, H, T from ``rows``, D from ``v``), or [B, T, H·D] with
    ``merge_heads`` (the default)."""
    b, h, t, d = rows[0], rows[1], rows[2], v[3]
    if not attrs.get("merge_heads", True):
        return [[b, h, t, d]]
    merged = h * d if isinstance(h, int) and isinstance(d, int) else f"({h})*({d})"
    return [[b, t, merged]]


def _attn_output_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    return _heads_out_shape(inputs[0].shape, inputs[1].shape, attrs)  # p [B,H,T,S], v


def _embedding_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    return [list(inputs[1].shape) + [inputs[0].shape[1]]]


# -- the ops --------------------------------------------------------------------------------------

_ACT_DOC = f"activation applied to the result, one of {activations_doc()} (torch_ir.activations)"


_INT8_DOC = ("null, or x rounded to int8 in groups of this many along K before the product (per group scale "
             "max|x|/127, ties to even: llama.cpp's quantized activations; torch_ir.quant.numerics.int8_groups)")


def _int8_x(x: torch.Tensor, group: int | None) -> torch.Tensor:
    return x if group is None else int8_groups(x, group)


@npu_op("GEMM", inputs="x w bias? residual?", outputs="y", shape=_gemm_shape,
        layouts={"w": "[N,K]", "residual": "[B,T,H]"}, attrs={
            "trans_a": "x's last two dims are transposed first", "trans_b": "w is [N,K] (nn.Linear) rather than [K,N]",
            "activation": _ACT_DOC + ", after the residual add",
            "has_bias": "a bias input follows w (when absent: told by the input count, 3 inputs = a bias)",
            "has_residual": "a residual input of y's shape comes last and is added: y = act(x·w + bias + residual) "
                            "(a transformer's residual add folded into the GEMM before it)",
            "x_int8_group": _INT8_DOC})
def gemm(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor, trans_a: bool = False, trans_b: bool = True,
         activation: str | None = None, has_bias: bool | None = None, has_residual: bool = False,
         x_int8_group: int | None = None) -> torch.Tensor:
    """y = act(x · w(ᵀ) + bias [+ residual]): a linear layer, a matmul by a weight, addmm; batched over x's leading
    dims; with ``has_residual`` the residual add that follows it in a transformer block."""
    rest = tuple(t for t in rest if t is not None)  # gemm(x, w, None): no bias
    residual = rest[-1] if has_residual else None
    optional = rest[:-1] if has_residual else rest
    if len(optional) > 1 or (has_bias is not None and bool(has_bias) != bool(optional)):
        raise ValueError(f"GEMM: has_bias={has_bias}, has_residual={has_residual} but {len(rest)} input(s) after w")
    bias = optional[0] if optional else None
    a = _int8_x(x.transpose(-1, -2) if trans_a else x, x_int8_group)
    y = a @ (w.t() if trans_b else w)
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    return apply_activation(activation, y)


@npu_op("CONV", inputs="x w bias? bn_weight? bn_bias? bn_mean? bn_var? residual?", outputs="y", shape=_conv_shape,
        layouts={"x": "NCHW", "y": "NCHW", "w": "OIHW", "residual": "NCHW"}, attrs={
            "stride": "per spatial dim", "padding": "per spatial dim (symmetric)", "dilation": "per spatial dim",
            "groups": "channel groups", "has_bias": "a bias input follows w",
            "bn_eps": "batch norm folded in (inference statistics) when not null; its four inputs follow",
            "has_residual": "a residual input of y's shape comes last and is added after the batch norm: "
                            "y = act(bn(conv(x, w) + bias) + residual) (a ResNet block's add, folded in by the "
                            "compiler's kernel fusion)",
            "activation": _ACT_DOC + ", after the residual add"})
def conv(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor, stride: list[int], padding: list[int],
         dilation: list[int], groups: int = 1, has_bias: bool = False, bn_eps: float | None = None,
         has_residual: bool = False, activation: str | None = None) -> torch.Tensor:
    """y = act(bn(conv(x, w) + bias) [+ residual]): a 1-D/2-D/3-D convolution with batch norm, residual add and
    activation fused."""
    residual = rest[-1] if has_residual else None
    rest = rest[:-1] if has_residual else rest
    bias = rest[0] if has_bias else None
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
    y = fn(x, w, bias, stride, padding, dilation, groups)
    if bn_eps is not None:
        gamma, beta, mean, var = rest[1:5] if has_bias else rest[0:4]
        y = F.batch_norm(y, mean, var, gamma, beta, False, 0.0, bn_eps)
    if residual is not None:
        y = y + residual
    return apply_activation(activation, y)


@npu_op("LAYER_NORM", inputs="x weight? bias?", outputs="y", shape=_same_as_first,
        attrs={"normalized_shape": "trailing dims normalized", "eps": "added to the variance"})
def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
               normalized_shape: list[int], eps: float = 1e-5) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) · weight + bias over the trailing ``normalized_shape`` dims; without
    weight and bias (OLMo, Data2Vec's feature extractor) no affine."""
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


@npu_op("RMS_NORM", inputs="x weight?", outputs="y", shape=_same_as_first,
        attrs={"eps": "added to the mean square"})
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x², last dim) + eps) · weight, computed in float32 and cast back (as Llama/Qwen do)."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if weight is None else weight * y


@npu_op("BATCH_NORM", inputs="x weight bias mean var", outputs="y", shape=_same_as_first,
        attrs={"eps": "added to the variance"})
def batch_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
               *, eps: float = 1e-5) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) · weight + bias per channel (dim 1), with the running statistics:
    a per-channel scale and shift, for a batch norm no CONV before it could absorb (DenseNet's pre-activation)."""
    return F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)


@npu_op("LRN", inputs="x", outputs="y", shape=_same_as_first,
        attrs={"size": "channels in the window", "alpha": "scale", "beta": "exponent", "k": "added first"})
def lrn(x: torch.Tensor, *, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> torch.Tensor:
    """Local response normalization across channels (AlexNet, GoogLeNet): y = x / (k + alpha · mean of x² over
    ``size`` neighbouring channels)^beta, as ``torch.nn.LocalResponseNorm`` and ONNX's LRN define it; computed in
    float32 and cast back."""
    return F.local_response_norm(x.float(), size, alpha, beta, k).to(x.dtype)


def _masked(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))
    return scores + mask


@npu_op("SOFTMAX", inputs="x mask?", outputs="y", shape=_same_as_first, attrs={
    "dim": "the normalized dim", "scale": "x is multiplied by it first",
})
def softmax(x: torch.Tensor, mask: torch.Tensor | None = None, *, dim: int = -1, scale: float = 1.0) -> torch.Tensor:
    """y = softmax(x · scale + mask, dim); a boolean mask keeps the True positions, a float mask is added."""
    return torch.softmax(_masked(x * scale if scale != 1.0 else x, mask), dim)


@npu_op("QKV_PROJ", inputs="x w_q w_k? w_v? b_q? b_k? b_v?", outputs="q k v", shape=_qkv_shape,
        layouts={"x": "[B,T,H]", "q": "[B,T,H]", "k": "[B,T,H]", "v": "[B,T,H]"}, attrs={
            "splits": "output widths [q, k, v] (k and v narrower under grouped-query attention)",
            "packed": "one weight [q+k+v, K] (GPT-2's c_attn) instead of three",
            "has_bias": "biases follow the weights: true/false for all, or one flag per projection [q, k, v] "
                        "(Whisper's k has none)", "trans_b": "weights are [N,K] rather than [K,N]",
            "num_heads": "query heads (null when unknown)", "num_kv_heads": "key/value heads",
            "head_dim": "width of one head",
            "heads_first": "outputs split into heads, head-major: q [B,H,T,D], k and v [B,Hkv,T,D] (the layout "
                           "attention and the KV cache read) rather than [B,T,width]; needs head_dim",
            "x_int8_group": _INT8_DOC})
def qkv_proj(x: torch.Tensor, *params: torch.Tensor, splits: list[int], packed: bool = False,
             has_bias: bool | list[bool] = False, trans_b: bool = True, num_heads: int | None = None,
             num_kv_heads: int | None = None, head_dim: int | None = None,
             heads_first: bool = False, x_int8_group: int | None = None) -> tuple[torch.Tensor, ...]:
    """q, k, v = the three projections of one input, as one op (one weight read of x); with ``heads_first``
    each is split into heads of ``head_dim`` and written head-major, [B, heads, T, head_dim]."""
    n_w = 1 if packed else 3
    flags = list(has_bias) if isinstance(has_bias, list) else [bool(has_bias)] * n_w
    if len(flags) != n_w:
        raise ValueError(f"QKV_PROJ: has_bias lists {len(flags)} flags for {n_w} weights")
    given = iter(params[n_w:])
    biases = [next(given) if flag else None for flag in flags]
    outs = [gemm(x, w, b, trans_b=trans_b, x_int8_group=x_int8_group) for w, b in zip(params[:n_w], biases)]
    outs = list(torch.split(outs[0], splits, dim=-1)) if packed else outs
    if heads_first:
        if not head_dim:
            raise ValueError("QKV_PROJ: heads_first needs head_dim")
        outs = [t.unflatten(-1, (t.shape[-1] // head_dim, head_dim)).transpose(-3, -2) for t in outs]
    return tuple(outs)


def _repeat_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention: each of t's key/value heads serves heads // t.shape[-3] query heads."""
    groups = heads // t.shape[-3]
    return t if groups == 1 else t.repeat_interleave(groups, dim=-3)


@npu_op("ATTN_SCORE", inputs="q k mask?", outputs="p", shape=_attn_score_shape,
        layouts={"q": "[B,H,T,D]", "k": "[B,H,T,D]", "p": "[B,H,T,S]"}, attrs={
            "scale": "multiplies q·kᵀ (1/sqrt(D) usually)", "causal": "mask out future positions"})
def attn_score(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None, *, scale: float,
               causal: bool = False) -> torch.Tensor:
    """p = softmax(q·kᵀ·scale + mask): k may have fewer heads than q (grouped-query); a row with every
    position masked gives zeros, not NaN (torch's and onnxruntime's behaviour)."""
    scores = (q @ _repeat_heads(k, q.shape[-3]).transpose(-1, -2)) * scale
    if causal:
        t, s = scores.shape[-2:]
        future = torch.ones(t, s, dtype=torch.bool).tril().logical_not()  # torch's is_causal: top-left aligned
        scores = scores.masked_fill(future, float("-inf"))
    p = torch.softmax(_masked(scores, mask), dim=-1)
    return torch.where(torch.isnan(p), torch.zeros((), dtype=p.dtype), p)


@npu_op("ATTN_OUTPUT", inputs="p v", outputs="y", shape=_attn_output_shape,
        layouts={"p": "[B,H,T,S]", "v": "[B,H,T,D]", "y": "[B,T,H]"},
        attrs={"merge_heads": "y is [B,T,H·D] (heads merged) rather than [B,H,T,D]"})
def attn_output(p: torch.Tensor, v: torch.Tensor, *, merge_heads: bool = True) -> torch.Tensor:
    """y = p·v, then the heads merged back into the hidden dim; v may have fewer heads than p."""
    y = p @ _repeat_heads(v, p.shape[-3])
    if not merge_heads:
        return y
    b, h, t, d = y.shape
    return y.transpose(1, 2).reshape(b, t, h * d)


def _attention_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    return _heads_out_shape(inputs[0].shape, inputs[2].shape, attrs)  # q [B,H,T,D], v


@npu_op("ATTENTION", inputs="q k v mask?", outputs="y", shape=_attention_shape,
        layouts={"q": "[B,H,T,D]", "k": "[B,H,T,D]", "v": "[B,H,T,D]", "y": "[B,T,H]"}, attrs={
            "scale": "multiplies q·kᵀ (1/sqrt(D) usually)", "causal": "mask out future positions",
            "merge_heads": "y is [B,T,H·D] (heads merged) rather than [B,H,T,D]"})
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
              scale: float, causal: bool = False, merge_heads: bool = True) -> torch.Tensor:
    """y = softmax(q·kᵀ·scale + mask)·v, heads merged: ATTN_SCORE then ATTN_OUTPUT as one kernel (the
    probabilities never leave it). k and v may have fewer heads than q (grouped-query) and more positions
    (a KV cache, the mask hiding the unwritten ones)."""
    p = attn_score(q, k, mask, scale=scale, causal=causal)
    return attn_output(p, v, merge_heads=merge_heads)


@npu_op("SILU_GATE", inputs="a b", outputs="y", shape=_same_as_first, attrs={})
def silu_gate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y = silu(a) · b: the gated MLP of Llama/Qwen (gate and up projections)."""
    return F.silu(a) * b


def _gate_up_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    return _gemm_shape(inputs, attrs)


@npu_op("GATE_UP", inputs="x w_gate w_up b_gate? b_up?", outputs="y", shape=_gate_up_shape,
        layouts={"x": "[B,T,H]", "y": "[B,T,H]", "w_gate": "[N,K]", "w_up": "[N,K]"}, attrs={
            "trans_b": "weights are [N,K] (nn.Linear) rather than [K,N]",
            "has_bias": "b_gate and b_up follow the weights", "x_int8_group": _INT8_DOC})
def gate_up(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, *biases: torch.Tensor, trans_b: bool = True,
            has_bias: bool = False, x_int8_group: int | None = None) -> torch.Tensor:
    """y = silu(x·w_gateᵀ + b_gate) · (x·w_upᵀ + b_up): the gate and up projections of a gated MLP (Llama,
    Qwen) and their SILU_GATE as one kernel, one contraction over both weights (a kernel may concatenate them
    once, when the weights are bound; they stay two tensors in the weights file)."""
    if len(biases) != (2 if has_bias else 0):
        raise ValueError(f"GATE_UP: has_bias={has_bias} but {len(biases)} bias input(s) given")
    b_gate, b_up = biases if has_bias else (None, None)
    group = x_int8_group
    return silu_gate(gemm(x, w_gate, b_gate, trans_b=trans_b, x_int8_group=group),
                     gemm(x, w_up, b_up, trans_b=trans_b, x_int8_group=group))


@npu_op("ROPE", inputs="x cos sin", outputs="y", shape=_same_as_first,
        layouts={"x": "[B,H,T,D]", "y": "[B,H,T,D]"}, attrs={})
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """y = x·cos + rotate_half(x)·sin, rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]) (rotary embedding)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _rope_qk_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    return [list(inputs[0].shape), list(inputs[1].shape)]


@npu_op("ROPE_QK", inputs="q k cos sin", outputs="q_out k_out", shape=_rope_qk_shape,
        layouts={"q": "[B,H,T,D]", "k": "[B,H,T,D]", "q_out": "[B,H,T,D]", "k_out": "[B,H,T,D]"}, attrs={})
def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """ROPE of the query and the key with the same cos and sin, as one kernel (k may have fewer heads)."""
    return rope(q, cos, sin), rope(k, cos, sin)


@npu_op("KV_UPDATE", inputs="cache new index", outputs="y", shape=_same_as_first,
        layouts={"cache": "[B,H,T,D]", "y": "[B,H,T,D]"}, attrs={"dim": "the sequence dim of the cache"})
def kv_update(cache: torch.Tensor, new: torch.Tensor, index: torch.Tensor, *, dim: int = 2) -> torch.Tensor:
    """y = cache with ``new`` written at positions ``index`` along ``dim``: the KV-cache write."""
    return cache.index_copy(dim, index, new)


def embedding_id_problem(low: int, high: int, rows: int, negative_wraps: bool) -> str | None:
    """Why ids whose smallest is ``low`` and largest ``high`` cannot index a ``rows``-row table (None: they can).

    One rule for the reference and for the runtime's copy-in check, so both give the same message."""
    first, end = (-rows if negative_wraps else 0), rows
    bad = low if low < first else high if high >= end else None
    if bad is None:
        return None
    rule = ("a negative id counts from the end, as in ONNX Gather" if negative_wraps
            else "as torch.nn.functional.embedding, a negative id is an error")
    return f"id {bad} is outside the table of {rows} rows (ids must be in [{first}, {end}): {rule})"


@npu_op("EMBEDDING", inputs="table ids", outputs="y", shape=_embedding_shape,
        attrs={"negative_wraps": "true: ids in [-rows, rows), a negative id counts from the end (ONNX Gather); "
                                  "false or absent: ids in [0, rows) (PyTorch's embedding)"})
def embedding(table: torch.Tensor, ids: torch.Tensor, *, negative_wraps: bool = False) -> torch.Tensor:
    """y = table[ids]: a row lookup (token, position or type embedding). An id outside the table is an error
    (IndexError), as in eager PyTorch; with negative_wraps (set for ONNX Gather) a negative id counts from the
    end."""
    rows = table.shape[0]
    # checked here, not left to F.embedding, so the error names the id and the table's size; a meta tensor
    # (shape checks) has no values to check
    if ids.device.type != "meta" and ids.numel():
        problem = embedding_id_problem(int(ids.min()), int(ids.max()), rows, negative_wraps)
        if problem is not None:
            raise IndexError(f"EMBEDDING: {problem}")
    if negative_wraps:
        ids = torch.where(ids < 0, ids + rows, ids)
    return F.embedding(ids, table)


def npu_ops_markdown() -> str:
    """``docs/npu_ops.md``: the table above, as a page."""
    lines = [
        "# NPU op set",
        "",
        "Generated from `torch_ir/ops/npu.py` by `torch-ir ops --npu --markdown`; do not edit by hand.",
        "",
        "The normalization passes rewrite ATen graphs into these ops (the rules: \"Rewrite rules\" below). Each has a",
        "reference implementation registered in the op registry, so a normalized IR runs in `IRExecutor`.",
        "Elementwise ops, pooling, views and everything else stay the ATen ops they are.",
        "Inputs marked `?` are optional and trailing.",
        "",
        "| op | inputs | outputs | computes |",
        "|---|---|---|---|",
    ]
    for op in NPU_OPS.values():
        lines.append(f"| `{op.name}` | {', '.join(op.inputs)} | {', '.join(op.outputs)} | {op.doc} |")
    for op in NPU_OPS.values():
        lines += ["", f"## {op.name}", "", op.doc, ""]
        if op.attrs:
            lines += ["| attribute | meaning |", "|---|---|"]
            lines += [f"| `{k}` | {v} |" for k, v in op.attrs.items()]
        if op.layouts:
            lines += ["", "Layouts: " + ", ".join(f"`{k}` {v}" for k, v in op.layouts.items())]
    lines += ["", "## Activations", "",
              "The `activation` attribute of GEMM and CONV: one table (`torch_ir.activations`) that the references,",
              "the fusion rules and both backends read. NaN propagates through each, as in eager PyTorch.", "",
              *activations_markdown()]
    return "\n".join(lines) + "\n"
