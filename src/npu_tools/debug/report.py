"""What ``bisect`` found, as data (``BisectReport``) and as text, Markdown, HTML and JSON.

``write(out_dir)`` leaves ``report.json`` (everything, for tools), ``report.md`` and ``report.html`` (for people)
and the per-layer error plot (``error.png``, or ``error.svg`` without matplotlib) in ``out_dir``.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_ir.fileio import atomic_write
from torch_ir.report.cells import one_line
from torch_ir.report.markdown import cell
from torch_ir.verify.compare import TABLE_HEADER, TensorDiff
from torch_ir.verify.result import md_table, text_table

from .drift import Verdict
from .subject import WeightsUsed


@dataclass
class StageRow:
    """One stage compared with the trusted source's outputs."""

    name: str
    ok: bool | None  # None: the stage did not run (skipped) or failed to run (error)
    max_abs: float = 0.0
    max_rel: float = 0.0
    seconds: float = 0.0
    skipped: str | None = None
    error: str | None = None
    outputs: list[TensorDiff] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.skipped:
            return "skipped"
        if self.error:
            return "error"
        return "ok" if self.ok else "DIVERGES"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "ok": self.ok, "max_abs": _f(self.max_abs),
                "max_rel": _f(self.max_rel), "seconds": round(self.seconds, 4), "skipped": self.skipped,
                "error": self.error, "outputs": [_diff(d) for d in self.outputs]}


@dataclass
class Finding:
    """The broken thing, named as precisely as the stage allows.

    ``kind``: "frontend" (a converter or mapping of the extracted IR), "rule" (a rewrite rule application),
    "kernel" (a kernel of a backend, wrong on its actual inputs), "lowering" (the dispatch's kernel is right on
    what it was given, so the lowering or the memory plan gave it wrong inputs or parameters), "partition"
    (a partition of the DAG), "drift" (no single fault: see the verdict) or "stage" (the stage diverges but its
    intermediate values cannot be aligned with the reference).
    """

    kind: str
    stage: str
    title: str
    node: str | None = None
    op: str | None = None
    dispatch: int | None = None
    kernel: str | None = None
    implementation: str | None = None  # the kernel table's implementation of the kernel on the backend
    backend: str | None = None
    rule: str | None = None
    rule_family: str | None = None
    rule_module: str | None = None
    application: int | None = None  # 1-based: the rule application of the stage after which it diverges
    applications: int | None = None  # how many the stage makes in all
    root: str | None = None  # the root node of that application (in the IR before it)
    converter: str | None = None  # the provenance origin: frontend converter / mapping / torch.export
    module: str | None = None
    provenance: dict[str, Any] | None = None
    group: list[str] = field(default_factory=list)  # the nodes of the repro's minimal IR
    inputs: list[TensorDiff] = field(default_factory=list)
    outputs: list[TensorDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # the title quotes node names read from a file; it is one line wherever it is shown (a repro's README
        # heading, a progress line), so a name with a newline cannot end it or start a heading of its own
        self.title = one_line(self.title)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in vars(self).items() if k not in ("inputs", "outputs")}
        data["inputs"] = [_diff(d) for d in self.inputs]
        data["outputs"] = [_diff(d) for d in self.outputs]
        return data


