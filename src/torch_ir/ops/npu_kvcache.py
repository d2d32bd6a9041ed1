"""The NPU ops of a quantized KV cache (``npu_compiler.kvcache`` rewrites an LLM's cache into them).

A cache ``[B, H, S, D]`` is held as codes of the cache's code type (int8, or fp8 e4m3) of the same shape plus one
float32 scale per head and position, ``[B, H, S]``: each key or value vector of one head at one position is
quantized symmetrically on its own, ``scale = max|x| / qmax`` (qmax 127 for int8, 448 for e4m3) and
``q = saturate(round_half_even(x / scale))`` (``torch_ir.quant.numerics.quantize``, ONNX's ``divide``; an all-zero
vector gets scale 0 and codes 0). Per token, so writing a new position never rescales the old ones; per head,
because heads' ranges differ by orders of magnitude (a per-tensor scale would flatten the small ones).

* ``KVQ_UPDATE`` quantizes the new rows and writes codes and scales at their positions (in a program: in place,
  both outputs the cache's state slots);
* ``KVQ_ATTENTION`` is ``ATTENTION`` over ``codes · scale`` (the reference dequantizes into the query's dtype, the
  float cache's, and runs ``ATTENTION``'s reference);
* ``KVQ_DEQUANTIZE`` gives the float cache back for any other reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..ir import TensorMeta
from ..quant import numerics as qn
from ..quant.spec import QTYPES
from .npu import Shape, _attention_shape, attention, npu_op

#: Code types a quantized KV cache may hold.
KV_CODE_DTYPES = ("int8", "float8_e4m3fn")


def quantize_kv(x: torch.Tensor, dtype: str = "int8") -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` -> (codes ``[..., D]`` of ``dtype``, float32 scales ``[...]``): one symmetric scale per vector
    along the last dim (module docstring), the codes by ``torch_ir.quant.numerics.quantize``."""
    if dtype not in KV_CODE_DTYPES:
        raise ValueError(f"a KV cache holds codes of {', '.join(KV_CODE_DTYPES)}, not {dtype!r}")
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32)
    scale = rows.abs().amax(dim=-1) / QTYPES[dtype][1]
    divisor = torch.where(scale == 0, torch.ones_like(scale), scale)  # an all-zero row: codes 0, scale 0
    codes = qn.quantize(rows, divisor, None, dtype=dtype, axis=0)
    return codes.reshape(x.shape), scale.reshape(x.shape[:-1])


def dequantize_kv(codes: torch.Tensor, scales: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``codes · scale`` in float32 (``torch_ir.quant.numerics.dequantize``), cast to ``out_dtype``."""
    if tuple(scales.shape) != tuple(codes.shape[:-1]):
        raise ValueError(f"KV cache codes {list(codes.shape)} need scales {list(codes.shape[:-1])}, got "
                         f"{list(scales.shape)}")
    rows = codes.reshape(-1, codes.shape[-1])
    x = qn.dequantize(rows, scales.reshape(-1), None, dtype=qn.dtype_name(codes), axis=0, out_dtype=out_dtype)
    return x.reshape(codes.shape)


def _update_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    return [list(inputs[0].shape), list(inputs[1].shape)]


@npu_op("KVQ_UPDATE", inputs="codes scales new index", outputs="codes_out scales_out", shape=_update_shape,
        layouts={"codes": "[B,H,S,D]", "scales": "[B,H,S]", "new": "[B,H,T,D]"},
        attrs={"dim": "the sequence dim of the cache (not its last: each row along the last dim has one scale)"})
def kvq_update(codes: torch.Tensor, scales: torch.Tensor, new: torch.Tensor, index: torch.Tensor, *,
               dim: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """KV_UPDATE into a quantized cache: ``new``'s vectors quantized per head and position (one float32 scale each,
    max|x| / qmax, codes round half to even) and written with their scales at positions ``index`` along ``dim``."""
    rank = codes.dim()
    if not -rank <= dim < rank or dim % rank == rank - 1:
        raise ValueError(f"KVQ_UPDATE: dim {dim} of a rank-{rank} cache must be a dim before the last")
    q, s = quantize_kv(new, qn.dtype_name(codes))
    dim %= rank
    written = as_bytes(codes).index_copy(dim, index, as_bytes(q)).view(codes.dtype)
    return written, scales.index_copy(dim, index, s)


def as_bytes(codes: torch.Tensor) -> torch.Tensor:
    """One-byte codes viewed as uint8 (torch has no index_copy for fp8: the bytes are what is copied)."""
    return codes.view(torch.uint8)


def _kvq_attention_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    return _attention_shape([inputs[0], inputs[1], inputs[3]], attrs)


@npu_op("KVQ_ATTENTION", inputs="q k k_scales v v_scales mask?", outputs="y", shape=_kvq_attention_shape,
        layouts={"q": "[B,H,T,D]", "k": "[B,H,S,D]", "k_scales": "[B,H,S]", "v": "[B,H,S,D]",
                 "v_scales": "[B,H,S]", "y": "[B,T,H]"},
        attrs={"scale": "multiplies q·kᵀ (1/sqrt(D) usually)", "causal": "mask out future positions",
               "merge_heads": "y is [B,T,H·D] (heads merged) rather than [B,H,T,D]"})
def kvq_attention(q: torch.Tensor, k: torch.Tensor, k_scales: torch.Tensor, v: torch.Tensor, v_scales: torch.Tensor,
                  mask: torch.Tensor | None = None, *, scale: float, causal: bool = False,
                  merge_heads: bool = True) -> torch.Tensor:
    """ATTENTION over a quantized KV cache: keys and values are codes · their per-head, per-position scales,
    dequantized into q's dtype (what the float cache holds), then ATTENTION's reference."""
    return attention(q, dequantize_kv(k, k_scales, q.dtype), dequantize_kv(v, v_scales, q.dtype), mask,
                     scale=scale, causal=causal, merge_heads=merge_heads)


@npu_op("KVQ_DEQUANTIZE", inputs="codes scales", outputs="x", shape=lambda inputs, attrs: [list(inputs[0].shape)],
        attrs={"out_dtype": "the float type of x (the cache's before quantization)"})
def kvq_dequantize(codes: torch.Tensor, scales: torch.Tensor, *, out_dtype: str = "float32") -> torch.Tensor:
    """x = codes · scale per head and position, in float32, cast to out_dtype: the float cache for a reader other
    than KVQ_ATTENTION."""
    return dequantize_kv(codes, scales, qn.storage_dtype(out_dtype))


__all__ = ["KV_CODE_DTYPES", "as_bytes", "dequantize_kv", "kvq_attention", "kvq_dequantize", "kvq_update",
           "quantize_kv"]
