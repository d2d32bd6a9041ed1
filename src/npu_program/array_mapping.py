"""How a contraction kernel runs on a MAC array: as which GEMMs, and which of its inputs is the weight operand.

A kernel record names its mapping (``KernelDef.array``) as it names its FLOP formula; the cost model
(``npu_compiler.costmodel.model``) maps every dispatch through its record's, and a record without one is not
run on the array (or, for a contraction, is costed at the array's peak rate and flagged). Before these were
record fields, the cost model kept an ``if`` chain on kernel names, and a new contraction silently fell
through it. Plain Python over shapes: no torch, no compiler.

Each mapping is ``fn(ins, outs, params, weights) -> ArrayMapping``: ``weights`` are the indices of the inputs
that are weight slots of the program (bound before the first run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .cost_formulas import Spec, numel

#: One GEMM of a mapping: (batch, M, N, K), ``batch`` independent M x N x K products.
Gemm = tuple[int, int, int, int]


@dataclass(frozen=True)
class ArrayMapping:
    """A kernel as GEMMs on the array, the softmax elements its vector unit adds (attention), and the roles of
    its inputs: the weight operand W and the activation operand A (the rest: biases, statistics, residuals)."""

    gemms: list[Gemm]
    softmax: int
    weight_inputs: list[int]
    activation_inputs: list[int]


Mapping = Callable[[Sequence[Spec], Sequence[Spec], dict[str, Any], Sequence[int]], ArrayMapping]


def _dims(t: Spec) -> list[int]:
    return [int(x) for x in t.shape]


def gemm_mapping(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any],
                 weights: Sequence[int]) -> ArrayMapping:
    """GEMM: M = output rows (all leading dims), N = output features, K = the reduction dim; a 3-D weight is a
    batch of GEMMs."""
    x, w, y = _dims(ins[0]), _dims(ins[1]), _dims(outs[0])
    k = x[-2] if params.get("trans_a") else x[-1]
    n = y[-1]
    batch = max(1, math.prod(w) // (k * n)) if len(w) > 2 else 1
    return ArrayMapping([(batch, math.prod(y) // (n * batch), n, k)], 0, [1], [0])


def conv_mapping(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any],
                 weights: Sequence[int]) -> ArrayMapping:
    """CONV as an implicit GEMM per group: M = batch * output pixels, N = C_out / groups, K = C_in / groups * kernel
    taps (a residual add is in the epilogue)."""
    w, y = _dims(ins[1]), _dims(outs[0])
    groups = int(params.get("groups", 1) or 1)
    c_out = w[0]
    return ArrayMapping([(groups, math.prod(y) // c_out, c_out // groups, w[1] * math.prod(w[2:]))], 0, [1], [0])


def qkv_mapping(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any],
                weights: Sequence[int]) -> ArrayMapping:
    """QKV_PROJ: one GEMM with N = the sum of the q, k and v widths."""
    k = _dims(ins[0])[-1]
    m = numel(ins[0]) // k
    return ArrayMapping([(1, m, sum(numel(t) for t in outs) // m, k)], 0, list(weights) or [1], [0])


def gate_up_mapping(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any],
                    weights: Sequence[int]) -> ArrayMapping:
    """GATE_UP: one GEMM over both weights, N = 2 * the ffn width."""
    k, f = _dims(ins[0])[-1], _dims(outs[0])[-1]
    return ArrayMapping([(1, numel(outs[0]) // f, 2 * f, k)], 0, list(weights) or [1, 2], [0])


def _batched(a_index: int, b_index: int) -> Mapping:
    """matmul, mm, bmm (operands 0 and 1) and baddbmm (1 and 2): a 2-D right operand is shared, so the batch
    folds into M; else one GEMM per batch."""
    def mapping(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any],
                weights: Sequence[int]) -> ArrayMapping:
        a, b, y = _dims(ins[a_index]), _dims(ins[b_index]), _dims(outs[0])
        k, n = a[-1], (b[-1] if len(b) > 1 else 1)
        if len(b) <= 2:
            return ArrayMapping([(1, max(1, math.prod(y) // n), n, k)], 0, [b_index], [a_index])
        m = a[-2] if len(a) > 1 else 1
        return ArrayMapping([(max(1, math.prod(y) // (m * n)), m, n, k)], 0, [b_index], [a_index])

    return mapping


matmul_mapping = _batched(0, 1)
baddbmm_mapping = _batched(1, 2)


def attn_score_mapping(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any],
                       weights: Sequence[int]) -> ArrayMapping:
    """ATTN_SCORE: q·kᵀ per batch-head (M = T, N = S, K = D), then the softmax of the scores."""
    q, kk = _dims(ins[0]), _dims(ins[1])
    t, dh, s = q[-2], q[-1], kk[-2]
    batch = numel(ins[0]) // (t * dh)
    return ArrayMapping([(batch, t, s, dh)], batch * t * s, [1], [0])


def attn_output_mapping(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any],
                        weights: Sequence[int]) -> ArrayMapping:
    """ATTN_OUTPUT: p·v per batch-head (M = T, N = D, K = S)."""
    p, v = _dims(ins[0]), _dims(ins[1])
    t, s = p[-2], p[-1]
    return ArrayMapping([(numel(ins[0]) // (t * s), t, v[-1], s)], 0, [1], [0])


def attention_mapping(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any],
                      weights: Sequence[int]) -> ArrayMapping:
    """ATTENTION: ATTN_SCORE then ATTN_OUTPUT, the scores kept on chip."""
    q, kk, v = _dims(ins[0]), _dims(ins[1]), _dims(ins[2])
    t, dh, s, dv = q[-2], q[-1], kk[-2], v[-1]
    batch = numel(ins[0]) // (t * dh)
    return ArrayMapping([(batch, t, s, dh), (batch, t, dv, s)], batch * t * s, [1, 2], [0])


__all__ = ["ArrayMapping", "Gemm", "Mapping", "attention_mapping", "attn_output_mapping", "attn_score_mapping",
           "baddbmm_mapping", "conv_mapping", "gate_up_mapping", "gemm_mapping", "matmul_mapping", "qkv_mapping"]
