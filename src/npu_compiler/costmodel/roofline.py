"""The roofline of a costed program: every dispatch a point (FLOPs per DRAM byte, FLOPs per second) under the
hardware's compute and bandwidth roofs, the costliest named. Drawn with matplotlib as a PNG (with the image map
that gives each point its layer on hover in the page), or as plain SVG text without it. Every name is untrusted
text: one plain line, escaped (``html_text``), never parsed as mathtext.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from html import escape
from typing import Any

from .array import _rate
from .costs import CostReport, DispatchCost, plain_line
from .hardware import Hardware

#: Dot colour by bound.
BOUND_COLOURS = {"compute": "#1f77b4", "memory": "#d62728"}
_W, _H = 720, 480  # SVG size
#: How many of the costliest points the roofline names (more would cover each other).
ROOFLINE_LABELS = 5
#: The longest label on the plot: a longer module path keeps its end (the most specific part).
_LABEL_CHARS = 36
_L, _R, _T, _B = 80, 160, 50, 60  # plot margins: left, right (legend), top (title), bottom


def have_matplotlib() -> bool:
    """Whether the roofline can be drawn as PNG (matplotlib imports)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def html_text(value: object) -> str:
    """Untrusted text for HTML or SVG, as element text or inside a quoted attribute: one plain line (no control
    characters, which XML forbids in the SVG), then escaped, quotes included."""
    return escape(plain_line(str(value)), quote=True)


def program_dtype(report: CostReport) -> str:
    """The MAC rate class of the program: the one most of its FLOPs are costed at (int8 when there are none)."""
    weight: dict[str, int] = {}
    for r in report.rows:
        weight[r.dtype] = weight.get(r.dtype, 0) + r.flops
    return max(weight, key=lambda k: weight[k]) if weight else "int8"


def peak_flops(hw: Hardware, dtype: str) -> float:
    """FLOPs per second of the array at ``dtype``'s rate (2 per MAC); the slowest supported rate when ``dtype``
    has none, as the model costs it."""
    rate, _ = _rate(hw, dtype)
    return 2 * hw.pes * rate * hw.clock_mhz * 1e6


def roofline_points(report: CostReport, hw: Hardware) -> list[tuple[DispatchCost, float, float]]:
    """(row, arithmetic intensity in FLOPs per DRAM byte, achieved FLOPs per second) of every dispatch with FLOPs,
    DRAM bytes and cycles."""
    seconds_per_cycle = 1 / (hw.clock_mhz * 1e6)
    return [(r, r.flops / r.dram_bytes, r.flops / (r.cycles * seconds_per_cycle))
            for r in report.rows if r.flops > 0 and r.dram_bytes > 0 and r.cycles > 0]


def _decades(values: Sequence[float]) -> tuple[int, int]:
    lo = math.floor(math.log10(min(values)))
    hi = math.ceil(math.log10(max(values)))
    return lo, max(hi, lo + 1)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _roofs(report: CostReport, hw: Hardware) -> tuple[str, float, float, float, list, list[float]]:
    """What both plots draw: (dtype, peak FLOPs/s, DRAM bytes/s, ridge point, the dispatches' points, the
    x values the axis must hold)."""
    dtype = program_dtype(report)
    peak = peak_flops(hw, dtype)
    bandwidth = hw.dram_bandwidth_gbps * 1e9
    ridge = peak / bandwidth
    points = roofline_points(report, hw)
    return dtype, peak, bandwidth, ridge, points, [p[1] for p in points] + [ridge / 10, ridge * 10]


def roofline_labels(report: CostReport, hw: Hardware, count: int = ROOFLINE_LABELS) -> list[tuple[str, float, float]]:
    """(label, x, y) of the ``count`` costliest points of the roofline, by cycles: each names its dispatch's layer.
    The same layer in every block lands on the same spot, so a spot is named once, with how many more share it
    ("layers.0.mlp (+23 alike)") instead of piling up labels; a point right beside a named one is left unnamed
    (the page still names it on hover)."""
    points = roofline_points(report, hw)
    at: dict[tuple[float, float], list[DispatchCost]] = {}
    for r, x, y in points:
        at.setdefault(_spot(x, y), []).append(r)
    labels: list[tuple[str, float, float]] = []
    named: set[tuple[float, float]] = set()
    for r, x, y in sorted(points, key=lambda p: -p[0].cycles):
        spot = _spot(x, y)
        if len(labels) >= count:
            break
        if not any(_near(spot, other) for other in named):  # a label beside a named dot would cover its label
            named.add(spot)
            alike = len(at[spot]) - 1
            labels.append((_short(r.layer) + (f" (+{alike} alike)" if alike else ""), x, y))
    return labels


