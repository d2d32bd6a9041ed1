"""FLOPs per node, for placement summaries and reports: the formulas are the kernel table's
(``npu_program.kernels``), so a node and the dispatch it lowers to cost the same.

Counts are multiply-adds times two for contractions (GEMM, CONV, attention, matmul) and one per output
element for everything else: enough to say where the work is, not a latency prediction.
"""

from __future__ import annotations

from npu_program.kernels import node_flops as kernel_flops
from torch_ir.errors import IRValidationError
from torch_ir.ir import OpNode


def node_flops(node: OpNode) -> int:
    """Approximate FLOPs of one node with static shapes (0 when a shape is symbolic)."""
    if any(not t.is_static for t in [*node.inputs, *node.outputs]):
        return 0
    try:
        return kernel_flops(node.op_type, node.inputs, node.outputs, node.attrs)
    except (IndexError, ValueError, TypeError) as e:  # the formula reads shapes the op always has: a bad file
        raise IRValidationError(
            f"node {node.name!r} ({node.op_type}): its inputs and outputs do not have the ranks and shapes the op "
            f"takes ({type(e).__name__}: {e}); the IR is damaged: extract or save it again") from None
