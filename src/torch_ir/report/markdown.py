"""One Markdown page about an IR: interface, statistics, op histogram, graph, verification."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import NPU_IR, TensorMeta
from .mermaid import to_mermaid
from .stats import IRStats, ir_statistics

if TYPE_CHECKING:  # the verifier imports the executor; a report without verification needs neither
    from ..verify import VerificationReport


def markdown_report(ir: NPU_IR, stats: IRStats | None = None,
                    verification: VerificationReport | None = None, *, max_nodes: int = 200) -> str:
    """A Markdown page: model, producer, inputs/outputs, statistics, op histogram, Mermaid graph.

    Example::

        ok, check = verify_ir(ir, "model.safetensors", model, (x,))
        Path("report.md").write_text(markdown_report(ir, verification=check))

    ``stats`` defaults to ``ir_statistics(ir)``. With a failed ``verification`` the first diverging
    node is highlighted in the graph.
    """
    stats = stats or ir_statistics(ir)
    sections = [
        _header(ir),
        _tensor_section("Inputs", ir.graph_inputs),
        _tensor_section("Outputs", ir.graph_outputs),
        _symbols_section(ir),
        _table_section("Statistics", ["quantity", "value"], stats.summary_rows()),
        _table_section("Op histogram", ["op", "count"], [(op, str(n)) for op, n in stats.op_histogram.items()]),
        _graph_section(ir, verification, max_nodes),
        verification.to_markdown() if verification is not None else "",
    ]
    return "\n".join(s for s in sections if s)


def _header(ir: NPU_IR) -> str:
    producer = ", ".join(f"{k} {v}" for k, v in ir.producer.items()) or "unknown"
    return f"# IR report: {cell(ir.model_name)}\n\nProducer: {cell(producer)}\n"


def _tensor_section(title: str, tensors: list[TensorMeta]) -> str:
    rows = [(t.name, "[" + ", ".join(str(d) for d in t.shape) + "]", t.dtype, t.role or "") for t in tensors]
    return _table_section(title, ["name", "shape", "dtype", "role"], rows)


def _symbols_section(ir: NPU_IR) -> str:
    if not ir.symbols:
        return ""
    rows = [(name, _bound(r.get("min")), _bound(r.get("max"))) for name, r in ir.symbols.items()]
    return _table_section("Symbols", ["symbol", "min", "max"], rows)


def _bound(value: int | None) -> str:
    return "unbounded" if value is None else str(value)


def _graph_section(ir: NPU_IR, verification: VerificationReport | None, max_nodes: int) -> str:
    loc = verification.localization if verification is not None else None
    highlight = [loc.node] if loc is not None and loc.node else []
    return f"## Graph\n\n```mermaid\n{to_mermaid(ir, max_nodes, highlight=highlight)}\n```\n"


def _table_section(title: str, header: list[str], rows: list[tuple[str, ...]]) -> str:
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    """Text safe in a table cell or a heading: a pipe would split the cell, ``*`` (``2*s0``) would
    emphasize, ``<`` would open HTML, ``[x](javascript:...)`` would be a live link, a newline would end the
    row. Underscores are left alone, as GitHub does not emphasize inside words."""
    for ch in "\\|*`<>[]":
        text = text.replace(ch, "\\" + ch)
    return " ".join(text.splitlines())
