"""``torch-ir import-tinygrad module:factory``: a tinygrad model to IR JSON (+ its weights).

The factory returns ``(model, example_inputs)``, as the PyTorch ``extract`` command's factories
do. Weights are saved by state-dict path (lazily initialized ones are realized by the importer);
``Tensor.empty`` weights give a weight-free IR.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from npu_tools import cli_options as options
from torch_ir.errors import ExtractionError, TorchIRError
from torch_ir.naming import default_output


def add_parser(subparsers: Any) -> None:
    """Add ``import-tinygrad`` and ``tinygrad-docs`` to the ``torch-ir`` command."""
    p = subparsers.add_parser("import-tinygrad", help="import a tinygrad model (module:factory) to IR JSON")
    p.add_argument("model", help="package.module:factory returning (model, example_inputs)")
    options.output(p, "the IR JSON file (default: <factory>.json)")
    p.add_argument("--name", help="model name recorded in the IR")
    p.add_argument("--input-names", help="comma-separated graph input names")
    options.save_weights(p, default_help="the realized tinygrad weights")
    p.add_argument("--literal", action="store_true", help="keep the UOp-by-UOp translation (no rewrite rules)")
    p.add_argument("--pretty", action="store_true", help="indent the JSON")
    p.set_defaults(func=cmd_import_tinygrad)
    p = subparsers.add_parser("tinygrad-docs", help="print docs/tinygrad.md (the UOp mapping table)")
    p.set_defaults(func=cmd_tinygrad_docs)


def default_device() -> None:
    """Let tinygrad run where no device was chosen: it picks its device when first imported, and the pure-Python
    one needs no compiler (``DEV=CPU`` needs clang)."""
    os.environ.setdefault("DEV", "CPU" if shutil.which("clang") else "PYTHON")


def load_factory(spec: str) -> tuple[Any, list[Any]]:
    """Import and call the factory of ``spec`` (this runs its code: trusted specs only); ExtractionError
    naming the spec if it cannot be found, is not callable, raises or exits, or returns something else."""
    from torch_ir.factory_spec import call_factory, describe
    from torch_ir.factory_spec import load_factory as find_factory

    made = call_factory(find_factory(spec), spec)
    if not isinstance(made, tuple) or len(made) != 2 or not callable(made[0]) or not isinstance(made[1], (tuple, list)):
        raise ExtractionError(f"factory {spec!r} must return (model, example_inputs), got {describe(made)}; "
                              "expected a 2-tuple of a tinygrad model and a list of example Tensors")
    return made[0], list(made[1])


def cmd_import_tinygrad(args: argparse.Namespace) -> int:
    default_device()
    import torch

    from torch_ir.fileio import check_output_path
    from torch_ir.frontends.tinygrad.importer import import_tinygrad
    from torch_ir.report import ir_statistics
    from torch_ir.weights import save_weights

    if args.output:  # every output is checked before anything runs or is written
        check_output_path(args.output, "IR file")
    if args.save_weights:
        check_output_path(args.save_weights, "weights file")
    model, inputs = load_factory(args.model)
    name = args.name or args.model.partition(":")[2]
    names = args.input_names.split(",") if args.input_names else None
    ir, weights = import_tinygrad(model, inputs, input_names=names, model_name=name, simplify=not args.literal)
    out = Path(args.output) if args.output else default_output(name, ".json")
    check_output_path(out, "IR file")
    ir.save(str(out), indent=1 if args.pretty else None)
    print(ir_statistics(ir))
    print(f"wrote {out}")
    if args.save_weights:
        if not weights:
            raise TorchIRError(f"model {name!r} has no weight data to save: it has no weights, or only "
                              "Tensor.empty declarations (a weight-free import); load or initialize them "
                              "in the factory")
        save_weights({k: torch.from_numpy(v) for k, v in weights.items()}, args.save_weights)
        print(f"wrote {len(weights)} weights to {args.save_weights}")
    return 0


def cmd_tinygrad_docs(args: argparse.Namespace) -> int:
    from torch_ir.frontends.tinygrad.docs import tinygrad_markdown

    sys.stdout.write(tinygrad_markdown())
    return 0
