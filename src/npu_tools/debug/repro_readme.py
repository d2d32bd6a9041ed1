"""The README of a repro directory: what is wrong, the minimal IR, how to run it, its files and arrays.

Node, tensor, module and rule names come from a file (the model's IR): each is escaped or in a code span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch_ir.ir import OpNode, provenance_of
from torch_ir.report.markdown import cell

from .report import code_span, fenced

if TYPE_CHECKING:
    from .repro import ReproCase


_RUNS = {
    "frontend": ("the minimal IR on the reference executor (`IRExecutor`): the frontend's translation",
                 "the trusted framework's values in expected.npz; with model.onnx, onnxruntime runs the ONNX "
                 "node itself"),
    "rule": ("the rule {rule} rewrites the minimal IR, then `IRExecutor` runs the result",
             "`IRExecutor` on the minimal IR as it was before the rule"),
    "kernel": ("`npu_compiler.compile(ir, target='{backend}')` (no normalization, no fusion), run by "
               "`npu_runtime.Executor` on the {backend} backend",
               "`IRExecutor` on the minimal IR (the op's reference implementation)"),
    "lowering": ("`npu_compiler.compile(ir, target='{backend}')` (no normalization, no fusion), run by "
                 "`npu_runtime.Executor` on the {backend} backend",
                 "`IRExecutor` on the minimal IR (the op's reference implementation)"),
}


def readme_text(case: ReproCase, manifest: dict, has_onnx: bool, onnx_note: str | None) -> str:
    """The README. Node, tensor, module and rule names come from a file (the model's IR): each is escaped
    (``markdown.cell``) or in a code span, and on one line, so no name is live markup (``<script>``, a link)
    or ends its line, row or code block. ``case.details`` is Markdown its caller wrote and escaped."""
    faulty, reference = (s.format(rule=code_span(case.rule), backend=case.backend) for s in _RUNS[case.kind])
    lines = [f"# {cell(case.title)}", "", f"Kind: **{case.kind}**"
             + (f", rule {code_span(case.rule)}" if case.rule else "")
             + (f", backend {code_span(case.backend)}" if case.backend else "") + ".", ""]
    if case.details.strip():
        lines += [case.details.strip(), ""]
    lines += ["## The minimal IR", "", *fenced([str(n) for n in case.ir.nodes]), ""]
    for node in case.ir.nodes:
        lines.append(f"- {code_span(node.name)}: {cell(_provenance_text(node))}")
    lines += ["", "## How to run", "", "```", "python repro.py              # the faulty path: exits 1 when it "
              "differs from expected.npz", "python repro.py --reference  # the reference path: exits 0 when it "
              "matches", "```", "", f"- faulty path: {faulty}.", f"- reference path: {reference}.",
              "- exit codes: 0 the values match expected.npz within tolerance, 1 they differ, 2 the path could not "
              "run here (no GPU adapter, onnxruntime missing).", "",
              f"Expected values come from {cell(case.trusted or 'the trusted (last good) stage')}. Tolerances: "
              + (f"rtol={case.rtol}, atol={case.atol}" if case.rtol is not None or case.atol is not None
                 else "the dtype's defaults (torch_ir.verify.tolerance)") + ".",
              "", "It needs only the installed toolkit (torch_ir, npu_compiler, npu_runtime), torch and numpy"
              + (" (and onnxruntime for the reference path)" if has_onnx else "") + ".", ""]
    if case.kind == "frontend" and not has_onnx:
        lines += ["There is no standalone trusted model here" + (f" ({cell(onnx_note)})" if onnx_note else "")
                  + ": the reference path only checks expected.npz, which holds the trusted framework's values.",
                  ""]
    if case.rule_source:
        lines += [f"The rule is imported from {code_span(case.rule_source)}: that module must be importable.", ""]
    lines += _files_section(case, has_onnx)
    widened = [e["name"] for e in manifest["inputs"] + manifest["outputs"] if e["stored"] != e["dtype"]]
    if widened:
        lines += [f"npz has no bfloat16: {cell(', '.join(widened))} are stored as float32 (exactly: every bfloat16 "
                  "is a float32) and `repro.py` casts them back to the dtype in case.json.", ""]
    lines += ["## Inputs and expected outputs", "", "| array | tensor | dtype | shape |", "|---|---|---|---|"]
    lines += [f"| {e['key']} | {cell(e['name'])} | {e['dtype']} | {e['shape']} |"
              for e in manifest["inputs"] + manifest["outputs"]]
    return "\n".join(lines) + "\n"


def _files_section(case: ReproCase, has_onnx: bool) -> list[str]:
    lines = ["## Files", "", "| file | what |", "|---|---|", "| `ir.json` | the minimal IR: only the faulty node(s) |"]
    if case.weights:
        lines.append("| `weights.safetensors` | the weights it reads, by state-dict key |")
    lines += ["| `inputs.npz` | its graph inputs (`input_<i>`, graph order) |",
              "| `expected.npz` | the expected graph outputs (`output_<i>`, graph order) |",
              "| `case.json` | kind, rule, backend, tolerances; each array's tensor name and dtype |"]
    if has_onnx:
        lines.append("| `model.onnx` | the trusted ONNX node(s) alone, run by onnxruntime |")
    return [*lines, "| `repro.py` | runs the faulty or the reference path and compares |", ""]


def _provenance_text(node: OpNode) -> str:
    p = provenance_of(node)
    parts = [f"{node.op_type}, from {', '.join(p.nodes)}"]
    if p.module:
        parts.append(f"module {p.module}")
    if p.origin:
        parts.append(f"made by {p.origin}")
    if p.rules:
        parts.append(f"rules {' -> '.join(p.rules)}")
    return "; ".join(parts)
