"""The cost formulas of the kernel records: FLOPs (multiply-adds count two) and traffic (the elements a kernel
reads of each input and writes of each output) for given tensor specs. A record names its formulas
(``KernelDef.flops``, ``KernelDef.traffic``); the cost model and ``node_flops`` call them. Plain Python over
shapes: no torch, no compiler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Spec(Protocol):
    """What the cost formulas read of a tensor: a ``TensorSpec`` of a program or a ``TensorMeta`` of an IR."""

    shape: Sequence[Any]
    dtype: str


@dataclass(frozen=True)
class KernelCost:
    flops: int
    bytes_read: int
    bytes_written: int


Flops = Callable[[Sequence[Spec], Sequence[Spec], dict[str, Any]], int]


def numel(t: Spec) -> int:
    return math.prod(int(d) for d in t.shape)


# -- FLOP formulas (multiply-adds count two) ------------------------------------------------------------

def per_output(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    """One operation per output element: elementwise ops, data movement, pooling windows are not counted."""
    return sum(numel(t) for t in outs)


def no_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    return 0


def gemm_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    k = ins[0].shape[-2] if params.get("trans_a") else ins[0].shape[-1]
    return 2 * numel(outs[0]) * int(k) + (numel(outs[0]) if params.get("has_residual") else 0)


def gate_up_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    return 4 * numel(outs[0]) * int(ins[0].shape[-1]) + numel(outs[0])  # two contractions, then silu(g) · u


def qkv_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    return 2 * sum(numel(t) for t in outs) * int(ins[0].shape[-1])


def conv_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    w = ins[1].shape  # [C_out, C_in / groups, *kernel]
    return 2 * numel(outs[0]) * int(w[1]) * math.prod(int(d) for d in w[2:]) \
        + (numel(outs[0]) if params.get("has_residual") else 0)


def attn_score_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    return 2 * numel(outs[0]) * int(ins[0].shape[-1]) + 5 * numel(outs[0])  # q·kᵀ, then the softmax


def attention_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    q, k, v = ins[0].shape, ins[1].shape, ins[2].shape
    scores = numel(ins[0]) // int(q[-1]) * int(k[-2])  # [B, H, T, S]
    return 2 * scores * int(q[-1]) + 5 * scores + 2 * scores * int(v[-1])  # q·kᵀ, the softmax, p·v


def matmul_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    return 2 * numel(outs[0]) * int(ins[0].shape[-1])


def reduce_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    return numel(ins[0])


def baddbmm_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    return 2 * numel(outs[0]) * int(ins[1].shape[-1]) + 2 * numel(outs[0])


def conv_transpose_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    w = ins[1].shape  # [C_in, C_out / groups, *kernel]: every input element meets C_out/groups · kernel weights
    return 2 * numel(ins[0]) * int(w[1]) * math.prod(int(d) for d in w[2:])


def einsum_flops(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    """Two per point of the iteration space (the product of every index's size), the usual count of a contraction."""
    terms = str(params.get("equation", "")).replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, spec in zip(terms, ins):
        letters = [c for c in term if c.isalpha()]
        if "." in term or len(letters) != len(spec.shape):
            return per_output(ins, outs, params)  # an ellipsis: not worth parsing for a cost estimate
        sizes.update({c: int(d) for c, d in zip(letters, spec.shape)})
    return 2 * math.prod(sizes.values()) if sizes else per_output(ins, outs, params)


# -- traffic formulas: the elements a kernel reads of each input and writes of each output ------------------------

#: (elements read of each input, elements written of each output), in input and output order: the data a kernel
#: moves, before a cost model adds its own re-reads of operands that do not fit on chip.
Traffic = Callable[[Sequence[Spec], Sequence[Spec], dict[str, Any]], tuple[list[int], list[int]]]


def whole(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Every input read whole, every output written whole: a kernel that uses every element it is given
    (elementwise, normalization, contractions, a concatenation, a pad, a copy or transpose)."""
    return [numel(t) for t in ins], [numel(t) for t in outs]


def gathered(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> tuple[list[int], list[int]]:
    """A gather or a slice (EMBEDDING, index, index_select, gather, slice, select): every output element is one
    element of the source (input 0) copied out, so the source is read where the output comes from, not whole (a
    7-token lookup reads 7 rows of the table), and never more than it holds however often an index repeats; the
    indices are read whole."""
    return [min(numel(ins[0]), numel(outs[0])), *(numel(t) for t in ins[1:])], [numel(t) for t in outs]


def bagged(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> tuple[list[int], list[int]]:
    """embedding_bag(table, indices, offsets): the table rows its indices name (at most the whole table), then
    the indices and offsets whole; its output is one row per bag, so the rows read are not the output's."""
    table, indices = ins[0], ins[1]
    rows = numel(indices) * (numel(table) // max(1, int(table.shape[0])))
    return [min(numel(table), rows), *(numel(t) for t in ins[1:])], [numel(t) for t in outs]


def overwritten(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> tuple[list[int], list[int]]:
    """copy(self, src): the output is src broadcast into self's shape and dtype, so self's values are never read."""
    return [0, *(numel(t) for t in ins[1:])], [numel(t) for t in outs]


def cache_update(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> tuple[list[int], list[int]]:
    """KV_UPDATE(cache, new, positions) writes in place: it reads the new rows and their positions and writes
    only those rows of the cache; the rest of the cache is neither read nor written."""
    return [0, numel(ins[1]), numel(ins[2])], [numel(ins[1])]


def conv_traffic(ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> tuple[list[int], list[int]]:
    """A convolution reads only the input rows and columns its windows touch (a strided 1 x 1 convolution reads a
    quarter of its input: the DMA fetches what the array uses, as SCALE-Sim counts it); the rest whole."""
    reads, writes = whole(ins, outs, params)
    x, w = [int(d) for d in ins[0].shape], [int(d) for d in ins[1].shape]
    (h, wd), (kh, kw) = x[-2:], w[-2:]
    stride, pad, dil = (_pair(params.get(p, d)) for p, d in (("stride", 1), ("padding", 0), ("dilation", 1)))
    rows = touched(h, kh, stride[0], pad[0], dil[0])
    cols = touched(wd, kw, stride[1], pad[1], dil[1])
    reads[0] = reads[0] // (h * wd) * rows * cols if h * wd else reads[0]
    return reads, writes


def touched(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """How many of ``size`` input positions of one spatial dim the windows of a convolution read."""
    span = (kernel - 1) * dilation + 1
    out = (size + 2 * pad - span) // stride + 1
    if dilation == 1 and stride <= span:  # windows overlap or abut: one run of positions
        first, last = -pad, (out - 1) * stride - pad + span - 1
        return max(0, min(last, size - 1) - max(first, 0) + 1)
    taps = {o * stride - pad + i * dilation for o in range(out) for i in range(kernel)}
    return sum(0 <= t < size for t in taps)


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return (int(value[0]), int(value[-1]))
    return (int(value), int(value))


__all__ = ["Flops", "KernelCost", "Spec", "Traffic", "attention_flops", "attn_score_flops", "baddbmm_flops", "bagged",
           "cache_update", "conv_flops", "conv_traffic", "conv_transpose_flops",
           "einsum_flops", "gate_up_flops", "gathered", "gemm_flops", "matmul_flops", "no_flops", "numel",
           "overwritten", "per_output", "qkv_flops", "reduce_flops", "touched", "whole"]
