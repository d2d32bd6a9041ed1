"""``torch-ir import-onnx`` and ``torch-ir verify-onnx``: the ONNX frontend on the command line.

    torch-ir import-onnx model.onnx -o model.json          IR JSON + model.safetensors, statistics
    torch-ir import-onnx model.onnx --input-shape input=1,3,224,224
    torch-ir verify-onnx model.onnx                        import, run, compare with onnxruntime

``add_parser(subparsers)`` adds both commands to the ``torch-ir`` parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from npu_tools import cli_options as options
from torch_ir.errors import TorchIRError
from torch_ir.inputs import given_or_random_inputs, write_report


class UsageError(TorchIRError, ValueError):
    """A command-line value is malformed or missing; the message says what to pass."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``import-onnx`` and ``verify-onnx`` to the ``torch-ir`` command's subparsers."""
    p = subparsers.add_parser("import-onnx", help="import an ONNX model: IR JSON + weights, statistics")
    p.add_argument("model", help="an .onnx file (external data files beside it are read)")
    options.output(p, "the IR JSON file (default: <model>.json)")
    options.save_weights(p, default_help="default: the IR path with .safetensors")
    _common(p)
    p.add_argument("--pretty", action="store_true", help="indent the JSON")
    p.set_defaults(func=cmd_import_onnx)

    p = subparsers.add_parser("verify-onnx", help="import an ONNX model, run it, compare with onnxruntime")
    p.add_argument("model", help="an .onnx file")
    p.add_argument("--ir", help="an imported IR JSON to verify instead of importing now (needs --weights)")
    options.weights(p, default_help="those of --ir")
    options.inputs(p)
    _common(p)
    options.seed(p)
    options.tolerances(p)
    options.markdown(p, "the verification report")
    p.set_defaults(func=cmd_verify_onnx)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="bind an input's dimensions (ints, or names to keep a symbol); repeatable")
    p.add_argument("--aten-only", action="store_true",
                   help="refuse ONNX ops with no ATen translation instead of keeping them as onnx.* ops")


def parse_input_shapes(items: list[str]) -> dict[str, list[int | str]]:
    """``["x=1,3,224,224", "ids=batch,8"]`` -> ``{"x": [1, 3, 224, 224], "ids": ["batch", 8]}``."""
    out: dict[str, list[int | str]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        if not sep or not dims:
            raise UsageError(f"--input-shape {item!r}: expected NAME=D0,D1,... (e.g. input=1,3,224,224)")
        out[name] = [int(d) if d.strip().lstrip("-").isdigit() else d.strip() for d in dims.split(",")]
    return out


def cmd_import_onnx(args: argparse.Namespace) -> int:
    from torch_ir.fileio import check_output_path
    from torch_ir.frontends.onnx import import_onnx
    from torch_ir.report import ir_statistics
    from torch_ir.weights import save_weights

    out = Path(args.output or Path(args.model).with_suffix(".json").name)
    weights_path = Path(args.save_weights) if args.save_weights else out.with_suffix(".safetensors")
    # both outputs are checked before the import and before either is written: never weights without an IR
    check_output_path(out, "IR file")
    check_output_path(weights_path, "weights file")
    ir, weights = import_onnx(args.model, input_shapes=parse_input_shapes(args.input_shape) or None,
                              reference_fallback=not args.aten_only)
    ir.metadata["weights_file"] = weights_path.name
    save_weights(weights, weights_path)
    ir.save(str(out), indent=1 if args.pretty else None)
    print(ir_statistics(ir))
    kept = ir.metadata.get("onnx_ops_kept", {})
    if kept:
        print(f"\n{len(kept)} node(s) kept as onnx.* ops (no ATen translation), run by the ONNX reference:")
        for node, why in list(kept.items())[:20]:
            print(f"  {node}: {why}")
    print(f"\nwrote {out} and {weights_path}")
    return 0


def cmd_verify_onnx(args: argparse.Namespace) -> int:
    from torch_ir.frontends.onnx.importer import Importer
    from torch_ir.frontends.onnx.loader import load_model
    from torch_ir.frontends.onnx.verify import check_onnx_sizes, verify_onnx
    from torch_ir.ir import load_ir
    from torch_ir.weights import load_state_dict

    shapes = parse_input_shapes(args.input_shape) or None
    if args.ir and not args.weights:
        raise UsageError("--ir needs --weights (the weights file import-onnx wrote beside it)")
    # onnxruntime runs the model too: it is checked as an import checks it, and its tensors' sizes
    loaded = load_model(args.model, shapes)
    check_onnx_sizes(loaded)
    if args.ir:
        ir, weights = load_ir(args.ir), load_state_dict(args.weights)
    else:
        name = loaded.model.graph.name or "onnx_model"
        ir, weights = Importer(loaded, name, reference_fallback=not args.aten_only).run()
    inputs = given_or_random_inputs(ir, args.input, args.seed, shapes=shapes, error=UsageError)
    ok, report = verify_onnx(ir, weights, args.model, inputs, rtol=args.rtol, atol=args.atol)
    write_report(args.markdown, report.to_markdown, str(report))
    return 0 if ok else 1


