"""``torch-ir cost``: cost a compiled program (or a model, compiled first) on an NPU description and print the
summary; ``-o DIR`` also writes ``cost.csv``, ``roofline.png`` (``roofline.svg`` without matplotlib) and
``report.html`` there. An LLM (a directory
``torch-ir compile`` wrote with ``prefill.npubin`` and ``decode.npubin``, or an LLM IR, compiled with
``compile_lm``) is costed per phase, with tokens/s, and its reports go to ``DIR/prefill`` and ``DIR/decode``.

Without ``--dtype`` a program is costed at the hardware's native precision (``Hardware.native_dtype``: its
``native_dtype`` field, else the dtype of its fastest MAC rate), and the summary says so: an int8-only NPU would
otherwise cost a float program at "the slowest supported rate", which no one deploying on it would run.
``--hw-template [FILE]`` writes a commented hardware file to start from instead of costing anything.

Bad input (an unknown preset, a broken hardware file, an unreadable program, an unwritable output directory) is
raised as a ``TorchIRError`` subclass; ``npu_tools.cli.main`` prints it as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from npu_compiler.costmodel.hardware import MAC_DTYPES, Hardware, presets
from npu_tools import cli_options as options

if TYPE_CHECKING:
    from npu_compiler.costmodel.model import CostReport

#: ``--dtype`` value that costs each dispatch at the dtype it was compiled with (the API's ``dtype=None``).
AS_COMPILED = "compiled"
#: Where ``--hw-template`` writes when given no file.
DEFAULT_TEMPLATE = "my_npu.toml"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``cost`` subcommand to ``sub``."""
    p = sub.add_parser("cost", help="estimate cycles, latency, DRAM traffic and utilization of a program on an NPU")
    p.add_argument("source", nargs="?",
                   help="a .npubin program, an LLM directory (prefill.npubin, decode.npubin), or an IR "
                        "JSON file, a zoo name, package.module:factory, or a Hugging Face model directory or its "
                        "config.json, weight-free (compiled first, with host "
                        "fallback for unsupported nodes; an LLM into its prefill and decode programs)")
    p.add_argument("--hw", help=f"hardware: a preset name ({', '.join(presets())}) or a .toml/.json hardware file "
                                "(--hw-template writes one to start from)")
    p.add_argument("--dtype", default=None,
                   help="cost every floating tensor as this dtype (int8, fp16, bf16, fp32 or float16, ...), or "
                        f"'{AS_COMPILED}' for each dispatch's own dtype; default: the hardware's native dtype "
                        "(its native_dtype field, else the dtype of its fastest MAC rate)")
    p.add_argument("--precision", default=None, metavar="P",
                   help="cost a float program as if quantized, by role: w8a8, w4a8, w8a16, w4a16 (int4 weights in "
                        "groups of 128), w8a16_int, fp32, fp16, bf16 (npu_compiler.costmodel.precision); replaces "
                        "--dtype. Quantized dispatches are costed as compiled whatever it says")
    p.add_argument("--context", type=int, default=None, metavar="N",
                   help="for an LLM: the live KV-cache positions to cost at (the decode step attending over N "
                        "positions; attention reads only those); default: the whole cache, the slowest step")
    options.kv_bits(p)
    p.add_argument("--hw-template", nargs="?", const=DEFAULT_TEMPLATE, metavar="FILE",
                   help=f"write a commented hardware file to start from (default: {DEFAULT_TEMPLATE}; '-': print "
                        "it) instead of costing: every field, its unit, its allowed range and an example value")
    p.add_argument("--force", action="store_true", help="let --hw-template replace an existing file")
    options.output(p, "the directory for cost.csv, roofline.png (roofline.svg without matplotlib) and report.html",
                   directory=True)
    p.add_argument("--top", type=int, default=5, metavar="N", help="heaviest dispatches to list (default: 5)")
    p.set_defaults(func=cmd_cost)


