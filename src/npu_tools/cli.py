"""``torch-ir``: one command over the toolkit. Flags mean the same in every command (docs/usage.md).

    torch-ir demo                       the whole pipeline on a built-in model: extract, verify, normalize,
                                        compile, run the program, profile
    torch-ir extract resnet -o ir.json  weight-free extraction of a zoo model, package.module:factory or a
                                        Hugging Face directory (--save-weights to write its weights)
    torch-ir inspect ir.json --mermaid  statistics, Mermaid DAG, Markdown report of an IR file
    torch-ir verify bert                run the IR and compare with PyTorch eager (--weights, --input)
    torch-ir zoo --category attention -o reports/   the report runner over the model zoo
    torch-ir ops --markdown             the operator table (docs/operators.md)
    torch-ir normalize bert --markdown r.md   fuse into the NPU op set, with the report
    torch-ir quantize convnet --preset w8a8 --calibration cal/ -o q/   int weights and calibrated QDQ activations
    torch-ir compile ir.json -o m.npubin      compile to a program of kernel dispatches (--bind batch=1)
    torch-ir partition ir.json --hw npu.toml  placement summary: NPU and CPU parts, and why
    torch-ir generate ./Qwen2.5-0.5B --prompt "Hi"    an LLM: prefill and decode with a KV cache
    torch-ir run m.npubin --weights w.safetensors      run a program (CPU or WebGPU backend)
    torch-ir profile m.npubin --weights w.safetensors  time per dispatch and per kernel kind
    torch-ir cost m.npubin --hw tpu_v1 -o cost/        cycles and DRAM bytes on a described NPU
    torch-ir report llama -o report.html   one HTML page: every stage's graph, overlays, cost, memory plan
    torch-ir bisect qwen2 -o bisect/    which stage, rule or kernel makes the numbers wrong; a repro
    torch-ir view bert -o view/         every stage in Google's Model Explorer, with cost and placement overlays
    torch-ir sweep --models resnet,bert --hw tpu_v1 --grid array=16x16,32x32 --precision fp16,w8a8 -o sweep/
                                        models x hardware x precisions: cost and accuracy, one table
    torch-ir sweep-report sweep/        a sweep's Pareto fronts and heat maps: PNGs and one HTML page
    torch-ir import-onnx model.onnx     ONNX -> IR JSON and weights   (verify-onnx: against onnxruntime)
    torch-ir import-tinygrad pkg.mod:factory   tinygrad -> IR JSON and weights   (tinygrad-docs: the table)
    torch-ir verify-onnx model.onnx     the imported IR against onnxruntime
    torch-ir tinygrad-docs              the tinygrad frontend's UOp table (docs/tinygrad.md)
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from tqdm import tqdm

from . import cli_options as options

DEMO_OUTPUT = "reports/demo"  # the demo's own default: made whole (a directory the user names is made one level)


def _progress(desc: str, total: int | None = None) -> tqdm:
    return tqdm(total=total, desc=desc, unit="step", leave=False, disable=None, file=sys.stderr)


def _stage_printer(bar: tqdm):
    def step(label: str) -> None:
        bar.set_postfix_str(label)
        bar.update(1)
    return step


def cmd_demo(args: argparse.Namespace) -> int:
    from torch_ir.fileio import make_output_dir

    from .demo import run_demo
    from .zoo.runner import resolve_spec

    out = make_output_dir(args.output, "demo output directory", parents=args.output == DEMO_OUTPUT)
    spec = resolve_spec(args.model)
    with _progress(f"{spec.name}", total=6) as bar:
        result = run_demo(spec, out, _stage_printer(bar), threads=args.threads)
    print(f"{spec.name}: the whole pipeline, from a model built on the meta device to a compiled program")
    print("\n".join(result.lines))
    print(f"wrote: {', '.join(str(f) for f in result.files)}")
    print("demo PASSED: the IR and the compiled program compute what the model computes" if result.ok
          else "demo FAILED: see the lines above")
    return 0 if result.ok else 1


def cmd_extract(args: argparse.Namespace) -> int:
    from torch_ir.fileio import check_output_path
    from torch_ir.naming import default_output
    from torch_ir.report import ir_statistics
    from torch_ir.weights import module_state, save_weights

    from .zoo.runner import resolve_spec

    # every output is checked before anything is built or written: no IR left behind by a bad --weights path
    if args.output:
        check_output_path(args.output, "IR file")
    if args.save_weights:
        check_output_path(args.save_weights, "weights file")
    spec = resolve_spec(args.model)
    out = Path(args.output) if args.output else default_output(spec.name, ".json")
    check_output_path(out, "IR file")
    with _progress(f"extract {spec.name}", total=3) as bar:
        step = _stage_printer(bar)
        step("build on meta")
        model = spec.build("meta")
        step("torch.export + convert")
        ir = spec.extract(model, args.name)
        step("save")
        ir.save(out, indent=1 if args.pretty else None)
    print(ir_statistics(ir))
    print(f"wrote {out}")
    if args.save_weights:
        save_weights(module_state(spec.build("cpu")), args.save_weights)
        print(f"wrote {spec.weights or 'seeded weights'} to {args.save_weights}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from torch_ir.fileio import atomic_write, check_output_path
    from torch_ir.ir import load_ir
    from torch_ir.report import ir_statistics, markdown_report, to_mermaid

    if args.markdown not in (None, "-"):
        check_output_path(args.markdown, "report file")
    ir = load_ir(args.ir)
    stats = ir_statistics(ir)
    if args.text:
        print(ir)
        print()
    print(stats)
    if args.mermaid:
        print()
        print(to_mermaid(ir))
    if args.markdown == "-":
        print(markdown_report(ir, stats))
    elif args.markdown:
        atomic_write(args.markdown, markdown_report(ir, stats), what="report file")
        print(f"wrote {args.markdown}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from torch_ir.inputs import write_report
    from torch_ir.ir import load_ir
    from torch_ir.verify import verify_ir
    from torch_ir.weights import load_state_dict, load_weights_into, module_state

    from .zoo.runner import resolve_spec

    spec = resolve_spec(args.model)
    with _progress(f"verify {spec.name}", total=3) as bar:
        step = _stage_printer(bar)
        step("IR")
        ir = load_ir(args.ir) if args.ir else spec.extract(spec.build("meta"))
        step("reference model")
        real = spec.build("cpu")
        if args.weights:  # the file's weights in the model too, every one of them (as bisect --weights)
            load_weights_into(real, load_state_dict(args.weights), f"weights file {args.weights!r}")
        weights = module_state(real)
        step("execute and compare")
        test_args = _verify_inputs(ir, spec, args) if args.input else spec.args
        ok, report = verify_ir(ir, weights, real, test_args, rtol=args.rtol, atol=args.atol, test_kwargs=spec.kwargs)
    write_report(args.markdown, report.to_markdown, str(report))
    return 0 if ok else 1


def _verify_inputs(ir, spec, args: argparse.Namespace) -> tuple:
    """``--input``: the model's positional inputs, given ones from the files, the others the example's."""
    import torch

    from torch_ir.arrays import read_cli_inputs
    from torch_ir.errors import InputMismatchError

    if spec.kwargs or len(spec.args) != len(ir.graph_inputs):
        raise InputMismatchError(f"--input needs a model whose inputs are its {len(ir.graph_inputs)} positional "
                                 f"arguments; {spec.name!r} takes {len(spec.args)} and {len(spec.kwargs)} by name")
    arrays = read_cli_inputs(args.input, [t.name for t in ir.graph_inputs])
    return tuple(torch.from_numpy(arrays[t.name]) if t.name in arrays else example
                 for t, example in zip(ir.graph_inputs, spec.args))


def cmd_zoo(args: argparse.Namespace) -> int:
    from torch_ir.fileio import atomic_write, make_output_dir

    from .zoo import get_model, list_models
    from .zoo.runner import resolve_spec, run_model

    entries = [e for e in map(get_model, list_models(args.category)) if e.available()]
    if args.list or not entries:
        for e in entries:
            print(f"{e.name:24s} {e.category:12s} {e.description}")
        return 0 if entries else 1
    out = make_output_dir(args.output, "zoo report directory")
    rows, failed = [], 0
    for entry in tqdm(entries, desc="models", unit="model", disable=None, file=sys.stderr):
        try:
            result = run_model(resolve_spec(entry.name), out)
            status = "PASSED" if result.ok else "FAILED"
            rows.append(f"| [{entry.name}]({entry.name}.md) | {entry.category} | {len(result.ir.nodes)} | {status} |")
            failed += not result.ok
        except Exception as e:  # noqa: BLE001 - one broken model must not hide the others' reports
            rows.append(f"| {entry.name} | {entry.category} | - | ERROR: {type(e).__name__}: {str(e)[:120]} |")
            failed += 1
    summary = ["# Model zoo report", "", "| model | category | nodes | verification |", "|---|---|---|---|", *rows]
    atomic_write(out / "summary.md", "\n".join(summary) + "\n", what="summary file")
    print("\n".join(summary))
    print(f"\nwrote {out / 'summary.md'}")
    return 1 if failed else 0


def cmd_ops(args: argparse.Namespace) -> int:
    from npu_compiler.passes.docs import npu_docs_markdown
    from torch_ir.ops.docs import operators_markdown
    from torch_ir.ops.npu import NPU_OPS
    from torch_ir.ops.registry import registered_ops

    if args.kernels:
        from npu_program.docs import kernels_markdown
        from npu_program.kernels import KERNELS

        if args.markdown:
            _markdown_out(args.markdown, kernels_markdown())
        else:
            for k in KERNELS.values():
                print(f"{k.name:32s} {k.kind:13s} {k.doc}")
        return 0
    if args.npu:
        if args.markdown:
            _markdown_out(args.markdown, npu_docs_markdown())
        else:
            for op in NPU_OPS.values():
                print(f"{op.name:12s} ({', '.join(op.inputs)}) -> {', '.join(op.outputs)}: {op.doc}")
        return 0
    if args.markdown:
        _markdown_out(args.markdown, operators_markdown())
    else:
        for name, op in sorted(registered_ops().items()):
            print(f"{name:40s} {op.doc}")
        print("(every ATen / torch.library op also runs on the generic path; see --markdown)")
    return 0


def _markdown_out(target: str, text: str) -> None:
    """``--markdown``: the text to standard output (``-``), or to the file named."""
    if target == "-":
        sys.stdout.write(text)
    else:
        from torch_ir.fileio import atomic_write

        atomic_write(target, text, what="Markdown file")
        print(f"wrote {target}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torch-ir", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    model_help = ("a zoo name (torch-ir zoo --list), package.module:factory returning (model, args[, kwargs]), or a "
                  "Hugging Face model directory (weights optional) or its config.json alone (weight-free). "
                  "Warning: a spec imports that module and calls the factory, which runs its code; "
                  "only use specs you trust")

    p = sub.add_parser("demo", help="the whole pipeline on a built-in model (extract on meta, verify against eager, "
                                    "normalize, compile, run the program, profile), with one short report")
    p.add_argument("--model", default="convnet", help=model_help)
    options.output(p, "the directory for the IR, the program and the weights", directory=True, default=DEMO_OUTPUT)
    from npu_tools.commands.run import add_timing_options

    add_timing_options(p)  # --threads, for the profile step
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("extract", help="weight-free extraction to IR JSON")
    p.add_argument("model", help=model_help)
    options.output(p, "the IR JSON file (default: <name>.json)")
    p.add_argument("--name", help="model name recorded in the IR")
    options.save_weights(p, default_help="seeded ones for a zoo model or a config.json alone")
    p.add_argument("--pretty", action="store_true", help="indent the JSON")
    p.set_defaults(func=cmd_extract)

    p = sub.add_parser("inspect", help="statistics, Mermaid and Markdown for an IR file")
    p.add_argument("ir", help="IR JSON file")
    p.add_argument("--text", action="store_true", help="print the graph, one node a line")
    p.add_argument("--mermaid", action="store_true", help="print the Mermaid DAG")
    options.markdown(p, "statistics and the Mermaid graph")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("verify", help="execute the IR and compare with PyTorch eager, node by node on failure")
    p.add_argument("model", help=model_help)
    p.add_argument("--ir", help="an IR file to verify (default: extract it now)")
    options.weights(p, default_help="default: the model's own, seeded for a zoo model")
    options.inputs(p)
    options.seed(p)
    options.tolerances(p)
    options.markdown(p, "the verification report")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("zoo", help="run the pipeline over the model zoo and write reports")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument("--category", help="only models of this category")
    options.output(p, "the directory for the reports", directory=True, default="reports")
    p.set_defaults(func=cmd_zoo)

    p = sub.add_parser("ops", help="the operator registry")
    options.markdown(p, "docs/operators.md (with --npu: docs/npu_ops.md; with --kernels: docs/kernels.md)")
    p.add_argument("--npu", action="store_true", help="the NPU op set of the normalization passes")
    p.add_argument("--kernels", action="store_true",
                   help="the kernel table of the compiler and runtime (with --markdown: docs/kernels.md)")
    p.set_defaults(func=cmd_ops)

    from .commands.normalize import add_parser as add_normalize_parser

    add_normalize_parser(sub)
    from npu_tools.commands.compile import add_parsers as add_compiler_parsers
    from npu_tools.commands.run import add_parsers as add_runtime_parsers

    add_compiler_parsers(sub)
    add_runtime_parsers(sub)
    from npu_tools.commands.cost import add_parser as add_cost_parser

    add_cost_parser(sub)
    from .commands.report import add_parser as add_report_parser

    add_report_parser(sub)
    from .commands.bisect import add_parser as add_bisect_parser

    add_bisect_parser(sub)
    from .commands.quantize import add_parser as add_quantize_parser

    add_quantize_parser(sub)
    from .commands.import_tinygrad import add_parser as add_tinygrad_parser

    add_tinygrad_parser(sub)
    from .commands.view import add_parser as add_view_parser

    add_view_parser(sub)
    from .commands.sweep import add_parser as add_sweep_parser

    add_sweep_parser(sub)
    from .commands.sweep_report import add_parser as add_sweep_report_parser

    add_sweep_report_parser(sub)
    try:
        from .commands.import_onnx import add_parser as add_onnx_parsers
    except ImportError:  # the onnx extra is not installed
        pass
    else:
        add_onnx_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input (any ``TorchIRError``, an unreadable or unwritable path) ends with one
    line on stderr and exit code 2; an unexpected exception is a bug: one line, exit code 3, and the
    traceback with ``TORCH_IR_TRACEBACK=1``."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line; see error_line
        code, line = error_line(e)
        if os.environ.get("TORCH_IR_TRACEBACK"):
            traceback.print_exc()
        print(f"torch-ir {args.command}: {line}", file=sys.stderr)
        return code


def one_line(message: str, limit: int = 4000) -> str:
    """A multi-line message (a list of nodes, a fix block) folded into the CLI's one line."""
    text = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    return text if len(text) <= limit else text[:limit] + " ..."


def error_line(e: BaseException) -> tuple[int, str]:
    """The exit code and the one line the CLI prints for ``e``."""
    from torch_ir.errors import TorchIRError

    if isinstance(e, TorchIRError):
        return 2, "error: " + one_line(getattr(e, "cli", None) or str(e))
    if isinstance(e, OSError):  # a path the user gave: missing, a directory, read-only, name too long, disk full
        where = f"{e.filename}: " if e.filename else ""
        return 2, f"error: {where}{e.strerror or e}"
    if isinstance(e, RecursionError):
        return 2, "error: the input is nested too deeply to process (a hostile or corrupt file?)"
    if isinstance(e, MemoryError):
        return 2, ("error: out of memory; the input asks for more than this machine has "
                   "(see torch_ir.limits and docs/security.md)")
    return 3, (f"internal error: {type(e).__name__}: {one_line(str(e), 400)} (this is a bug in torch-ir: "
               "please report it; set TORCH_IR_TRACEBACK=1 for the traceback)")


if __name__ == "__main__":
    sys.exit(main())
