"""``torch-ir compile MODEL --report-dynamic SYMBOL --lengths ...``: what serving a dynamic dimension costs, per
bucket and per bucket set, for the lengths a model actually serves (``npu_compiler.dynamic_report``). Prints the
table and writes ``dynamic_report.csv`` and the PNGs (with matplotlib) into ``--report-dir``.

    torch-ir compile bert.json --report-dynamic seq --lengths served.txt --bind batch=1 \\
        --buckets seq=128,256,512 --memory-cap 8MiB --max-buckets 3
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from npu_compiler.dynamic_report import DEFAULT_HW
from npu_tools.commands.compile_dynamic import parse_buckets
from npu_tools.commands.import_onnx import UsageError

if TYPE_CHECKING:
    from torch_ir.ir import NPU_IR

#: The report's files in ``--report-dir``, beside the PNGs of ``npu_compiler.dynamic_plot``.
CSV_NAME = "dynamic_report.csv"
_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_LIST = re.compile(r"\d+(,\d+)*")
_REPORT_FLAGS = ("lengths", "memory_cap", "max_buckets", "report_dir", "hw")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The report's flags, on ``torch-ir compile``."""
    group = parser.add_argument_group("dynamic-shape report (instead of a program)")
    group.add_argument("--report-dynamic", metavar="SYMBOL",
                       help="report arena bytes, padded compute and cost-model latency per bucket of SYMBOL (e.g. "
                            "seq) and per bucket set, for the --lengths served, and suggest a bucket set; writes "
                            "no program")
    group.add_argument("--lengths", metavar="LIST_OR_FILE",
                       help="the observed lengths: a comma list (8,16,300) or a file with one length per line, or "
                            "CSV lines length,count")
    group.add_argument("--memory-cap", metavar="BYTES",
                       help="the suggested set's shared arena at most this (bytes, or with KiB, MiB, GiB)")
    group.add_argument("--max-buckets", type=int, default=None, metavar="N",
                       help="the suggested set has at most N buckets (default: 4)")
    group.add_argument("--hw", default=None, metavar="HARDWARE",
                       help=f"cost-model preset or hardware file to cost on (default: {DEFAULT_HW})")
    group.add_argument("--report-dir", metavar="DIR", help="where the CSV and PNGs go (default: <model>_dynamic/)")


def wants_report(args: argparse.Namespace) -> bool:
    """Whether the command line asks for the report (or gave one of its flags, refused without it)."""
    return bool(args.report_dynamic) or any(getattr(args, f, None) is not None for f in _REPORT_FLAGS)


def run_report(args: argparse.Namespace, ir: NPU_IR) -> int:
    """Run the report for ``torch-ir compile`` (flags checked first, then compile and cost every size)."""
    from npu_compiler.costmodel.roofline import have_matplotlib
    from npu_compiler.dynamic_plot import INSTALL
    from npu_compiler.dynamic_report import bucket_report
    from npu_tools.commands.compile import _parse_bind
    from torch_ir.naming import default_output

    symbol = _check_flags(args)
    lengths = parse_lengths(args.lengths)
    buckets = parse_buckets(args.buckets)
    if set(buckets) - {symbol}:
        other = sorted(set(buckets) - {symbol})[0]
        raise UsageError(f"--buckets {other}=...: the report varies {symbol} (--report-dynamic {symbol}); fix: give "
                         f"--buckets {symbol}=S1,S2,... or fix {other} with --bind {other}=N")
    cap = parse_bytes(args.memory_cap) if args.memory_cap is not None else None
    directory = Path(args.report_dir) if args.report_dir else default_output(ir.model_name, "_dynamic")
    _prepare(directory)
    report = bucket_report(ir, symbol, lengths, buckets=buckets.get(symbol), bind=_parse_bind(args.bind),
                           memory_cap=cap, max_buckets=4 if args.max_buckets is None else args.max_buckets,
                           target=args.target, hw=args.hw or DEFAULT_HW,
                           progress=lambda line: print(line, file=sys.stderr))
    print("\n".join(report.table()))
    print(f"wrote {report.to_csv(directory / CSV_NAME)}")
    if have_matplotlib():
        for path in report.plot(directory):
            print(f"wrote {path}")
    else:
        print(f"note: no plots: matplotlib is not installed; fix: {INSTALL}")
    return 0


