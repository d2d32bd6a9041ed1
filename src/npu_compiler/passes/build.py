"""Small helpers the rule sets share: making replacement nodes, reading shapes and attributes.

Naming. A node a rule makes with an NPU op is named after what it computes, not after the node it
replaces (a fused GEMM + ReLU is not "relu"): the op in lower case, then the parts fused into it in
the order they apply (``_bn`` for a folded batch norm, ``_<activation>``), then ``_<n>`` for the n-th
node of that op (graph order as the rules make them; the first has no number, as torch.export names
``relu``, ``relu_1``). A node that grows by fusion keeps its number: ``conv_1`` -> ``conv_bn_1`` ->
``conv_bn_relu_1``; ``gemm`` -> ``gemm_relu``; ``rms_norm_2``, ``attn_score``. A rule that remakes an NPU
node without changing what it computes (a bias joining a GEMM, a transposed weight folded) keeps its
name. Names are drawn from the rewrite call's ``RewriteContext``, so they are unique in the graph (the
IR checker requires it; a taken name falls back to the next free number) and deterministic (a
replacement that is not applied gives its names back). Nodes of other ops (a canonical ``aten`` form,
a reshape a rule adds) keep the replaced root's name, plus the suffix the rule gives.
"""

from __future__ import annotations

import math
import re
from typing import Any

from npu_program.kernels import kernels_where
from torch_ir.ir import OpNode, TensorMeta
from torch_ir.ops.npu import NPU_OPS
from torch_ir.rewrite import Match


def npu_node_name(op_type: str, attrs: dict[str, Any]) -> str:
    """What an NPU node computes, as a name (before numbering): ``conv_bn_relu``, ``gemm_silu``, ``rope``."""
    parts = [op_type.lower()]
    if attrs.get("bn_eps") is not None:
        parts.append("bn")
    if attrs.get("activation"):
        parts.append(str(attrs["activation"]))
    return "_".join(parts)


def _npu_name(m: Match, op_type: str, attrs: dict[str, Any]) -> str:
    base = npu_node_name(op_type, attrs)
    if m.ctx is None:  # a replacement built outside ``rewrite`` (a rule called directly): no graph to ask
        return base
    removed = [m.node(), *([] if m.keep_interior else m.interior), *m.absorbed]  # their names are free
    free = {n.name for n in removed}
    for old in removed:  # a node of the same op that this one grows from lends its number
        n = _number(old) if old.op_type == op_type else None
        if n is None:
            continue
        try:
            return m.ctx.claim(base if n == 0 else f"{base}_{n}", nodes_only=True, reusable=free)
        except ValueError:  # another node has that name: the next free number
            break
    return m.ctx.fresh(base, nodes_only=True, reusable=free)


def _number(n: OpNode) -> int | None:
    """n of a node named ``<what it computes>_<n>`` (0 when unnumbered); None for a name given otherwise."""
    base = npu_node_name(n.op_type, n.attrs)
    if n.name == base:
        return 0
    found = re.fullmatch(re.escape(base) + r"_(\d+)", n.name)
    return int(found.group(1)) if found else None


def node(m: Match, op_type: str, inputs: list[TensorMeta], attrs: dict[str, Any] | None = None,
         outputs: list[TensorMeta] | None = None, suffix: str = "") -> OpNode:
    """A node that takes the root's place, by default with the root's outputs. Named as the module
    docstring says: an NPU op after what it computes, any other op after the root (plus ``suffix``)."""
    root, attrs = m.node(), dict(attrs or {})
    name = _npu_name(m, op_type, attrs) if op_type in NPU_OPS else root.name + suffix
    return OpNode(name, op_type, list(inputs), list(outputs if outputs is not None else root.outputs), attrs)


def temp(m: Match, like: TensorMeta, shape: list, suffix: str, dtype: str | None = None) -> TensorMeta:
    """A new intermediate tensor named after the root (``linear_r``)."""
    return TensorMeta(m.node().outputs[0].name + suffix, list(shape), dtype or like.dtype, role="activation")


def shape_attr(shape: list[int | str]) -> list[Any]:
    """A shape as an attribute value: symbolic dims in the ``{"sym": ...}`` form the executor decodes."""
    return [d if isinstance(d, int) else {"sym": d} for d in shape]


def out(m: Match, name: str = "root") -> TensorMeta:
    return m.node(name).outputs[0]


def static(shape: list[int | str]) -> bool:
    return all(isinstance(d, int) for d in shape)


def prod(dims: list[int | str]) -> int | None:
    return math.prod(dims) if static(dims) else None


def norm_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def producer_op(m: Match, t: TensorMeta) -> str | None:
    p = m.producer(t)
    return p.op_type if p is not None else None


#: The view ops (reshape, view, squeeze, ...), as the kernel table declares them.
VIEWS = tuple(sorted(kernels_where(view=True)))


def same_input(m: Match, a: TensorMeta, b: TensorMeta) -> bool:
    """One tensor, or two constants of one value (each layer's ``arange`` of a static length, folded)."""
    if a.name == b.name:
        return True
    value = m.constant(a)
    return value is not None and (list(a.shape), a.dtype) == (list(b.shape), b.dtype) and value == m.constant(b)


def residual_problem(m: Match, y: TensorMeta, add: OpNode, residual: TensorMeta, what: str) -> str | None:
    """Why ``add(y, residual)`` is not a plain residual add that the op making ``y`` (a ``what``) can take in,
    or None: an add without ``alpha``, of another tensor of ``y``'s shape and dtype that is not a weight.
    The CONV residual fusion (``npu_compiler.passes.kernel_fusion``) and the GEMM residual rule share it."""
    if add.attrs.get("alpha", 1) != 1:
        return "add with alpha != 1"
    if residual.name == y.name:
        return f"{what}(x) + {what}(x): both operands are the {what}"
    if (list(residual.shape), residual.dtype) != (list(y.shape), y.dtype):
        return "the residual is broadcast or of another dtype: not a plain residual"
    if m.is_param(residual):
        return "the residual is a weight or constant, not an activation"
    return None
