"""The normalization report: node counts by op type before and after, the fusions applied and the
ones rejected (with the reason), the NPU op histogram and a Mermaid graph of the normalized IR.

It reads ``ir.metadata["normalize"]``, which ``npu_compiler.passes.pipeline`` writes, so it works on a
normalized IR loaded from a file as well.
"""

from __future__ import annotations

from typing import Any

from ..ir import NPU_IR
from ..ops.npu import NPU_OPS
from .markdown import cell
from .mermaid import to_mermaid


def normalize_summary(ir: NPU_IR) -> str:
    """A few lines for a terminal: node counts, fusions applied, rejections."""
    info = _info(ir)
    applied = _applied(info)
    lines = [f"{ir.model_name}: {info['nodes_before']} nodes -> {info['nodes_after']} nodes"]
    lines.append("applied: " + (", ".join(f"{k} x{v}" for k, v in applied.items()) or "nothing"))
    rejected = _rejected(info)
    lines.append(f"rejected: {len(rejected)}" + (" (see the report for reasons)" if rejected else ""))
    npu = {k: v for k, v in info["ops_after"].items() if k in NPU_OPS}
    lines.append("NPU ops: " + (", ".join(f"{k} {v}" for k, v in npu.items()) or "none"))
    return "\n".join(lines)


def normalize_report(ir: NPU_IR, *, max_nodes: int = 200) -> str:
    """One Markdown page about a normalized IR."""
    info = _info(ir)
    ops = sorted(set(info["ops_before"]) | set(info["ops_after"]),
                 key=lambda op: (-info["ops_after"].get(op, 0), -info["ops_before"].get(op, 0), op))
    lines = [f"# Normalization of `{ir.model_name}`", "",
             f"{info['nodes_before']} nodes before, {info['nodes_after']} after.", "",
             "## Nodes by op type", "", "| op | before | after |", "|---|---|---|"]
    lines += [f"| `{op}` | {info['ops_before'].get(op, 0)} | {info['ops_after'].get(op, 0)} |" for op in ops]
    lines += ["", "## Stages", "", "| stage | nodes after | rules applied | seconds |", "|---|---|---|---|"]
    for st in info["stages"]:
        applied = ", ".join(f"{k} x{v}" for k, v in st["applied"].items()) or "-"
        lines.append(f"| {st['stage']} | {st['nodes']} | {cell(applied)} | {st['seconds']} |")
    rejected = _rejected(info)
    lines += ["", "## Fusions rejected", ""]
    if rejected:
        lines += ["| rule | node | reason |", "|---|---|---|"]
        lines += [f"| {r} | `{n}` | {cell(why)} |" for r, n, why in rejected]
    else:
        lines.append("None.")
    lines += ["", "## Normalized graph", "", "```mermaid", to_mermaid(ir, max_nodes), "```", ""]
    return "\n".join(lines)


def _info(ir: NPU_IR) -> dict[str, Any]:
    info = ir.metadata.get("normalize")
    if info is None:
        raise ValueError(f"IR {ir.model_name!r} was not normalized (no metadata['normalize']); "
                         "run npu_compiler.passes.normalize(ir) or `torch-ir normalize` first")
    return info


def _applied(info: dict[str, Any]) -> dict[str, int]:
    total: dict[str, int] = {}
    for st in info["stages"]:
        for rule, n in st["applied"].items():
            total[rule] = total.get(rule, 0) + n
    return total


def _rejected(info: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [tuple(r) for st in info["stages"] for r in st["rejected"]]