def _near(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether labels at the two spots would overlap: a label, drawn to the right of its dot, is about a decade of
    the x axis wide and a fifth of a decade of the y axis high."""
    return abs(a[0] - b[0]) < 1.0 and abs(a[1] - b[1]) < 0.2


def _spot(x: float, y: float) -> tuple[float, float]:
    """Where a point lands on the log-log plot, to a hundredth of a decade."""
    return round(math.log10(x), 2), round(math.log10(y), 2)


def _short(name: str) -> str:
    """A label for the plot: one plain line of at most ``_LABEL_CHARS``, keeping the end of a long path."""
    text = plain_line(name)
    return text if len(text) <= _LABEL_CHARS else "\u2026" + text[-(_LABEL_CHARS - 1):]


def roofline_png(report: CostReport, hw: Hardware, dpi: int = 110) -> bytes:
    """The roofline plot as PNG bytes (``roofline_figure``)."""
    return png_and_spots(report, hw, dpi)[0]


def png_and_spots(report: CostReport, hw: Hardware, dpi: int = 110
                   ) -> tuple[bytes, list[tuple[DispatchCost, float, float]]]:
    """The PNG bytes, and where each dispatch's dot is in the image's pixels (from the top left): the page lays
    an image map over them, so hovering a dot names its layer."""
    fig = roofline_figure(report, hw, dpi)
    fig.canvas.draw()  # fixes the layout: the data-to-pixel transform is then the one savefig uses
    ax = fig.axes[0]
    height = fig.bbox.height
    spots = [(r, float(px), float(height - py))
             for r, x, y in roofline_points(report, hw) for px, py in [ax.transData.transform((x, y))]]
    buffer = io.BytesIO()
    # the figure's own size and dpi, whatever a matplotlibrc says (savefig.bbox = tight, savefig.dpi): the map's
    # pixel coordinates are the figure's
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches=fig.bbox_inches, metadata={"Software": None})
    return buffer.getvalue(), spots


def roofline_figure(report: CostReport, hw: Hardware, dpi: int = 110) -> Any:
    """The roofline as a matplotlib ``Figure`` on the Agg canvas (no display, no pyplot state): the compute and
    bandwidth roofs, one dot per dispatch (with FLOPs and DRAM bytes) coloured by bound, and the costliest few
    named (``roofline_labels``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dtype, peak, bandwidth, ridge, points, xs = _roofs(report, hw)
    x0, x1 = _decades(xs)
    fig = Figure(figsize=(8, 5.3), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    xl, xr = 10.0 ** x0, 10.0 ** x1
    ax.plot([xl, ridge], [bandwidth * xl, peak], color="#2ca02c", lw=2, label=f"bandwidth roof {_fmt(bandwidth)} B/s")
    ax.plot([ridge, xr], [peak, peak], color="#ff7f0e", lw=2, label=f"compute roof {_fmt(peak)} FLOPs/s")
    for bound, colour in BOUND_COLOURS.items():
        mine = [(x, y) for r, x, y in points if r.bound == bound]
        if mine:
            ax.scatter([x for x, _ in mine], [y for _, y in mine], s=18, color=colour, alpha=0.75,
                       label=f"{bound}-bound dispatch ({len(mine)})")
    other = [(x, y) for r, x, y in points if r.bound not in BOUND_COLOURS]
    if other:
        ax.scatter([x for x, _ in other], [y for _, y in other], s=18, color="#7f7f7f", alpha=0.75)
    ax.set_xlim(xl, xr)
    ys = [y for _, _, y in points] + [peak]
    ax.set_ylim(10.0 ** math.floor(math.log10(min(ys + [bandwidth * xl]))), 10.0 ** math.ceil(math.log10(peak * 2)))
    ax.grid(True, which="major", color="#dddddd")
    ax.set_xlabel("arithmetic intensity (FLOPs per DRAM byte)")
    ax.set_ylabel("achieved throughput (FLOPs per second)")
    # names come from the program: never let matplotlib read them as mathtext ($...$)
    ax.set_title(plain_line(f"Roofline: {report.model_name} on {hw.name} ({dtype})"), parse_math=False)
    for label, x, y in roofline_labels(report, hw):
        ax.annotate(label, (x, y), xytext=(6, 2), textcoords="offset points", fontsize=7, color="#333333",
                    parse_math=False)
    legend = ax.legend(loc="lower right", fontsize=8)
    for text in legend.get_texts():
        text.set_parse_math(False)
    fig.tight_layout()
    return fig


def png_img(png: bytes, report: CostReport, hw: Hardware,
             spots: Sequence[tuple[DispatchCost, float, float]] = ()) -> str:
    """An ``<img>`` carrying ``png`` inline (a data URI), so the page stays one self-contained file, with an image
    map of ``spots``: hovering a dot shows its layer, clicking it goes to its row of the per-dispatch table."""
    alt = html_text(f"Roofline of {report.model_name} on {hw.name}")
    areas = "".join(f'<area shape="circle" coords="{x:.0f},{y:.0f},5" href="#dispatch-{r.index}" '
                    f'title="{html_text(_point_title(r))}" alt="{html_text(r.layer)}">' for r, x, y in spots)
    return (f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" '
            f'usemap="#roofline-points"><map name="roofline-points">{areas}</map>')


def png_figure(report: CostReport, hw: Hardware) -> str:
    """The page's roofline as an inline PNG with its image map."""
    png, spots = png_and_spots(report, hw)
    return png_img(png, report, hw, spots)


def _point_title(r: DispatchCost) -> str:
    """What hovering a dispatch's dot says (plain text: the caller escapes it)."""
    return f"{r.layer}: {r.name} ({r.kernel}), {r.cycles:,} cycles, {r.bound}-bound"


_PW, _PH = _W - _L - _R, _H - _T - _B  # the plot area inside the margins


class _LogAxes:
    """The plot area's log-log mapping: the decades [x0, x1] and [y0, y1] onto the frame inside the margins."""

    def __init__(self, x0: int, x1: int, y0: int, y1: int) -> None:
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1

    def px(self, x: float) -> float:
        return _L + (math.log10(x) - self.x0) / (self.x1 - self.x0) * _PW

    def py(self, y: float) -> float:
        return _T + _PH - (math.log10(y) - self.y0) / (self.y1 - self.y0) * _PH


def roofline_svg(report: CostReport, hw: Hardware) -> str:
    """A log-log roofline plot as SVG text: the compute and bandwidth roofs and one dot per dispatch (with FLOPs
    and DRAM bytes), coloured by bound."""
    dtype, peak, bandwidth, ridge, points, xs = _roofs(report, hw)
    ys = [p[2] for p in points] + [peak * 2, min(bandwidth * min(xs), peak) / 2]
    axes = _LogAxes(*_decades(xs), *_decades(ys))
    title = f"Roofline: {report.model_name} on {hw.name} ({dtype})"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
           f'font-family="sans-serif" font-size="11">',
           f"<title>{html_text(title)}</title>",
           f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="white"/>',
           f'<text x="{_W / 2:.1f}" y="24" text-anchor="middle" font-size="14" font-weight="bold">'
           f"{html_text(title)}</text>",
           f'<rect x="{_L}" y="{_T}" width="{_PW}" height="{_PH}" fill="none" stroke="black"/>']
    out += _svg_grid(axes)
    out += _svg_roofs(axes, peak, bandwidth, ridge)
    out += _svg_points(axes, points, roofline_labels(report, hw))
    out += _svg_legend(peak, bandwidth)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _svg_grid(axes: _LogAxes) -> list[str]:
    """Ticks and grid lines at the powers of ten, and the axis titles."""
    out = []
    for e in range(axes.x0, axes.x1 + 1):
        x = axes.px(10.0 ** e)
        out.append(f'<line x1="{x:.1f}" y1="{_T}" x2="{x:.1f}" y2="{_T + _PH}" stroke="#ddd"/>')
        out.append(f'<line x1="{x:.1f}" y1="{_T + _PH}" x2="{x:.1f}" y2="{_T + _PH + 5}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{_T + _PH + 18}" text-anchor="middle">1e{e}</text>')
    for e in range(axes.y0, axes.y1 + 1):
        y = axes.py(10.0 ** e)
        out.append(f'<line x1="{_L}" y1="{y:.1f}" x2="{_L + _PW}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<line x1="{_L - 5}" y1="{y:.1f}" x2="{_L}" y2="{y:.1f}" stroke="black"/>')
        out.append(f'<text x="{_L - 8}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    out.append(f'<text x="{_L + _PW / 2:.1f}" y="{_H - 15}" text-anchor="middle">'
               "arithmetic intensity (FLOPs per DRAM byte)</text>")
    out.append(f'<text x="18" y="{_T + _PH / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 18 {_T + _PH / 2:.1f})">achieved throughput (FLOPs per second)</text>')
    return out


def _svg_roofs(axes: _LogAxes, peak: float, bandwidth: float, ridge: float) -> list[str]:
    """The roofs: bandwidth from the left edge to the ridge point, compute from the ridge to the right edge."""
    px, py = axes.px, axes.py
    xl, xr = 10.0 ** axes.x0, 10.0 ** axes.x1
    bw_start = max(xl, 10.0 ** axes.y0 / bandwidth)
    return [f'<polyline fill="none" stroke="#2ca02c" stroke-width="2" points="{px(bw_start):.1f},'
            f'{py(bandwidth * bw_start):.1f} {px(ridge):.1f},{py(peak):.1f}"/>',
            f'<polyline fill="none" stroke="#ff7f0e" stroke-width="2" points="{px(ridge):.1f},{py(peak):.1f} '
            f'{px(xr):.1f},{py(peak):.1f}"/>']


def _svg_points(axes: _LogAxes, points: Sequence[tuple[DispatchCost, float, float]],
                labels: Sequence[tuple[str, float, float]]) -> list[str]:
    """One dot per dispatch (its hover title says what it is), then the labels of the costliest."""
    out = []
    for r, x, y in points:
        colour = BOUND_COLOURS.get(r.bound, "#7f7f7f")
        out.append(f'<circle cx="{axes.px(x):.1f}" cy="{axes.py(y):.1f}" r="4" fill="{colour}" fill-opacity="0.75">'
                   f"<title>{html_text(_point_title(r))}: {_fmt(x)} FLOPs/byte, {_fmt(y)} FLOPs/s</title></circle>")
    for label, x, y in labels:
        out.append(f'<text class="label" x="{axes.px(x) + 6:.1f}" y="{axes.py(y) - 3:.1f}" font-size="9" '
                   f'fill="#333">{html_text(label)}</text>')
    return out


def _svg_legend(peak: float, bandwidth: float) -> list[str]:
    """The legend right of the plot: the two roofs and the two kinds of dot."""
    legend = [("line", "#ff7f0e", f"compute roof {_fmt(peak)} FLOPs/s"),
              ("line", "#2ca02c", f"bandwidth roof {_fmt(bandwidth)} B/s"),
              ("dot", BOUND_COLOURS["compute"], "compute-bound dispatch"),
              ("dot", BOUND_COLOURS["memory"], "memory-bound dispatch")]
    out = []
    lx = _L + _PW + 12
    for i, (shape, colour, label) in enumerate(legend):
        ly = _T + 10 + 34 * i
        if shape == "line":
            out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 18}" y2="{ly}" stroke="{colour}" stroke-width="2"/>')
        else:
            out.append(f'<rect x="{lx + 5}" y="{ly - 4}" width="8" height="8" rx="4" fill="{colour}"/>')
        words = label.split(" ", 2)
        out.append(f'<text x="{lx + 24}" y="{ly + 4}">{escape(" ".join(words[:2]))}</text>')
        if len(words) > 2:
            out.append(f'<text x="{lx + 24}" y="{ly + 17}">{escape(words[2])}</text>')
    return out


__all__ = ["BOUND_COLOURS", "ROOFLINE_LABELS", "have_matplotlib", "html_text", "peak_flops", "png_and_spots",
           "png_figure", "png_img", "program_dtype", "roofline_figure", "roofline_labels", "roofline_png",
           "roofline_points", "roofline_svg"]
