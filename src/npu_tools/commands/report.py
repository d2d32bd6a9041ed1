"""``torch-ir report MODEL -o report.html``: one self-contained HTML page of the whole pipeline of a model (its
graph at every stage, the overlays, the cost summary, the verification result with ``--verify``, the memory plan).

MODEL is a zoo name, ``package.module:factory``, a Hugging Face directory (or its config.json), an IR JSON file or
an ONNX file. The page is written whole or not at all (``npu_tools.view.report.write_report``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from npu_compiler.costmodel.hardware import DEFAULT_PRESET as DEFAULT_HW
from npu_tools import cli_options as options
from npu_tools.commands.import_onnx import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``report`` subcommand to ``sub``."""
    from npu_compiler.costmodel.hardware import presets

    p = sub.add_parser("report", help="one self-contained HTML page of the whole pipeline: the graph of every "
                                      "stage with overlays, cost, verification and the memory plan")
    p.add_argument("source", help="a zoo name, package.module:factory, a Hugging Face model directory or its "
                                  "config.json, an IR JSON file, or an ONNX file")
    options.output(p, "the HTML page (default: <name>.report.html)")
    p.add_argument("--hw", default=DEFAULT_HW,
                   help=f"the NPU to cost on: a preset ({', '.join(presets())}) or a .toml/.json hardware file "
                        f"(default: {DEFAULT_HW})")
    p.add_argument("--verify", action="store_true",
                   help="verify the kernel-fused IR against the model with its weights (seeded ones for a zoo "
                        "model or a config.json alone); needs a model, not an IR or ONNX file")
    p.add_argument("--profile", action="store_true",
                   help="overlay the measured time of each dispatch (runs the compiled program on the model's seeded "
                        "inputs and weights; a model source only)")
    p.add_argument("--bisect-report", metavar="FILE",
                   help="overlay the first divergent node of a torch-ir bisect run (its report.json)")
    p.add_argument("--bind", action="append", default=[], metavar="SYMBOL=SIZE",
                   help="fix a symbolic dimension for the compiled program (a dynamic batch: --bind batch=1); "
                        "repeatable")
    p.add_argument("--title", help="the page's title (default: the model's name)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    """Run ``torch-ir report``: load, run the pipeline, cost, optionally verify, write the page."""
    from npu_compiler import CompileOptions, compile
    from npu_compiler.costmodel import cost_program, load_hardware
    from npu_tools.commands.compile import _parse_bind
    from npu_tools.commands.normalize import _load as load_ir_or_model
    from npu_tools.debug.sources import load_subject
    from npu_tools.view.overlay_sources import pipeline_overlays
    from npu_tools.view.report import write_report
    from npu_tools.view.stages import ir_stages, program_graph
    from torch_ir.fileio import check_output_path
    from torch_ir.naming import default_output

    if args.output:  # refused before the work, not after
        check_output_path(args.output, "HTML report")
    hw = load_hardware(args.hw)  # a bad --hw is refused before extracting
    bind = _parse_bind(args.bind)
    ir, spec = load_ir_or_model(args.source)
    for flag, given in (("--verify", args.verify), ("--profile", args.profile)):
        if given and spec is None:
            raise UsageError(f"{flag}: {args.source} is a file, not a model; it runs the model with its weights; fix: "
                             "give a zoo name, package.module:factory or a Hugging Face model directory, or leave "
                             f"{flag} out")
    _check_static(ir, bind)
    graphs, fused = ir_stages(ir)
    program = compile(fused, options=CompileOptions(normalize=False, fuse=False), fallback="cpu", bind=bind or None)
    graphs.append(program_graph(program))
    cost = cost_program(program, hw, dtype=hw.native_dtype)
    cost.dtype_note = f"costed at {hw.native_dtype}, the hardware's native precision"  # as torch-ir cost does
    verification = _verify(fused, spec) if args.verify else None
    out = Path(args.output) if args.output else default_output(ir.model_name, ".report.html")
    subject = load_subject(args.source) if args.verify or args.profile else None
    overlays = pipeline_overlays(graphs, program, cost, subject=subject, verify=args.verify, profile=args.profile,
                                 bisect_report=args.bisect_report)
    write_report(out, graphs, overlays, program=program, cost=cost,
                 verification=verification, title=args.title or f"{ir.model_name}: pipeline report")
    print(f"{ir.model_name}: " + ", ".join(f"{g.stage} {len(g.nodes)} nodes" for g in graphs))
    print(f"cost on {hw.name}: {cost.total_cycles:,} cycles, {cost.latency_ms:.3f} ms, {cost.dram_bytes:,} DRAM bytes")
    if verification is not None:
        print(f"verification: {'PASS' if verification.ok else 'FAIL'}")
    print(f"wrote {out}")
    return 0 if verification is None or verification.ok else 1


def _check_static(ir, bind: dict[str, int]) -> None:
    """A symbolic input dimension not given a size by ``--bind`` is refused in this command's flags (the program
    and its memory plan are made for one size)."""
    from npu_compiler.dynamic import varying_symbols

    symbols = sorted(set(varying_symbols(ir)) - set(bind))
    if symbols:
        raise UsageError(f"IR {ir.model_name!r} has symbolic input dimensions ({', '.join(symbols)}) and the report's "
                         "compiled program and memory plan are for one size; fix: give each a size, "
                         + " ".join(f"--bind {s}=1" for s in symbols))


def _verify(fused_ir, spec):
    from torch_ir.verify import verify_ir
    from torch_ir.weights import module_state

    model = spec.build("cpu")
    _, report = verify_ir(fused_ir, module_state(model), model, spec.args, test_kwargs=spec.kwargs)
    return report


__all__ = ["add_parser", "cmd_report"]
