"""The verification report and its two renderings, plain text and Markdown."""

from __future__ import annotations

from dataclasses import dataclass

from ..report.markdown import cell
from .compare import TABLE_HEADER, TensorDiff
from .localize import Localization


@dataclass
class VerificationReport:
    """The verdict, each output's errors, and (on failure) where the IR first departs from the model.

    Example::

        ok, report = verify_ir(ir, "model.safetensors", model, (x,))
        print(report)                  # plain text
        Path("r.md").write_text(report.to_markdown())
    """

    model_name: str
    ok: bool
    outputs: list[TensorDiff]
    note: str | None = None  # a failure no output row shows (e.g. a different number of outputs)
    localization: Localization | None = None

    def to_text(self) -> str:
        lines = [f"Verification of IR {self.model_name!r}: {_verdict(self.ok)}"]
        if self.note:
            lines.append(f"  {self.note}")
        lines += text_table(self.outputs, "output")
        if self.localization is not None:
            lines += _localization_text(self.localization)
        return "\n".join(lines)

    __str__ = to_text

    def to_markdown(self) -> str:
        lines = [f"## Verification: {_verdict(self.ok)}", ""]
        if self.note:
            lines += [cell(self.note), ""]
        lines += md_table(self.outputs, "output")
        if self.localization is not None:
            lines += ["", *_localization_md(self.localization)]
        return "\n".join(lines) + "\n"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _localization_text(loc: Localization) -> list[str]:
    lines = []
    if loc.sources:
        lines += ["Weights or inputs that differ from the model's:", *text_table(loc.sources, "tensor")]
    if loc.node is None:
        return lines + [f"Localization: {loc.note}"]
    lines.append(f"First diverging node: {loc.node} ({loc.op_type}); {loc.diverging} of {loc.compared} nodes differ")
    if loc.module:
        lines.append(f"  traced in module {loc.module}")
    lines.append(f"  {loc.node_text}")
    lines += ["  its inputs:", *text_table(loc.inputs, "input", indent=4)]
    lines += ["  its outputs:", *text_table(loc.outputs, "output", indent=4)]
    return lines


def _localization_md(loc: Localization) -> list[str]:
    lines = ["### Localization", ""]
    if loc.sources:
        lines += ["Weights or inputs that differ from the model's:", "", *md_table(loc.sources, "tensor"), ""]
    if loc.node is None:
        return lines + [cell(loc.note or "")]
    lines += [
        f"First diverging node: `{loc.node}` (`{loc.op_type}`); {loc.diverging} of {loc.compared} nodes differ"
        + (f"; traced in module `{loc.module}`" if loc.module else "") + ".",
        "", "```", loc.node_text or "", "```", "", "Its inputs:", "", *md_table(loc.inputs, "input"),
        "", "Its outputs:", "", *md_table(loc.outputs, "output"),
    ]
    return lines


def text_table(diffs: list[TensorDiff], first: str, indent: int = 2) -> list[str]:
    """The diffs as an aligned text table, its first column headed ``first``."""
    rows = [[first, *TABLE_HEADER[1:]], *(d.cells() for d in diffs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]  # the last column is not padded
    pad = " " * indent
    return [pad + "  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip() for r in rows]


def md_table(diffs: list[TensorDiff], first: str) -> list[str]:
    """The diffs as a Markdown table, its first column headed ``first``."""
    header = [first, *TABLE_HEADER[1:]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in d.cells()) + " |" for d in diffs]
    return lines

