"""Kernel fusions the compiler makes: rules for the one rewrite engine (``torch_ir.rewrite``).

They run after ``normalize`` and before lowering, on the NPU-op IR, and extend a kernel of the kernel table
(``npu_program.kernels``) by what follows it. The result is an ordinary IR node with a reference
implementation (``torch_ir.ops.npu``), so an IR with fused nodes still runs in ``IRExecutor`` and partitions
like any other.

The residual add: a CONV whose result is only read by a residual add (and a relu after it) becomes one CONV
with ``has_residual`` (the residual its last input) and the relu as its activation: ``act(CONV(x) +
residual)``, as a GEMM takes a transformer's residual in normalize (``npu_compiler.passes.decoder``). Whether its
output may be written over the residual's bytes is a memory decision, made by lowering
(``lower.write_in_place``), not here.
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
    if conv.attrs.get("has_residual"):
        return "the CONV already adds a residual"
    if conv.attrs.get("activation") is not None:
        return "the CONV already applies an activation before the add"
    return residual_problem(m, conv.outputs[0], add, m["residual"], "CONV")


def _fused(m: Match) -> list[OpNode]:
    conv, add = m.node("conv"), m.node("add")
    return [OpNode(f"{conv.name}_add", "CONV", [*conv.inputs, m["residual"]], list(add.outputs),
                   {**conv.attrs, "has_residual": True, "activation": None})]


def _relu(m: Match) -> list[OpNode] | None:
    fused = m.node("fused")
    if not fused.attrs.get("has_residual") or fused.attrs.get("activation") is not None:
        return None  # a CONV without a residual took its relu in normalize's activation fusion
    return [OpNode(fused.name, "CONV", list(fused.inputs), list(m.node().outputs),
                   {**fused.attrs, "activation": "relu"})]


def _rules() -> list[Rule]:
    rules = [Rule(f"conv_add_{side}", "kernel_fusion", Op(_ADD, *pattern, name="add"), _fused, check=_check,
                  doc="CONV(x) + residual -> CONV(x, ..., residual, has_residual)")
             for side, pattern in (("left", (_CONV, r)), ("right", (r, _CONV)))]
    rules.append(Rule("conv_add_relu", "kernel_fusion",
                      Op("aten.relu.default", Op("CONV", exact_arity=False, name="fused")), _relu,
                      doc="relu(CONV with has_residual) -> the CONV with the relu applied after the add"))
    return rules


KERNEL_FUSION_RULES = _rules()


def fuse_kernels(ir: NPU_IR) -> NPU_IR:
    """``ir`` with the compiler's kernel fusions applied (the input is not modified)."""
    return rewrite(ir, KERNEL_FUSION_RULES).ir


__all__ = ["KERNEL_FUSION_RULES", "fuse_kernels"]
