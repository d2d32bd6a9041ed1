"""Names from a file made harmless in the reports that show them.

A node, tensor or model name is read from an untrusted file and shown in CSV, Markdown and HTML reports. In
each of those a name can be markup: ``=HYPERLINK(...)`` is a live formula when a spreadsheet opens a CSV
cell, ``<script>`` runs in a Markdown preview or an HTML page, and a newline ends a table row. Markdown goes
through :func:`torch_ir.report.markdown.cell`, HTML through :func:`html.escape`, CSV through :func:`csv_cell`.
"""

from __future__ import annotations

from typing import Any

#: What a spreadsheet reads as the start of a formula (OWASP's list for CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """``value`` for a CSV cell: a string a spreadsheet would evaluate gets a leading ``'`` (shown, not
    evaluated), and newlines become spaces; numbers and None are kept as they are."""
    if not isinstance(value, str):
        return value
    text = one_line(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def one_line(text: str) -> str:
    """``text`` on one line: every line break (``\\n``, ``\\r``, ``\\u2028``, ...) becomes a space."""
    return " ".join(text.splitlines()) if text else text


__all__ = ["FORMULA_STARTS", "csv_cell", "one_line"]
