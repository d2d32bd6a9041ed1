"""A first cost model: floating-point operations per node, for placement summaries and reports.

Counts are multiply-adds times two for contractions (GEMM, CONV, attention, matmul) and one per output
element for everything else: enough to say where the work is, not a latency prediction.
"""

from __future__ import annotations

import math

from torch_ir.ir import OpNode, TensorMeta


def _numel(t: TensorMeta) -> int:
    return t.numel() or 0


def node_flops(node: OpNode) -> int:
    """Approximate FLOPs of one node with static shapes (0 when a shape is symbolic)."""
    op, ins, outs = node.op_type, node.inputs, node.outputs
    if any(not t.is_static for t in [*ins, *outs]):
        return 0
    if op == "GEMM":
        k = ins[0].shape[-2] if node.attrs.get("trans_a") else ins[0].shape[-1]
        return 2 * _numel(outs[0]) * int(k)
    if op == "QKV_PROJ":
        return 2 * sum(_numel(t) for t in outs) * int(ins[0].shape[-1])
    if op in ("CONV", "aten.conv2d.default", "aten.convolution.default"):
        w = ins[1].shape  # [C_out, C_in / groups, *kernel]
        return 2 * _numel(outs[0]) * int(w[1]) * math.prod(int(d) for d in w[2:])
    if op == "ATTN_SCORE":  # q·kᵀ then softmax
        return 2 * _numel(outs[0]) * int(ins[0].shape[-1]) + 5 * _numel(outs[0])
    if op == "ATTN_OUTPUT":  # p·v
        return 2 * _numel(outs[0]) * int(ins[0].shape[-1])
    if op in ("aten.matmul.default", "aten.bmm.default", "aten.mm.default"):
        return 2 * _numel(outs[0]) * int(ins[0].shape[-1])
    return sum(_numel(t) for t in outs)
