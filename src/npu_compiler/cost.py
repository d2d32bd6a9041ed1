"""FLOPs per node, for placement summaries and reports: the formulas are the kernel table's
(``npu_program.kernels``), so a node and the dispatch it lowers to cost the same.

Counts are multiply-adds times two for contractions (GEMM, CONV, attention, matmul) and one per output
element for everything else: enough to say where the work is, not a latency prediction.
"""

from __future__ import annotations

from npu_program.kernels import node_flops as kernel_flops
from torch_ir.ir import OpNode


def node_flops(node: OpNode) -> int:
    """Approximate FLOPs of one node with static shapes (0 when a shape is symbolic)."""
    if any(not t.is_static for t in [*node.inputs, *node.outputs]):
        return 0
    return kernel_flops(node.op_type, node.inputs, node.outputs, node.attrs)
