"""Attention (opset 23): ``aten.scaled_dot_product_attention`` for the forms SDPA computes.

3-D inputs ``(B, S, heads*head_dim)`` are split into heads first, as the ONNX op does with
``q_num_heads``/``kv_num_heads``. 16-bit inputs are computed in float32, as ONNX does. A KV cache
(past_key/past_value), softcap, sliding windows, a mask together with is_causal, and the extra
outputs are left to the ONNX op.
"""

# ruff: noqa: N802 - converters are named after the ONNX op they translate

from __future__ import annotations

from ..context import Ctx, UnsupportedNode
from . import converter


def _heads(ctx: Ctx, x, heads: int | None):
    """(B, S, H*D) -> (B, H, S, D); 4-D inputs are already split."""
    if ctx.rank(x) == 4:
        return x
    if not heads:
        raise UnsupportedNode("3-D Attention input without q_num_heads/kv_num_heads")
    b, s, hidden = ctx.shape(x)
    return ctx.aten("permute", ctx.aten("reshape", x, [b, s, heads, hidden // heads]), [0, 2, 1, 3])


@converter("Attention", since=23)
def Attention(ctx: Ctx, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
              softmax_precision=None, **newer):
    if newer:  # opset 25's sliding windows and later additions
        raise UnsupportedNode(f"Attention with {sorted(newer)}")
    if ctx.n_outputs > 1 or past_key is not None or past_value is not None or nonpad_kv_seqlen is not None:
        raise UnsupportedNode("Attention with a KV cache or extra outputs")
    if softcap or (is_causal and attn_mask is not None):
        raise UnsupportedNode("Attention with softcap, or with both a mask and is_causal")
    three_d = ctx.rank(q) == 3
    qh, kh, vh = _heads(ctx, q, q_num_heads), _heads(ctx, k, kv_num_heads), _heads(ctx, v, kv_num_heads)
    if attn_mask is not None and ctx.rank(attn_mask) < 2:
        raise UnsupportedNode("Attention mask of rank < 2")
    gqa = ctx.shape(qh)[1] != ctx.shape(kh)[1]
    dtype = ctx.dtype(q)
    if dtype in ("float16", "bfloat16"):  # ONNX accumulates 16-bit attention in float32
        qh, kh, vh = (ctx.cast(t, "float32") for t in (qh, kh, vh))
        if attn_mask is not None and ctx.dtype(attn_mask) != "bool":
            attn_mask = ctx.cast(attn_mask, "float32")
    y = ctx.aten("scaled_dot_product_attention", qh, kh, vh, attn_mask, 0.0, bool(is_causal), scale=scale,
                 enable_gqa=gqa)
    y = ctx.cast(y, dtype)
    if not three_d:
        return y
    b, h, s, d = ctx.shape(y)
    return ctx.aten("reshape", ctx.aten("permute", y, [0, 2, 1, 3]), [b, s, h * d])