def _check_flags(args: argparse.Namespace) -> str:
    """The symbol; the report's flags without --report-dynamic, or flags that make a program, are refused."""
    if not args.report_dynamic:
        given = next(f for f in _REPORT_FLAGS if getattr(args, f, None) is not None)
        raise UsageError(f"--{given.replace('_', '-')} is a flag of the dynamic-shape report; fix: add "
                         "--report-dynamic SYMBOL (e.g. --report-dynamic seq), or leave it out")
    if args.lengths is None:
        raise UsageError(f"--report-dynamic {args.report_dynamic} needs the observed lengths; fix: --lengths "
                         "8,16,300 or --lengths FILE (one length per line, or length,count lines)")
    if args.output:
        raise UsageError("--output: --report-dynamic writes a report, not a program; fix: --report-dir DIR for "
                         "the report's files, or compile without --report-dynamic")
    if args.max_buckets is not None and args.max_buckets < 1:
        raise UsageError(f"--max-buckets {args.max_buckets}: give a whole number >= 1")
    return args.report_dynamic


def _prepare(directory: Path) -> None:
    """Make ``directory`` (or refuse it) before compiling anything."""
    from torch_ir.fileio import check_output_path

    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--report-dir {directory}: exists and is not a directory; fix: give a directory")
    directory.mkdir(parents=True, exist_ok=True)
    check_output_path(directory / CSV_NAME, "dynamic-shape report CSV")


def parse_bytes(text: str) -> int:
    """``"8MiB"`` -> ``8388608``: a whole number of bytes with an optional KiB, MiB or GiB suffix."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS or int(match.group(1)) < 1:
        raise UsageError(f"--memory-cap {text!r}: expected a positive whole number of bytes, optionally with KiB, "
                         "MiB or GiB (e.g. --memory-cap 8MiB)")
    return int(match.group(1)) * _UNITS[unit]


def parse_lengths(value: str) -> dict[int, int]:
    """``--lengths``: a comma list (``8,16,300``) or a file of one length per line or ``length,count`` lines
    (blank lines, ``#`` comments and a header line without digits are passed over) -> ``{length: count}``."""
    if _LIST.fullmatch(value.strip()):
        return _count(int(n) for n in value.split(","))
    path = Path(value)
    if not path.exists():
        raise UsageError(f"--lengths {value!r}: neither a comma list of whole numbers (e.g. --lengths 8,16,300) nor "
                         "an existing file")
    from torch_ir.fileio import read_input

    text = read_input(path, "lengths file").decode("utf-8", errors="replace")
    counts: dict[int, int] = {}
    header = True  # until the first line with content: a line of words there is a header
    for number, line in enumerate(text.splitlines(), 1):
        fields = [f.strip() for f in line.split("#", 1)[0].split(",")]
        if fields == [""]:
            continue
        if header and not any(c.isdigit() for f in fields for c in f):
            header = False
            continue
        header = False
        if len(fields) > 2 or not all(f.isdigit() for f in fields):
            raise UsageError(f"--lengths {path}:{number}: expected a whole length or 'length,count', got "
                             f"{line.strip()[:80]!r}")
        counts[int(fields[0])] = counts.get(int(fields[0]), 0) + (int(fields[1]) if len(fields) == 2 else 1)
    if not counts:
        raise UsageError(f"--lengths {path}: no lengths in the file; fix: one length per line, or length,count lines")
    return counts


def _count(values: object) -> dict[int, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts


__all__ = ["CSV_NAME", "add_arguments", "parse_bytes", "parse_lengths", "run_report",
           "wants_report"]
