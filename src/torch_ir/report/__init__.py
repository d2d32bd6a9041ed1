"""Reports on an IR: statistics, a Mermaid drawing, and one Markdown page with both.

    stats = ir_statistics(ir)
    Path("report.md").write_text(markdown_report(ir, stats, verification=report))
"""

from .markdown import markdown_report
from .mermaid import to_mermaid
from .normalize import normalize_report, normalize_summary
from .stats import IRStats, ir_statistics

__all__ = ["IRStats", "ir_statistics", "markdown_report", "normalize_report", "normalize_summary", "to_mermaid"]
