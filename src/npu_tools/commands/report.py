"""``torch-ir report MODEL -o report.html``: one self-contained HTML page of the whole pipeline of a model (its
graph at every stage, the overlays, the cost summary, the verification result with ``--verify``, the memory plan).

MODEL is a zoo name, ``package.module:factory``, a Hugging Face directory (or its config.json), an IR JSON file or
an ONNX file. The page is written whole or not at all (``npu_tools.view.report.write_report``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from npu_compiler.costmodel.hardware import DEFAULT_PRESET as DEFAULT_HW
from npu_tools import cli_options as options
from npu_tools.commands.import_onnx import UsageError

if TYPE_CHECKING:
    from npu_compiler.costmodel.costs import CostReport
    from npu_program.program import CompiledProgram
    from npu_tools.view.overlays import Overlay
    from npu_tools.view.stages import StageGraph



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
    from npu_tools.view.report import write_report
    from npu_tools.view.stages import pipeline_graphs
    from torch_ir.fileio import check_output_path
    from torch_ir.naming import default_output

    if args.output:  # refused before the work, not after
        check_output_path(args.output, "HTML report")
    from npu_tools.commands.compile import _parse_bind

    hw = load_hardware(args.hw)  # a bad --hw is refused before extracting
    bind = _parse_bind(args.bind)
    ir, spec = _load(args.source)
    for flag, given in (("--verify", args.verify), ("--profile", args.profile)):
        if given and spec is None:
            raise UsageError(f"{flag}: {args.source} is a file, not a model; it runs the model with its weights; fix: "
                             "give a zoo name, package.module:factory or a Hugging Face model directory, or leave "
                             f"{flag} out")
    _check_static(ir, bind)
    fused = []  # the kernel-fused IR pipeline_graphs compiles, kept for --verify

    def compile_fused(f):
        fused.append(f)
        return compile(f, options=CompileOptions(normalize=False, fuse=False), fallback="cpu", bind=bind or None)

    graphs, program = pipeline_graphs(ir, compile_ir=compile_fused)
    cost = cost_program(program, hw, dtype=hw.native_dtype) if program is not None else None
    if cost is not None:  # as torch-ir cost does by default, and says so
        cost.dtype_note = f"costed at {hw.native_dtype}, the hardware's native precision"
    verification = _verify(fused[0], spec) if args.verify else None
    out = Path(args.output) if args.output else default_output(ir.model_name, ".report.html")
    overlays = pipeline_overlays(graphs, program, cost) + _measured_overlays(args, graphs, program)
    write_report(out, graphs, overlays, program=program, cost=cost,
                 verification=verification, title=args.title or f"{ir.model_name}: pipeline report")
    print(f"{ir.model_name}: " + ", ".join(f"{g.stage} {len(g.nodes)} nodes" for g in graphs))
    if cost is not None:
        print(f"cost on {hw.name}: {cost.total_cycles:,} cycles, {cost.latency_ms:.3f} ms, "
              f"{cost.dram_bytes:,} DRAM bytes")
    if verification is not None:
        print(f"verification: {'PASS' if verification.ok else 'FAIL'}")
    print(f"wrote {out}")
    return 0 if verification is None or verification.ok else 1


def _load(source: str):
    """(IR, the model's spec or None): an ONNX file imported, anything else as ``normalize`` loads it."""
    if source.endswith(".onnx") and Path(source).is_file():
        from torch_ir.frontends.onnx import import_onnx

        ir, _ = import_onnx(source)
        return ir, None
    from npu_tools.commands.normalize import _load as load_ir_or_model

    return load_ir_or_model(source)


def _check_static(ir, bind: dict[str, int]) -> None:
    """A symbolic input dimension not given a size by ``--bind`` is refused in this command's flags (the program
    and its memory plan are made for one size)."""
    symbols = sorted({d for t in ir.graph_inputs for d in t.shape if isinstance(d, str)} - set(bind))
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


def _measured_overlays(args: argparse.Namespace, graphs: list[StageGraph],
                       program: CompiledProgram | None) -> list[Overlay]:
    """With ``--verify``, the verifier's error per node; ``--profile``, the time per dispatch; ``--bisect-report``,
    the first divergent node: the overlays ``torch-ir view`` draws from the same sources."""
    from npu_tools.commands.view import Loaded, profile_of
    from npu_tools.view import overlay_sources as sources

    overlays = []
    if args.verify or args.profile:
        from npu_tools.debug.sources import load_subject

        subject = load_subject(args.source)
        if args.verify:
            overlays.append(sources.error_overlay(sources.verifier_errors(subject), graphs))
        if args.profile and program is not None:
            overlays.append(sources.profile_overlay(profile_of(Loaded(subject.name, graphs, program, subject)),
                                                    graphs))
    if args.bisect_report:
        overlays.append(sources.bisect_overlay(args.bisect_report, graphs))
    return overlays


def pipeline_overlays(graphs: list[StageGraph], program: CompiledProgram | None,
                      cost: CostReport | None) -> list[Overlay]:
    """The cost model's cycles, DRAM bytes and bound per dispatch and the placement (NPU, or CPU with the reason),
    measured on the compiled stage and carried to every stage (``npu_tools.view.overlay_sources``, which
    ``torch-ir view`` shows too)."""
    from npu_tools.view.overlay_sources import cost_overlays, placement_overlay

    overlays = cost_overlays(cost, graphs) if cost is not None else []
    if program is not None:
        overlays.append(placement_overlay(program, graphs))
    return overlays


__all__ = ["add_parser", "cmd_report", "pipeline_overlays"]
