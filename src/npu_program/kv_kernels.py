"""The kernel table's rows for a quantized KV cache (``torch_ir.ops.npu_kvcache``): KVQ_UPDATE, KVQ_ATTENTION and
KVQ_DEQUANTIZE. Loaded by :mod:`npu_program.kernels` after ``quant_kernels``.

The cache is codes ``[B, H, S, D]`` (int8, or fp8 e4m3) and float32 scales ``[B, H, S]``, one per head and position;
the bytes of each follow from its dtype, so the cost model counts one byte per code plus four per vector. Only the
CPU backend has kernels: a target without them (WebGPU) refuses an LLM compiled with ``kv_bits`` at compile time,
or runs these dispatches on the host with ``fallback="cpu"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .array_mapping import ArrayMapping, attention_mapping
from .cost_formulas import Spec, attention_flops, no_flops, numel
from .kernel_record import FLOATS, HALF, REFERENCE, kernel, t
from .params import p

#: The dtypes these kernels read and write: float activations, the codes, float32 scales, int64 positions, a mask.
KV_DTYPES = FLOATS | frozenset({"int8", "float8_e4m3fn", "int64", "bool"})
_CPU = "npu_runtime.backends.cpu_kvcache"


def kvq_update_traffic(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]
                       ) -> tuple[list[int], list[int]]:
    """KVQ_UPDATE(codes, scales, new, positions) writes in place: it reads the new rows and their positions and
    writes their codes and their scales only; the rest of the cache is neither read nor written."""
    rows = numel(ins[2]) // max(1, int(ins[2].shape[-1]))
    return [0, 0, numel(ins[2]), numel(ins[3])], [numel(ins[2]), rows]


def _q_k_v(ins: Sequence[Spec]) -> list[Spec]:
    return [ins[0], ins[1], ins[3], *ins[5:]]


def kvq_attention_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    """ATTENTION's, plus a multiply per score and per probability (the key and value scales)."""
    scores = numel(ins[0]) // int(ins[0].shape[-1]) * int(ins[1].shape[-2])
    return attention_flops(_q_k_v(ins), outs, params) + 2 * scores


def kvq_attention_mapping(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any],
                          weights: Sequence[int]) -> ArrayMapping:
    """ATTENTION's two GEMMs over the codes (k at input 1, v at input 3)."""
    m = attention_mapping(_q_k_v(ins), outs, params, weights)
    return ArrayMapping(m.gemms, m.softmax, [1, 3], [0])


kernel("KVQ_UPDATE", "movement", "quantize new keys/values per head and position (symmetric, one float32 scale per "
       "vector) and write codes and scales into a quantized KV cache at positions, in place: its outputs are the "
       "codes' and the scales' state slots", params=(p("dim", "int", 2, "the sequence axis (not the last)"),),
       dtypes=KV_DTYPES, flops=no_flops, traffic=kvq_update_traffic, writes_state=True,
       impls={"cpu": f"{_CPU}:KvqUpdate"},
       # fp8 codes are tested in tests/llm/test_kv_quant.py: the table's harness reads results through numpy, which
       # has no fp8
       test=t("1,2,8,4:int8", "1,2,8:float32:positive", "1,2,3,4", "3:int64:positions:8", params={"dim": 2},
              dtypes=HALF))
kernel("KVQ_ATTENTION", "attention", "softmax(q · kᵀ · scale + mask) · v over a quantized KV cache (k and v codes "
       "times their per-head, per-position scales), heads merged; the scales are applied to the scores and the "
       "probabilities, never to the cache", flops=kvq_attention_flops, array=kvq_attention_mapping, dtypes=KV_DTYPES,
       params=(p("scale", "float", doc="applied to q · kᵀ"), p("causal", "bool", False, "mask the future"),
               p("merge_heads", "bool", True, "[B, T, H·D] rather than [B, H, T, D]")),
       impls={"cpu": f"{_CPU}:KvqAttention"},
       test=(t("1,4,1,4", "1,2,7,4:int8", "1,2,7:float32:positive", "1,2,7,4:int8", "1,2,7:float32:positive",
               "1,1,1,7:bool", params={"scale": 0.5, "causal": False, "merge_heads": True}, dtypes=HALF),
             t("1,4,5,4", "1,2,5,4:int8", "1,2,5:float32:positive", "1,2,5,4:int8", "1,2,5:float32:positive",
               params={"scale": 0.5, "causal": True, "merge_heads": False}),
             t("1,2,1,4", "1,1,6,4:float8_e4m3fn", "1,1,6:float32:positive", "1,1,6,4:float8_e4m3fn",
               "1,1,6:float32:positive", "1,1,1,6", params={"scale": 0.5, "causal": False, "merge_heads": True})))
kernel("KVQ_DEQUANTIZE", "elementwise", "codes · scale per head and position: a quantized KV cache as floats, for a "
       "reader other than KVQ_ATTENTION", dtypes=KV_DTYPES,
       params=(p("out_dtype", "str", "float32", "the float type of the result", choices=tuple(sorted(FLOATS))),),
       impls={"cpu": REFERENCE},
       test=t("1,2,6,4:int8", "1,2,6:float32:positive", params={"out_dtype": "float32"}))
