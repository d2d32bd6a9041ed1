"""``torch-ir cost``: cost a compiled program (or a model, compiled first) on an NPU description and print the
summary; ``-o DIR`` also writes ``cost.csv``, ``roofline.png`` (``roofline.svg`` without matplotlib) and
``report.html`` there. An LLM (a directory
``torch-ir compile`` wrote with ``prefill.npubin`` and ``decode.npubin``, or an LLM IR, compiled with
``compile_lm``) is costed per phase, with tokens/s, and its reports go to ``DIR/prefill`` and ``DIR/decode``.

Bad input (an unknown preset, a broken hardware file, an unreadable program, an unwritable output directory) is
raised as a ``TorchIRError`` subclass; ``torch_ir.cli.main`` prints it as one line with exit code 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .hardware import presets


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``cost`` subcommand to ``sub``."""
    p = sub.add_parser("cost", help="estimate cycles, latency, DRAM traffic and utilization of a program on an NPU")
    p.add_argument("source", help="a .npubin program, an LLM directory (prefill.npubin, decode.npubin), or an IR "
                                  "JSON file, a zoo name or package.module:factory (compiled first, with host "
                                  "fallback for unsupported nodes; an LLM into its prefill and decode programs)")
    p.add_argument("--hw", required=True,
                   help=f"hardware: a preset name ({', '.join(presets())}) or a .toml/.json hardware file")
    p.add_argument("--dtype", default=None,
                   help="cost every floating tensor as this dtype (int8, fp16, bf16, fp32 or float16, ...); "
                        "default: each dispatch's own dtype")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="directory to write cost.csv, roofline.png (roofline.svg without matplotlib) and "
                        "report.html into (made if missing)")
    p.add_argument("--top", type=int, default=5, metavar="N", help="heaviest dispatches to list (default: 5)")
    p.set_defaults(func=cmd_cost)


def _programs(source: str) -> dict[str, object]:
    """The programs of ``source`` by phase: ``{"": program}``, or ``{"prefill": ..., "decode": ...}`` for an LLM.
    A .npubin file (or an LLM directory of two) is read as it is; anything else is loaded and compiled."""
    from npu_program.program import CompiledProgram

    if source.endswith(".npubin"):
        return {"": CompiledProgram.load(source)}
    if Path(source).is_dir() and (Path(source) / "decode.npubin").is_file():
        return {phase: CompiledProgram.load(Path(source) / f"{phase}.npubin") for phase in ("prefill", "decode")}
    from npu_compiler import compile as compile_ir
    from npu_compiler.cli import _load
    from npu_compiler.llm import compile_lm, is_lm

    ir = _load(source)
    if is_lm(ir):
        programs = compile_lm(ir, fallback="cpu")
        return {"prefill": programs.prefill, "decode": programs.decode}
    return {"": compile_ir(ir, fallback="cpu")}


def cmd_cost(args: argparse.Namespace) -> int:
    """Run ``torch-ir cost``."""
    from . import CostModelError, cost_lm, cost_program, load_hardware
    from .model import resolve_dtype
    from .report import have_matplotlib, write_reports

    if args.top < 0:
        raise CostModelError(f"--top {args.top}: must be 0 or more; fix: give a count of dispatches to list")
    resolve_dtype(args.dtype)  # a bad --dtype is refused before compiling
    hw = load_hardware(args.hw)  # a bad hardware file is refused before anything is made on disk
    png = bool(args.output) and have_matplotlib()
    if args.output:  # made, or refused when it cannot be written, before costing, not after
        _prepare_output(Path(args.output), png)
    programs = _programs(args.source)
    if "decode" in programs:
        lm = cost_lm(programs["prefill"], programs["decode"], hw, dtype=args.dtype)
        print(lm.summary(top=args.top))
        reports = {"prefill": lm.prefill, "decode": lm.decode}
    else:
        reports = {"": cost_program(programs[""], hw, dtype=args.dtype)}
        print(reports[""].summary(top=args.top))
    if args.output:
        for phase, report in reports.items():
            directory = _phase_directory(Path(args.output), phase)
            for path in write_reports(report, hw, directory, png=png):
                print(f"wrote {path}")
    return 0


def _prepare_output(output: Path, png: bool) -> None:
    """Make the report directory and check that every report can be written into it."""
    from torch_ir.fileio import check_writable_dir, write_error

    from .report import check_report_paths

    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise write_error(output, err, "cost report directory") from None
    check_writable_dir(output, "cost report directory")
    if not png:
        print("note: matplotlib is not installed: the roofline is written as roofline.svg "
              "(pip install 'torch-ir[cost]' for roofline.png)")
    check_report_paths(output, png)


def _phase_directory(output: Path, phase: str) -> Path:
    """``output/phase`` (an LLM phase's reports), made if missing; ``output`` itself for ``phase == ""``. A link
    planted there is replaced by a directory: the reports are never written where a link's author chose."""
    from torch_ir.fileio import write_error

    directory = output / phase if phase else output
    try:
        if phase and directory.is_symlink():
            directory.unlink()
        directory.mkdir(exist_ok=True)
    except OSError as err:
        raise write_error(directory, err, f"cost report directory ({phase})") from None
    return directory


__all__ = ["add_parser", "cmd_cost"]
