"""``torch-ir run`` and ``torch-ir profile``: run a ``.npubin`` program with its weights."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from npu_tools import cli_options as options
from torch_ir.arrays import read_cli_inputs


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from npu_runtime.backends import BACKENDS

    for name, help_text, func in (
        ("run", "run a compiled program (.npubin) with its weights and print the outputs", cmd_run),
        ("profile", "time every dispatch of a compiled program: per kernel kind and the slowest", cmd_profile),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("program", help="a .npubin file (torch-ir compile)")
        options.weights(p, required=True, default_help="keyed by state-dict key")
        options.inputs(p)  # inputs not given are random, seeded by --seed
        options.seed(p)
        p.add_argument("--backend", choices=sorted(BACKENDS), default="cpu",
                       help="runtime backend (default: cpu); the program must be compiled for its target "
                            "(torch-ir compile --target webgpu)")
        p.set_defaults(func=func)
        if name == "run":
            options.output(p, "the outputs, as an .npz file")
            p.add_argument("--validate", action="store_true",
                           help="check every dispatch against its op's reference implementation; stop at the "
                                "first that diverges, naming it")
        else:
            add_timing_options(p, runs=20)
            options.json_file(p)


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum`` (refused as a usage error, not a traceback)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {minimum}, got {text!r}")
        return value

    return parse


def add_timing_options(p: argparse.ArgumentParser, runs: int | None = None) -> None:
    """The options of a command that times a program (``profile``; ``demo`` takes ``--threads``)."""
    if runs is not None:
        p.add_argument("--runs", type=at_least(1), default=runs, metavar="N",
                       help=f"timed runs, after the warm-up (default {runs}); the median and p10-p90 are reported")
        p.add_argument("--warmup", type=at_least(0), default=None, metavar="N",
                       help="untimed runs first (default: until the median of the last 5 stops moving, at most "
                            "200 runs or 10 s)")
    p.add_argument("--threads", type=at_least(1), default=None, metavar="N",
                   help="PyTorch intra-op threads for the runs (default: PyTorch's, one per core)")


def _setup(args: argparse.Namespace):
    from npu_program.npubin_dynamic import load_program
    from npu_runtime import Device, Executor, load_weights

    program = load_program(args.program)
    device = Device(args.backend)
    executor = Executor(program, device, validate=getattr(args, "validate", False))
    weights = load_weights(args.weights, program, device)
    specs = _random_specs(program, args.input)
    return program, executor, weights, _inputs(specs, args.input, args.seed)


def _random_specs(program, given: list[str]) -> list:
    """The input specs random inputs are made for: a dynamic program's smallest bucket (a shape its ``--input``
    arrays do not fix must come from somewhere); a static program's own."""
    variants = getattr(program, "variants", None)
    if variants is None:
        return program.input_specs
    if not given:
        print(f"inputs at the smallest bucket ({' '.join(f'{k}={v}' for k, v in variants[0].sizes.items())}); give "
              "--input arrays of any shape the program serves", file=sys.stderr)
    return variants[0].program.input_specs


def _inputs(specs: list, given: list[str], seed: int) -> dict[str, np.ndarray]:
    """Arrays from ``--input`` (``NAME=FILE.npy``, or an ``.npz`` of them all, by the toolkit's one reader); the
    others random (floats normal, integers 0 or 1, as token ids or masks)."""
    arrays = read_cli_inputs(given, [spec.name for spec in specs])
    rng = np.random.default_rng(seed)
    for spec in specs:
        if spec.name in arrays:
            continue
        if spec.dtype.startswith(("float", "bfloat")):
            arrays[spec.name] = rng.standard_normal(spec.shape).astype("float32" if spec.dtype == "bfloat16"
                                                                      else spec.dtype)
        else:
            arrays[spec.name] = rng.integers(0, 2, spec.shape).astype(spec.dtype)
        print(f"input {spec.name}: random {spec.dtype}{spec.shape} (seed {seed})", file=sys.stderr)
    return arrays


def cmd_run(args: argparse.Namespace) -> int:
    from torch_ir.fileio import check_output_path

    if args.output:  # refuse an unwritable path before the run, not after it
        check_output_path(args.output, "outputs file")
    program, executor, weights, inputs = _setup(args)
    outputs = {name: buf.to_numpy() for name, buf in executor.run(inputs, weights=weights).items()}
    variant = getattr(executor, "last_variant", None)
    if variant is None:
        print(f"{program.model_name}: {program.dispatch_count} dispatches")
    else:
        kind = "sized at" if program.template is not None else "bucket"
        print(f"{program.model_name}: {kind} {' '.join(f'{k}={v}' for k, v in variant.sizes.items())}, "
              f"{variant.program.dispatch_count} dispatches")
    for name, value in outputs.items():
        line = f"{name}: {value.dtype}{list(value.shape)} min {value.min():.5g} max {value.max():.5g} " \
               f"mean {value.mean():.5g}"
        if value.ndim == 2 and value.shape[0] <= 4 and np.issubdtype(value.dtype, np.floating):
            line += "; top-5 per row: " + "; ".join(str(np.argsort(-row)[:5].tolist()) for row in value)
        print(line)
    if args.output:
        _save_npz(Path(args.output), outputs)
        print(f"wrote {args.output}")
    return 0


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically (``torch_ir.fileio.atomic_write``): a failed write leaves no half-written file."""
    from torch_ir.fileio import atomic_write

    atomic_write(path, lambda handle: np.savez(handle, **arrays), what="outputs file")


def cmd_profile(args: argparse.Namespace) -> int:
    from torch_ir.fileio import atomic_write, check_output_path

    if args.json:  # refuse an unwritable path before the timed runs, not after them
        check_output_path(args.json, "profile file")
    _, executor, weights, inputs = _setup(args)
    profile = executor.profile(inputs, weights, runs=args.runs, warmup=args.warmup, threads=args.threads)
    print(profile.table())
    if args.json:
        atomic_write(args.json, json.dumps(profile.to_dict(), indent=1), what="profile file")
        print(f"wrote {args.json}")
    return 0
