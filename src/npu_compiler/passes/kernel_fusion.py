"""Kernel fusions the compiler makes: rules for the one rewrite engine (``torch_ir.rewrite``).

They run after ``normalize`` and before lowering, on the NPU-op IR, and make the fused kernels of the
kernel table (``npu_program.kernels``, kind ``"fused"``). A fused node is an ordinary IR node with a
reference implementation (``torch_ir.ops.npu``), so an IR with fused nodes still runs in
``IRExecutor`` and partitions like any other.

``CONV_ADD``: a CONV whose result is only read by a residual add (and a relu after it) becomes one
node, ``act(CONV(x) + residual)``. Whether its output may be written over the residual's bytes is a
memory decision, made by lowering (``lower.write_in_place``), not here.
"""

from __future__ import annotations

from npu_compiler.passes.build import residual_problem
from torch_ir.ir import NPU_IR, OpNode
from torch_ir.rewrite import Match, Op, Rule, Var, rewrite

r = Var("residual")
_CONV = Op("CONV", exact_arity=False, name="conv")
_ADD = ("aten.add.Tensor",)


def _check(m: Match) -> str | None:
    conv, add = m.node("conv"), m.node("add")
    if conv.attrs.get("activation") is not None:
        return "the CONV already applies an activation before the add"
    return residual_problem(m, conv.outputs[0], add, m["residual"], "CONV")


def _fused(m: Match) -> list[OpNode]:
    conv, add = m.node("conv"), m.node("add")
    return [OpNode(f"{conv.name}_add", "CONV_ADD", [*conv.inputs, m["residual"]], list(add.outputs),
                   {**conv.attrs, "activation": None})]


def _relu(m: Match) -> list[OpNode] | None:
    fused = m.node("fused")
    if fused.attrs.get("activation") is not None:
        return None
    return [OpNode(fused.name, "CONV_ADD", list(fused.inputs), list(m.node().outputs),
                   {**fused.attrs, "activation": "relu"})]


def _rules() -> list[Rule]:
    rules = [Rule(f"conv_add_{side}", "kernel_fusion", Op(_ADD, *pattern, name="add"), _fused, check=_check,
                  doc="CONV(x) + residual -> CONV_ADD")
             for side, pattern in (("left", (_CONV, r)), ("right", (r, _CONV)))]
    rules.append(Rule("conv_add_relu", "kernel_fusion",
                      Op("aten.relu.default", Op("CONV_ADD", exact_arity=False, name="fused")), _relu,
                      doc="relu(CONV_ADD) -> CONV_ADD with the relu applied after the add"))
    return rules


KERNEL_FUSION_RULES = _rules()


def fuse_kernels(ir: NPU_IR) -> NPU_IR:
    """``ir`` with the compiler's kernel fusions applied (the input is not modified)."""
    return rewrite(ir, KERNEL_FUSION_RULES).ir


__all__ = ["KERNEL_FUSION_RULES", "fuse_kernels"]