def _programs(source: str, kv_bits: int | None = None) -> dict[str, object]:
    """The programs of ``source`` by phase: ``{"": program}``, or ``{"prefill": ..., "decode": ...}`` for an LLM.
    A .npubin file (or an LLM directory of two) is read as it is; anything else is loaded and compiled."""
    from npu_compiler.costmodel import CostModelError
    from npu_program.program import CompiledProgram

    compiled = source.endswith(".npubin") or (Path(source) / "decode.npubin").is_file()
    if compiled and kv_bits is not None:
        raise CostModelError(f"--kv-bits {kv_bits}: {source} is compiled already, with its own cache; fix: cost the "
                             "model itself (a zoo name, checkpoint or IR) with --kv-bits, or compile it with "
                             "torch-ir compile --kv-bits first")
    if source.endswith(".npubin"):
        from npu_program.npubin_dynamic import load_program

        program = load_program(source)
        if isinstance(program, CompiledProgram):
            return {"": program}
        # a dynamic program: each bucket (an upper-bound program: its one variant, at the top) costed on its own
        return {"_".join(f"{k}{v}" for k, v in variant.sizes.items()): variant.program
                for variant in program.variants}
    if Path(source).is_dir() and (Path(source) / "decode.npubin").is_file():
        from npu_program.npubin_dynamic import load_program  # the prefill is one file of prompt-length buckets

        return {phase: load_program(Path(source) / f"{phase}.npubin") for phase in ("prefill", "decode")}
    from npu_compiler import compile as compile_ir
    from npu_compiler.llm import compile_lm, is_lm
    from npu_tools.commands.compile import _load

    ir = _load(source)
    if is_lm(ir):
        programs = compile_lm(ir, fallback="cpu", kv_bits=kv_bits)
        return {"prefill": programs.prefill, "decode": programs.decode}
    if kv_bits is not None:
        raise CostModelError(f"--kv-bits {kv_bits}: IR {ir.model_name!r} has no KV cache (not an LLM extracted with "
                             "its cache); fix: leave --kv-bits out")
    return {"": compile_ir(ir, fallback="cpu")}


def cmd_cost(args: argparse.Namespace) -> int:
    """Run ``torch-ir cost``."""
    from npu_compiler.costmodel import CostModelError, cost_lm, cost_program, load_hardware
    from npu_compiler.costmodel.report import have_matplotlib, write_reports  # the report's own test of matplotlib

    if args.hw_template is not None:
        return _write_template(args)
    if args.source is None or args.hw is None:
        missing = " and ".join(m for m, v in (("a model to cost", args.source), ("--hw", args.hw)) if v is None)
        raise CostModelError(f"{missing} missing; fix: torch-ir cost MODEL --hw PRESET_OR_FILE (presets: "
                             f"{', '.join(presets())}; torch-ir cost --hw-template writes a hardware file to start "
                             "from)")
    if args.top < 0:
        raise CostModelError(f"--top {args.top}: must be 0 or more; fix: give a count of dispatches to list")
    hw = load_hardware(args.hw)  # a bad hardware file is refused before anything is made on disk
    dtype, note = costing_dtype(args.dtype, hw)  # a bad --dtype is refused before compiling
    precision = _precision(args.precision, args.dtype)
    if precision is not None:
        from npu_compiler.costmodel.model import PRECISIONS

        note = f"costed at {precision} (--precision): {PRECISIONS[precision].doc}"
    png = bool(args.output) and have_matplotlib()
    if args.output:  # made, or refused when it cannot be written, before costing, not after
        _prepare_output(Path(args.output), png)
    programs = _programs(args.source, args.kv_bits)
    if "decode" in programs:
        lm = cost_lm(programs["prefill"], programs["decode"], hw, dtype=dtype, context=args.context,
                     precision=precision)
        reports = {"prefill": lm.prefill, "decode": lm.decode}
        _note(reports, note)
        print(lm.summary(top=args.top))
    else:
        reports = {phase: cost_program(program, hw, dtype=dtype, context=args.context, precision=precision)
                   for phase, program in programs.items()}
        _note(reports, note)
        for phase, report in reports.items():
            if phase:  # a bucket of a dynamic program
                print(f"== bucket {phase}")
            print(report.summary(top=args.top))
    if hw.kernels is not None:
        print(f"note: the [kernels] list of {hw.described_in} is for torch-ir partition --hw; the cost model costs "
              "every NPU dispatch of the program")
    if args.output:
        for phase, report in reports.items():
            directory = _phase_directory(Path(args.output), phase)
            for path in write_reports(report, hw, directory, png=png):
                print(f"wrote {path}")
    return 0


