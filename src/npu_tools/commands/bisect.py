"""``torch-ir bisect``: compare a model's trusted source with every pipeline stage and name what is broken.

    torch-ir bisect qwen2 -o bisect-out                       # a zoo name
    torch-ir bisect my_pkg.models:tiny --stage normalize:fuse --stage compiled:cpu
    torch-ir bisect model.onnx --input inputs.npz --rtol 1e-3
    torch-ir bisect model.json --weights model.safetensors
    torch-ir bisect my_pkg.models:tiny --weights tiny.safetensors   # loaded into the factory's model

A progress line per stage goes to stderr, the summary to stdout. Exit code 0: no stage diverges; 1: a fault or
drift was found; 2: bad input (an unknown model, stage or file, a weights file that is missing, unreadable or
not the model's, ``--weights`` with a source that has its own), printed as one line by ``npu_tools.cli.main``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from npu_tools import cli_options as options
from torch_ir.errors import InputMismatchError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``bisect`` subcommand to ``sub``."""
    from npu_tools.debug.stages import STAGE_NAMES

    p = sub.add_parser("bisect", help="find the stage, rule, node or kernel where a model's numbers go wrong, "
                                      "and write a standalone repro")
    p.add_argument("source", help="a zoo name, package.module:factory (PyTorch), a Hugging Face model directory or "
                                  "its config.json, tinygrad:package.module:factory, a .onnx file, or an IR .json "
                                  "file (with --weights)")
    options.weights(p, default_help="the weights of an IR source, or loaded into the model of a zoo name or "
                                    "module:factory; default: the model's own. An ONNX file or a tinygrad factory "
                                    "has its own weights and takes none")
    options.inputs(p, old="--inputs")  # an .npz: one array per graph input in graph order (default: seeded)
    options.seed(p)
    p.add_argument("--stage", action="append", choices=STAGE_NAMES, metavar="STAGE",
                   help=f"a stage to run (repeatable; default: all): {', '.join(STAGE_NAMES)}")
    options.tolerances(p)
    p.add_argument("--keep-going", action="store_true", help="run the stages after the first that diverges too")
    options.output(p, "the directory for report.json/.md/.html, the error plot and the repro", directory=True)
    p.set_defaults(func=cmd_bisect)


def cmd_bisect(args: argparse.Namespace) -> int:
    """Run ``torch-ir bisect``."""
    from npu_tools.debug.bisect import bisect
    from npu_tools.debug.outdir import check_output_dir
    from npu_tools.debug.repro import FILES
    from torch_ir.fileio import make_output_dir

    if args.weights:  # before anything is read: a flag that does not fit the source costs nothing
        _check_weights_flag(args.source)
    if args.output:  # before the inputs are read and the model is loaded
        check_output_dir(make_output_dir(args.output, "bisect output directory"), FILES)
    inputs = _given_inputs(args.input) if args.input else None
    report = bisect(args.source, inputs=inputs, weights=args.weights, seed=args.seed, stages=args.stage,
                    rtol=args.rtol, atol=args.atol, out_dir=args.output, keep_going=args.keep_going)
    print(report.summary())
    if args.output:
        print(f"report: {Path(args.output) / 'report.html'}")
    return 0 if report.ok else 1


def _check_weights_flag(source: str) -> None:
    """Refuse ``--weights`` for a source that brings its own weights (an ONNX file, a tinygrad factory)."""
    from npu_tools.debug.sources import NO_WEIGHTS, WEIGHTS_TAKEN_BY, SubjectError, source_form

    form = source_form(source)
    if form in NO_WEIGHTS:
        raise SubjectError(f"--weights cannot be used with {source!r}: {NO_WEIGHTS[form]}; --weights is for "
                           f"{WEIGHTS_TAKEN_BY}")


def _given_inputs(items: list[str]) -> list[Any] | dict[str, Any]:
    """``--input``: one ``FILE.npz`` (every input, in graph order) or ``NAME=FILE.npy`` items (by name)."""
    import torch

    from torch_ir.arrays import ArrayFileError, load_array

    if len(items) == 1 and "=" not in items[0]:
        return _read_inputs(items[0])
    if any("=" not in item for item in items):
        raise ArrayFileError("--input takes NAME=FILE.npy items (one per input) or one FILE.npz holding them all")
    return {name: torch.from_numpy(load_array(path, f"--input {name}"))
            for name, _, path in (item.partition("=") for item in items)}


def _read_inputs(path: str) -> list[Any]:
    """The arrays of an .npz file as tensors, in graph-input order: by index when named input_<i>, else in the order
    the file stores them (numpy.savez keeps the order of its keyword arguments). The file is read by
    ``torch_ir.arrays.load_arrays``: numeric arrays only, sized before anything is decompressed."""
    import torch

    from torch_ir.arrays import load_arrays

    arrays = load_arrays(path, "bisect inputs file")
    positional = [f"input_{i}" for i in range(len(arrays))]
    order = positional if sorted(arrays) == sorted(positional) else list(arrays)
    tensors = []
    for name in order:
        try:
            tensors.append(torch.from_numpy(arrays[name]))
        except TypeError as e:  # a numeric dtype torch has no tensor for
            raise InputMismatchError(f"bisect inputs file {path!r}, array {name!r}: dtype {arrays[name].dtype} has "
                                     f"no torch tensor type ({e}); save it as a dtype torch has (float32, int64, "
                                     "...)") from None
    return tensors
