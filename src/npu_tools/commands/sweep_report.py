"""``torch-ir sweep-report DIR``: the plots of a sweep (``torch-ir sweep -o DIR``) from its ``results.csv``: per
model, the Pareto fronts (latency vs. area proxy, vs. SRAM, accuracy vs. latency by precision) and latency heat maps
over two hardware axes as PNGs, and ``report.html`` embedding them with the tables (``npu_tools.sweep.plots``).

Run it while a sweep is still going, or after it stopped: it reads the rows written so far.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from npu_tools import cli_options as options


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``sweep-report`` subcommand to ``sub``."""
    p = sub.add_parser("sweep-report", help="Pareto fronts and heat maps of a sweep's results, as PNGs and one HTML "
                                            "page")
    p.add_argument("results", metavar="DIR", help="the directory torch-ir sweep -o wrote (or its results.csv)")
    options.output(p, "the directory for report.html and the PNGs (default: DIR)", directory=True)
    p.add_argument("--axes", metavar="X,Y", default=None,
                   help="the heat maps' two hardware axes, of array, sram_kib, dram_gbps, clock_mhz, hw (default: the "
                        "first two that vary)")
    p.set_defaults(func=cmd_sweep_report)


def _axes(text: str | None) -> list[str] | None:
    from npu_tools.sweep.grid import SweepError
    from npu_tools.sweep.plots import HW_AXES

    if text is None:
        return None
    axes = [a.strip() for a in text.split(",")]
    if len(axes) != 2 or len(set(axes)) != 2 or any(a not in HW_AXES for a in axes):
        raise SweepError(f"--axes {text}: two different hardware columns, X,Y; fix: pick two of "
                         f"{', '.join(HW_AXES)} (e.g. --axes array,sram_kib)")
    return axes


def cmd_sweep_report(args: argparse.Namespace) -> int:
    from npu_tools.sweep.plots import NO_MATPLOTLIB, have_matplotlib, read_results, write_report
    from torch_ir.fileio import make_output_dir

    axes = _axes(args.axes)
    source = Path(args.results)
    results = source / "results.csv" if source.is_dir() else source
    rows = read_results(results)
    out = make_output_dir(args.output or results.parent, "sweep report directory")
    written = write_report(rows, out, title=f"Design-space sweep: {results}", axes=axes)
    failed = sum(r.get("status") != "ok" for r in rows)
    print(f"{len(rows)} points ({failed} failed) from {results}")
    if not have_matplotlib():
        print(NO_MATPLOTLIB)
    print(f"wrote: {', '.join(str(p) for p in written)}")
    return 0