@dataclass
class BisectReport:
    """Which weights were used, the stage table, the first stage that diverges, the finding in it, the
    drift-or-fault verdict, the repro directory and the report files."""

    subject: str
    trusted: str
    rtol: float | None
    atol: float | None
    weights: WeightsUsed | None = None  # None: not known (a report made by hand)
    stages: list[StageRow] = field(default_factory=list)
    first_bad: str | None = None
    finding: Finding | None = None
    verdict: Verdict | None = None
    repro: Path | None = None
    seconds: float = 0.0
    files: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No stage diverges."""
        return self.first_bad is None

    def summary(self) -> str:
        """The stage table and what was found, as plain text."""
        lines = [f"bisect {self.subject!r} against {self.trusted} "
                 f"(rtol={_tol(self.rtol)}, atol={_tol(self.atol)}): {self.seconds:.1f} s",
                 f"weights: {one_line(self.weights_text)}"]
        lines += _table(["stage", "status", "max abs err", "max rel err", "seconds"],
                        [[r.name, r.status + (f" ({r.skipped or r.error})" if r.skipped or r.error else ""),
                          _num(r.max_abs), _num(r.max_rel), f"{r.seconds:.2f}"] for r in self.stages])
        if self.first_bad is None:
            lines.append("no stage diverges beyond tolerance")
            return "\n".join(lines)
        lines.append(f"first stage that diverges: {self.first_bad}")
        if self.finding is not None:
            lines.append(f"finding ({self.finding.kind}): {self.finding.title}")
            lines += [f"  {k}: {v}" for k, v in _finding_fields(self.finding)]
            lines += [f"  note: {n}" for n in self.finding.notes]
            for title, diffs in (("inputs", self.finding.inputs), ("outputs", self.finding.outputs)):
                if diffs:
                    lines.append(f"  {title}:")
                    lines += text_table(diffs, "tensor", indent=4)
        if self.verdict is not None:
            lines.append(f"verdict: {self.verdict.text}")
        if self.repro is not None:
            lines.append(f"repro: {self.repro} (python {self.repro / 'repro.py'}; --reference runs the reference)")
        return "\n".join(lines)

    @property
    def weights_text(self) -> str:
        return self.weights.text if self.weights is not None else "not recorded"

    def _weights_markup(self, as_path: Callable[[str], str], as_text: Callable[[str], str]) -> str:
        """The weights as a report shows them: a file's path as code, a description as text (each escaped)."""
        if self.weights is not None and self.weights.path is not None:
            return as_path(self.weights.path)
        return as_text(self.weights_text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject, "trusted": self.trusted, "rtol": self.rtol, "atol": self.atol,
            "weights": self.weights.to_dict() if self.weights is not None else None,
            "seconds": round(self.seconds, 3), "ok": self.ok, "first_bad": self.first_bad,
            "stages": [r.to_dict() for r in self.stages],
            "finding": self.finding.to_dict() if self.finding else None,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "repro": str(self.repro) if self.repro else None,
            "files": [str(p) for p in self.files],
        }

    def markdown(self, plot_name: str | None = None) -> str:
        """The report as Markdown; every name read from a file is escaped (``cell``) or in a code span."""
        lines = [f"# bisect: {cell(self.subject)}", "", f"Trusted source: {cell(self.trusted)}. Weights: "
                 f"{self._weights_markup(code_span, cell)}. Tolerance: rtol={_tol(self.rtol)}, atol={_tol(self.atol)}. "
                 f"Time: {self.seconds:.1f} s.", "",
                 "| stage | status | max abs err | max rel err | seconds |", "|---|---|---:|---:|---:|"]
        for r in self.stages:
            why = f" ({r.skipped or r.error})" if r.skipped or r.error else ""
            lines.append(f"| {r.name} | {r.status}{cell(why)} | {_num(r.max_abs)} | {_num(r.max_rel)} "
                         f"| {r.seconds:.2f} |")
        lines.append("")
        if self.first_bad is None:
            lines.append("No stage diverges beyond tolerance.")
            return "\n".join(lines) + "\n"
        lines += [f"**First stage that diverges: {self.first_bad}**", ""]
        if self.finding is not None:
            lines += [f"## Finding ({self.finding.kind})", "", cell(self.finding.title), ""]
            lines += [f"- {k}: {code_span(v)}" for k, v in _finding_fields(self.finding)]
            lines += [f"- note: {cell(n)}" for n in self.finding.notes]
            for title, diffs in (("Inputs", self.finding.inputs), ("Outputs", self.finding.outputs)):
                if diffs:
                    lines += ["", f"{title}:", "", *md_table(diffs, "tensor")]
            lines.append("")
        if self.verdict is not None:
            lines += ["## Drift or fault", "", cell(self.verdict.text), ""]
            if plot_name:
                lines += [f"![per-layer error]({plot_name})", ""]
        if self.repro is not None:
            lines += ["## Repro", "", f"{code_span(self.repro)}: `python repro.py` runs the faulty path (exit 1 while "
                      "the fault is there), `python repro.py --reference` the reference path (exit 0).", ""]
        return "\n".join(lines) + "\n"

    def html(self, plot_name: str | None = None) -> str:
        """A one-page HTML report: the Markdown's content as HTML tables and paragraphs, the plot inline."""
        rows = "".join(
            f"<tr class='{r.status.lower()}'><td>{_h(r.name)}</td><td>{_h(r.status)}"
            f"{_h(' (' + (r.skipped or r.error or '') + ')') if r.skipped or r.error else ''}</td>"
            f"<td>{_num(r.max_abs)}</td><td>{_num(r.max_rel)}</td><td>{r.seconds:.2f}</td></tr>" for r in self.stages)
        body = [f"<h1>bisect: {_h(self.subject)}</h1>",
                f"<p>Trusted source: {_h(self.trusted)}. Weights: "
                f"{self._weights_markup(lambda p: f'<code>{_h(p)}</code>', _h)}. "
                f"Tolerance: rtol={_tol(self.rtol)}, atol={_tol(self.atol)}. Time: {self.seconds:.1f} s.</p>",
                "<table><tr><th>stage</th><th>status</th><th>max abs err</th><th>max rel err</th><th>seconds</th></tr>"
                f"{rows}</table>"]
        if self.first_bad is None:
            body.append("<p>No stage diverges beyond tolerance.</p>")
        else:
            body.append(f"<p><b>First stage that diverges: {_h(self.first_bad)}</b></p>")
        if self.finding is not None:
            items = "".join(f"<li>{_h(k)}: <code>{_h(str(v))}</code></li>" for k, v in _finding_fields(self.finding))
            items += "".join(f"<li>note: {_h(n)}</li>" for n in self.finding.notes)
            body += [f"<h2>Finding ({_h(self.finding.kind)})</h2>", f"<p>{_h(self.finding.title)}</p>",
                     f"<ul>{items}</ul>"]
            for title, diffs in (("Inputs", self.finding.inputs), ("Outputs", self.finding.outputs)):
                if diffs:
                    head = "".join(f"<th>{_h(c)}</th>" for c in TABLE_HEADER)
                    trs = "".join("<tr>" + "".join(f"<td>{_h(c)}</td>" for c in d.cells()) + "</tr>" for d in diffs)
                    body.append(f"<h3>{title}</h3><table><tr>{head}</tr>{trs}</table>")
        if self.verdict is not None:
            body += ["<h2>Drift or fault</h2>", f"<p>{_h(self.verdict.text)}</p>"]
            if plot_name:
                body.append(f"<img src='{_h(plot_name)}' alt='per-layer error'>")
        if self.repro is not None:
            body.append(f"<h2>Repro</h2><p><code>{_h(str(self.repro))}</code>: <code>python repro.py</code> runs the "
                        "faulty path, <code>python repro.py --reference</code> the reference path.</p>")
        style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
                 "td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}tr.diverges td{background:#fdd}"
                 "tr.ok td:nth-child(2){color:#060}img{max-width:100%}")
        return (f"<!doctype html><html><head><meta charset='utf-8'><title>bisect {_h(self.subject)}</title>"
                f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write report.json, report.md, report.html and the plot into ``out_dir``; returns the paths.

        Each file is written atomically, and an entry of ``out_dir`` that is a link or a special file is refused
        (``npu_tools.debug.outdir``): nothing is written through a link planted there."""
        from .drift import plot
        from .outdir import REPORT_FILES, check_entry, check_inside

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name in REPORT_FILES:  # all before the first write: a planted link leaves no half-written report
            check_entry(out / name, "file")
        files: list[Path] = []
        plot_name = None
        if self.verdict is not None and self.verdict.layers:
            tolerance = self.rtol if self.rtol is not None else None
            picture = plot(self.verdict, out / "error.png", title=f"{self.subject}: {self.first_bad}",
                           tolerance=tolerance)
            files.append(picture)
            plot_name = picture.name
        self.files = [*files, out / "report.md", out / "report.html", out / "report.json"]
        texts = {"report.md": self.markdown(plot_name), "report.html": self.html(plot_name),
                 "report.json": json.dumps(self.to_dict(), indent=1, default=str) + "\n"}
        for name, text in texts.items():
            check_inside(out, out / name)
            atomic_write(out / name, text, what=f"bisect {name}")
        return self.files


def _finding_fields(f: Finding) -> list[tuple[str, Any]]:
    names = ("node", "op", "dispatch", "kernel", "implementation", "backend", "rule", "rule_family", "rule_module",
             "root", "converter", "module")
    out = [(n, getattr(f, n)) for n in names if getattr(f, n) is not None]
    if f.application is not None:
        out.append(("application", f"{f.application} of {f.applications}"))
    if f.provenance:
        out.append(("provenance", ", ".join(f"{k}={v}" for k, v in f.provenance.items() if v)))
    if f.group:
        more = f" and {len(f.group) - 12} more" if len(f.group) > 12 else ""
        out.append(("repro nodes", ", ".join(f.group[:12]) + more))
    return out


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*map(str, r)) for r in rows]


def _diff(d: TensorDiff) -> dict[str, Any]:
    return {k: (_f(v) if isinstance(v, float) else v) for k, v in vars(d).items()}


def _f(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def _num(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def _tol(v: float | None) -> str:
    return "dtype default" if v is None else f"{v:g}"


def code_span(value: Any) -> str:
    """``value`` as a Markdown code span, outside tables (in a table cell use ``markdown.cell``): nothing is
    markup inside one, but a backtick would end it and a line break could start a new block (a heading, a
    fence), so both are replaced."""
    return "`" + one_line(str(value)).replace("`", "'") + "`"


def fenced(lines: list[str]) -> list[str]:
    """``lines`` as a fenced Markdown code block that none of them can close: each on one line, and the fence
    longer than any run of backticks in them."""
    body = [one_line(line) for line in lines]
    longest = max((len(run) for line in body for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *body, fence]


def _h(text: str) -> str:
    return html.escape(str(text))


__all__ = ["BisectReport", "Finding", "StageRow", "code_span", "fenced"]
