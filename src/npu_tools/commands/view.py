"""``torch-ir view MODEL_OR_FILE``: one model at every pipeline stage in Google's Model Explorer, with overlays.

Writes ``DIR/graphs.json`` (a graph per stage), ``DIR/overlays/*.json`` (cycles, DRAM bytes and bound on ``--hw``,
placement; with ``--verify`` the verifier's per-node error; with ``--profile`` the measured time per dispatch;
with ``--bisect-report`` bisect's first divergent node) and ``DIR/sync/*.json`` (which nodes of two stages are the
same computation), then starts Model Explorer on them when the ``view`` extra is installed (``--no-server``: only
the files). ``npu_tools.view.explorer`` says what is in each file.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npu_compiler.costmodel.hardware import DEFAULT_PRESET as DEFAULT_HW
from npu_tools import cli_options as options
from torch_ir.errors import TorchIRError

DEFAULT_OUTPUT = "view"


@dataclass
class Loaded:
    """A source's stage graphs, its program (None: not compiled), and what the overlays need of it."""

    label: str
    graphs: list[Any]
    program: Any = None
    subject: Any = None  # npu_tools.debug.subject.Subject, made for --verify/--profile
    notes: list[str] = field(default_factory=list)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``view`` subcommand to ``sub``."""
    p = sub.add_parser("view", help="every pipeline stage in Google's Model Explorer, with per-node overlays")
    p.add_argument("source", help="an IR JSON file, a .npubin program, an ONNX file, a zoo name, "
                                  "package.module:factory or a Hugging Face model directory (weight-free unless "
                                  "--verify/--profile)")
    options.output(p, "the directory graphs.json, overlays/ and sync/ go into", directory=True,
                   default=DEFAULT_OUTPUT)
    p.add_argument("--hw", default=DEFAULT_HW, metavar="NAME|FILE",
                   help=f"the hardware the cycles and DRAM bytes overlays are costed on (default: {DEFAULT_HW})")
    options.weights(p, default_help="an IR file's, or loaded into a model, for --verify and --profile")
    p.add_argument("--verify", action="store_true", help="overlay the verifier's per-node error against the source "
                   "model (runs the model and the IR: the weights are held in memory)")
    p.add_argument("--profile", action="store_true", help="overlay the measured time of each dispatch (runs the "
                   "compiled program on the CPU)")
    p.add_argument("--bisect-report", metavar="FILE", help="overlay the first divergent node of a bisect run (its "
                   "report.json)")
    p.add_argument("--no-server", action="store_true", help="write the files only; do not start Model Explorer")
    p.add_argument("--port", type=int, default=8080, metavar="N", help="Model Explorer's port (default: 8080, the "
                                                                        "first free one from there)")
    p.set_defaults(func=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    from npu_compiler.costmodel import load_hardware
    from npu_tools.view.explorer import INSTALL_HINT, serve, write_explorer
    from torch_ir.fileio import check_regular_file, make_output_dir

    if not 0 < args.port < 65536:
        raise TorchIRError(f"--port {args.port}: a port is 1 to 65535; give a free one, or leave --port out")
    if args.bisect_report:
        check_regular_file(args.bisect_report, "bisect report", "give the report.json of `torch-ir bisect -o DIR`")
    if args.weights:
        check_regular_file(args.weights, "weights file", "give a .safetensors or .pt file")
    hw = load_hardware(args.hw)  # every flag is checked before the model is loaded
    make_output_dir(args.output, "Model Explorer output directory")
    loaded = load_source(args.source, weights=args.weights, run=args.verify or args.profile)
    overlays = view_overlays(loaded, hw=hw, verify=args.verify, profile=args.profile,
                             bisect_report=args.bisect_report)
    files = write_explorer(loaded.graphs, args.output, overlays, label=loaded.label)
    stages = ", ".join(f"{g.stage} ({len(g.nodes)} nodes)" for g in loaded.graphs)
    print(f"{loaded.label}: {stages}")
    print(f"overlays: {', '.join(o.name for o in overlays) or 'none'}")
    for note in loaded.notes:
        print(f"note: {note}")
    print(f"wrote {len(files)} files into {args.output}: {files[0].name}, overlays/, sync/")
    if args.no_server:
        return 0
    try:
        import model_explorer  # noqa: F401  (the optional `view` extra)
    except ImportError:
        print(f"Model Explorer is not installed, so it was not started: {INSTALL_HINT}, then run this again; or open "
              f"{files[0]} in Model Explorer, with the files in {Path(args.output) / 'overlays'} as node data",
              file=sys.stderr)
        return 0
    serve(args.output, port=args.port)
    return 0


def load_source(source: str, *, weights: str | None = None, run: bool = False) -> Loaded:
    """The stage graphs of any source ``torch-ir view`` takes. ``run``: also the ``Subject`` (weights, inputs and
    the trusted runner) that ``--verify`` and ``--profile`` need."""
    from npu_tools.view.stages import compile_fused, ir_stages, program_graph

    path = Path(source)
    if path.suffix == ".npubin":
        if run:
            raise TorchIRError(f"{source}: --verify/--profile need the model or its IR, not a compiled program; give "
                               "the IR JSON (with --weights) or the model")
        return _load_program(path)
    subject = None
    if run:
        from npu_tools.debug.sources import load_subject

        subject = load_subject(source, weights=weights)
        ir = subject.ir
    else:
        from npu_tools.commands.normalize import _load

        ir, _ = _load(source)
    loaded = Loaded(ir.model_name or path.stem, [], None, subject)
    loaded.graphs, fused = ir_stages(ir)
    try:
        loaded.program = compile_fused(fused)
    except TorchIRError as e:  # not compilable as it is (symbolic shapes, ...): the IR stages are still worth a look
        loaded.notes.append(f"no compiled stage, and so no cost or placement overlay: {e}")
    else:
        loaded.graphs.append(program_graph(loaded.program))
    return loaded


def _load_program(path: Path) -> Loaded:
    from npu_program.program import CompiledProgram
    from npu_tools.view.stages import ir_graph, program_graph
    from torch_ir.ir.serialize import ir_from_dict

    program = CompiledProgram.load(path)
    graphs, notes = [], []
    if program.ir is not None:
        graphs.append(ir_graph(ir_from_dict(program.ir, source=str(path)), "normalized"))
    else:
        notes.append(f"{path} carries no normalized IR (compiled to ship without it): only the compiled stage")
    graphs.append(program_graph(program))
    return Loaded(program.model_name or path.stem, graphs, program, None, notes)


def view_overlays(loaded: Loaded, *, hw: Any = DEFAULT_HW, verify: bool = False, profile: bool = False,
                  bisect_report: str | None = None) -> list[Any]:
    """The overlays ``torch-ir view`` shows (``overlay_sources.pipeline_overlays``), the program costed on ``hw`` (a
    preset name, a file or a ``Hardware``) at its native precision, as ``torch-ir cost`` and ``report`` cost it."""
    from npu_compiler.costmodel import cost_program, load_hardware
    from npu_tools.view.overlay_sources import pipeline_overlays

    cost = None
    if loaded.program is not None:
        hardware = load_hardware(hw) if isinstance(hw, (str, Path)) else hw
        cost = cost_program(loaded.program, hardware, dtype=hardware.native_dtype)
    return pipeline_overlays(loaded.graphs, loaded.program, cost, subject=loaded.subject, verify=verify,
                             profile=profile, bisect_report=bisect_report)


__all__ = ["DEFAULT_HW", "DEFAULT_OUTPUT", "Loaded", "add_parser", "cmd_view", "load_source", "view_overlays"]