def costing_dtype(requested: str | None, hw: Hardware) -> tuple[str | None, str]:
    """(the ``dtype`` to give ``cost_program``, the summary's line saying what it is and why) for ``--dtype
    requested`` on ``hw``: by default the hardware's native dtype; ``compiled``: each dispatch's own."""
    from npu_compiler.costmodel.model import RATE_CLASS, CostModelError, resolve_dtype

    if requested is None:
        return hw.native_dtype, f"costed at {hw.native_dtype}, the hardware's native precision; --dtype to change"
    if requested == AS_COMPILED:
        return None, f"costed at each dispatch's own dtype (--dtype {AS_COMPILED})"
    if requested not in MAC_DTYPES and requested not in RATE_CLASS:  # refused in the flag's words, not the API's
        raise CostModelError(f"--dtype {requested}: cannot be costed; fix: give {', '.join(MAC_DTYPES)} (or float32, "
                             f"float16, bfloat16), or {AS_COMPILED} for each dispatch's own dtype")
    return requested, f"costed at {resolve_dtype(requested)} (--dtype {requested})"


def _precision(precision: str | None, dtype: str | None) -> str | None:
    """``--precision``, checked before compiling; it and ``--dtype`` are one choice, not two."""
    from npu_compiler.costmodel.model import PRECISIONS, CostModelError

    if precision is None:
        return None
    if precision not in PRECISIONS:
        raise CostModelError(f"--precision {precision}: not a precision the cost model knows; fix: give one of "
                             f"{', '.join(PRECISIONS)}")
    if dtype is not None:
        raise CostModelError(f"--precision {precision} and --dtype {dtype} both say what to cost at; fix: give one")
    return precision


def _note(reports: dict[str, CostReport], note: str) -> None:
    """Give every report the line on its dtype, which its summary and report.html show."""
    for report in reports.values():
        report.dtype_note = note


def _write_template(args: argparse.Namespace) -> int:
    """``--hw-template [FILE]``: the commented template of ``hardware_template``; an existing FILE (or a link
    there) is replaced only with ``--force``; ``-`` prints it."""
    from npu_compiler.costmodel import CostModelError
    from npu_compiler.costmodel.hardware_template import hardware_template
    from torch_ir.fileio import atomic_write, check_output_path

    if args.source is not None:
        raise CostModelError(f"--hw-template writes a hardware file and costs nothing, but a model was given "
                             f"({args.source}); fix: run the two commands one after the other")
    text = hardware_template()
    if args.hw_template == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.hw_template)
    if path.suffix.lower() != ".toml":  # load_hardware reads a file by its suffix
        raise CostModelError(f"{path}: the template is TOML; fix: name it {path.with_suffix('.toml').name}")
    if os.path.lexists(path) and not args.force:  # a description someone wrote is not replaced by accident
        raise CostModelError(f"{path}: exists; fix: give another file name, or --force to replace it")
    check_output_path(path, "hardware template")
    atomic_write(path, text, what="hardware template")
    print(f"wrote {path}: edit it, then torch-ir cost MODEL --hw {path}")
    return 0


def _prepare_output(output: Path, png: bool) -> None:
    """Make the report directory and check that every report can be written into it."""
    from npu_compiler.costmodel.report import check_report_paths
    from torch_ir.fileio import make_output_dir

    make_output_dir(output, "cost report directory")  # never a chain of missing folders
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


__all__ = ["AS_COMPILED", "add_parser", "cmd_cost", "costing_dtype"]
