"""``torch-ir sweep``: cost every model on every hardware point at every precision (and measure the accuracy of the
quantized ones) into one table, ``DIR/results.csv``: ``npu_tools.sweep`` (docs/sweep.md).

    torch-ir sweep --models resnet,bert,./Qwen2.5-0.5B/config.json --hw presets/*.toml \\
        --grid array=16x16,32x32,64x64 sram_kib=256,1024 --precision fp16,w8a8,w4a16 -o sweep/

Bad flags (an unknown grid parameter, a value that is not a number, an unknown precision, a hardware file that does
not exist, no model) are refused before any work, each with one line naming the flag; a bad *point* (a grid value
out of the hardware file's range, a model that fails to load, a precision the hardware has no MACs for) is a failed
row with its reason, and the sweep goes on.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from npu_tools import cli_options as options


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``sweep`` subcommand to ``sub``."""
    from npu_compiler.costmodel.hardware import presets
    from npu_compiler.costmodel.precision import PRECISIONS
    from npu_tools.sweep.grid import GRID_DOCS

    p = sub.add_parser("sweep", help="cost models x hardware x precisions (accuracy of the quantized ones) into one "
                                     "table, locally or on Ray; resumes an interrupted sweep")
    p.add_argument("--models", required=True, metavar="M1,M2",
                   help="comma-separated: zoo names, Hugging Face config.json files or model directories, IR files")
    p.add_argument("--hw", required=True, nargs="+", metavar="HW",
                   help=f"hardware: preset names ({', '.join(presets())}) or .toml/.json files (a shell glob "
                        "expands to several; commas also separate)")
    p.add_argument("--grid", nargs="*", default=[], metavar="NAME=V1,V2",
                   help="hardware overrides, every combination: " + "; ".join(f"{k}: {v}" for k, v in
                                                                           GRID_DOCS.items()))
    p.add_argument("--precision", default="w8a8", metavar="P1,P2",
                   help=f"comma-separated precisions ({', '.join(PRECISIONS)}); the quantized ones are also "
                        "quantized, calibrated and measured for accuracy once per model (default w8a8)")
    options.output(p, "the directory for results.csv (and results.parquet with pyarrow); an existing one resumes",
                   directory=True, default="sweep")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="local worker processes (default: the machine's CPUs; 1: in this process)")
    p.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                   help="run the points as Ray tasks: 'auto' (a running cluster, else a local one) or the cluster's "
                        "address (pip install 'torch-ir[ray]')")
    p.add_argument("--retry-failed", action="store_true",
                   help="resuming: evaluate the points recorded as failed again")
    p.set_defaults(func=cmd_sweep)


def _items(values: list[str] | str) -> list[str]:
    """Comma- (and space-) separated items, in order, each once."""
    parts = [values] if isinstance(values, str) else values
    return list(dict.fromkeys(s.strip() for part in parts for s in part.split(",") if s.strip()))


def _check_hardware(hws: list[str]) -> None:
    """Every --hw a preset or an existing file: a typo is refused now, not as a column of failed rows."""
    from npu_compiler.costmodel.hardware import presets
    from npu_tools.sweep.grid import SweepError

    for hw in hws:
        if hw not in presets() and not os.path.isfile(hw):
            raise SweepError(f"--hw {hw}: neither a preset nor a hardware file; fix: give a preset "
                             f"({', '.join(presets())}) or the path of a .toml/.json file")


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run ``torch-ir sweep``."""
    from npu_tools.sweep.grid import SweepError, expand, parse_grid
    from npu_tools.sweep.run import read_results, sweep

    models, hws, precisions = _items(args.models), _items(args.hw), _items(args.precision)
    if not models:
        raise SweepError("--models: no model given; fix: --models resnet,bert (zoo names, config.json files, IR "
                         "files)")
    if args.workers is not None and args.workers < 1:
        raise SweepError(f"--workers {args.workers}: must be 1 or more; fix: give a count of processes")
    if args.ray is not None and args.workers is not None:
        raise SweepError("--ray and --workers both say where to run; fix: give one")
    _check_hardware(hws)
    points = expand(models, hws, parse_grid(args.grid), precisions)  # bad --grid or --precision: refused here
    executor = None
    if args.ray is not None:
        from npu_tools.sweep.ray_executor import RayExecutor  # the optional extra, only when asked

        executor = RayExecutor(args.ray)
    print(f"sweep: {len(points)} points ({len(models)} models x {len(points) // len(models)} hardware and "
          f"precision points) into {args.output}", file=sys.stderr)
    path = sweep(points, Path(args.output), workers=args.workers, executor=executor,
                 retry_failed=args.retry_failed)
    rows = read_results(path)
    keys = {p.key for p in points}
    failed = [r for k, r in rows.items() if k in keys and r["status"] != "ok"]
    print(f"{len(keys)} points: {len(keys) - len(failed)} ok, {len(failed)} failed")
    for r in failed[:5]:
        print(f"  failed {r['key']}: {r['reason'][:300]}")
    print(f"wrote {path}")
    return 0


__all__ = ["add_parser", "cmd_sweep"]
