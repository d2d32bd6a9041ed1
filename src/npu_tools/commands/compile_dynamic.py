"""``torch-ir compile --buckets seq=128,256,512``: one program file of static variants (a ``DynamicProgram``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from npu_tools.commands.import_onnx import UsageError
from torch_ir.naming import default_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    """--buckets (also the bucket set ``--report-dynamic`` compares), --range, --pad-value and --no-padding."""
    p.add_argument("--buckets", action="extend", nargs="+", default=[], metavar="SYMBOL=S1,S2,...",
                   help="compile one variant per size of a symbolic dimension (--buckets batch=1,4,16 "
                        "seq=128,256,512: every combination is a variant) into one program file; the runtime picks "
                        "the smallest that fits, padding where that changes nothing")
    p.add_argument("--upper-bound", action="store_true",
                   help="compile one program whose arena is planned for the largest sizes and whose every dispatch "
                        "is sized at run time from the input shapes (no padding); the ranges are the exported ones, "
                        "or --range")
    p.add_argument("--range", action="append", default=[], metavar="SYMBOL=LO:HI", dest="ranges",
                   help="with --buckets: the sizes the program must serve; buckets that do not cover them are "
                        "refused (default: what the buckets cover); with --upper-bound: the sizes it serves "
                        "(default: the exported range)")
    p.add_argument("--pad-value", action="append", default=[], metavar="INPUT=VALUE",
                   help="with --buckets: the value an input's padded positions take (default 0: a pad id, a zero "
                        "attention-mask entry)")
    p.add_argument("--no-padding", action="store_true",
                   help="with --buckets: serve each symbol only at its bucket sizes (never pad)")


def parse_buckets(items: list[str]) -> dict[str, list[int]]:
    """``["seq=128,256,512", "batch=1,4"]`` -> ``{"seq": [128, 256, 512], "batch": [1, 4]}``: one symbol per
    item, whole sizes, sorted; a symbol given twice or a size repeated is refused."""
    out: dict[str, list[int]] = {}
    for item in items:
        name, sep, sizes = item.partition("=")
        name = name.strip()
        parts = [p.strip() for p in sizes.split(",")]
        if not sep or not name or not all(p.isdigit() for p in parts):
            raise UsageError(f"--buckets {item!r}: expected SYMBOL=S1,S2,... with whole numbers (e.g. --buckets "
                             "seq=128,256,512)")
        if name in out:
            raise UsageError(f"--buckets {name}= is given twice; fix: give each symbol's sizes once "
                             f"(--buckets {name}=S1,S2,...)")
        values = sorted(int(p) for p in parts)
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise UsageError(f"--buckets {item!r}: size {repeated[0]} is given twice; fix: list each size once")
        if values[0] < 1:
            raise UsageError(f"--buckets {item!r}: sizes must be 1 or more")
        out[name] = values
    return out



def _parse_ranges(items: list[str]) -> dict[str, tuple[int, int]]:
    out = {}
    for item in items:
        name, _, span = item.partition("=")
        low, colon, high = span.partition(":")
        if not colon or not name.strip() or not (low.strip().isdigit() and high.strip().isdigit()):
            raise UsageError(f"--range {item!r}: expected SYMBOL=LO:HI with whole numbers (e.g. --range seq=8:512)")
        out[name.strip()] = (int(low), int(high))
    return out


def _parse_pad_values(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name.strip() or not _is_number(value):
            raise UsageError(f"--pad-value {item!r}: expected INPUT=VALUE with a number (e.g. --pad-value "
                             "attention_mask=0)")
        out[name.strip()] = float(value)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_flags(args: argparse.Namespace) -> None:
    """The --buckets companions are refused without --buckets (they would be silently ignored), and so is an ONNX
    file without --buckets or --upper-bound (a static compile takes the IR ``torch-ir import-onnx`` writes)."""
    dynamic = args.buckets or args.upper_bound
    if args.source.endswith(".onnx") and not dynamic:
        raise UsageError(f"{args.source}: compile takes an ONNX model only with --buckets or --upper-bound; for one "
                         "static program, import it first (torch-ir import-onnx MODEL.onnx --input-shape ...) and "
                         "compile the IR")
    if args.buckets and args.upper_bound:
        raise UsageError("--buckets and --upper-bound are two ways to serve several shapes: give one of them")
    if args.upper_bound:
        stray = [flag for flag, given in (("--pad-value", args.pad_value), ("--no-padding", args.no_padding))
                 if given]
        if stray:
            raise UsageError(f"{', '.join(stray)}: an upper-bound program is never padded; leave {stray[0]} out")
    elif not args.buckets:
        stray = [flag for flag, given in (("--range", args.ranges), ("--pad-value", args.pad_value),
                                          ("--no-padding", args.no_padding)) if given]
        if stray:
            raise UsageError(f"{', '.join(stray)}: used only with --buckets; add --buckets SYMBOL=S1,S2,... or "
                             f"leave {stray[0]} out")


class OnnxSource:
    """An ONNX file given to ``compile --buckets``: its weights (the initializers) and how each bucket is imported
    (``onnx_specializer``: bound at import, the model's shape arithmetic folds)."""

    def __init__(self, path: str) -> None:
        from torch_ir.frontends.onnx import import_onnx, onnx_specializer

        self.ir, self.weights = import_onnx(path)
        self.specialize = onnx_specializer(path, self.ir)


def compile_buckets(ir, spec, args: argparse.Namespace, options, bind: dict[str, int],
                    shapes: dict[str, list[int]]) -> int:
    """Compile the variants, save the one file, print its summary. The padding check runs with the model's own
    weights where they are at hand (a model source: its seeded weights; an ONNX file: its initializers; an IR
    file: ``--weights``)."""
    from npu_compiler import Buckets, UpperBound, compile
    from torch_ir.weights import module_state

    onnx = spec if isinstance(spec, OnnxSource) else None
    if args.upper_bound:
        buckets = UpperBound(_parse_ranges(args.ranges), specialize=onnx.specialize if onnx else None)
    else:
        weights = args.weights or (onnx.weights if onnx else module_state(spec.build("cpu")) if spec else None)
        buckets = Buckets(parse_buckets(args.buckets), _parse_ranges(args.ranges),
                          _parse_pad_values(args.pad_value), padding=not args.no_padding, weights=weights,
                          specialize=onnx.specialize if onnx else None)
    program = compile(ir, target=args.target, options=options, fallback=args.fallback, bind=bind,
                      input_shapes=shapes, dynamic=buckets, progress=lambda line: print(line, file=sys.stderr))
    out = Path(args.output) if args.output else default_output(program.model_name, ".npubin")
    program.save(out)
    print(program.summary())
    print(f"wrote {out}")
    return 0


__all__ = ["OnnxSource", "add_arguments", "check_flags", "compile_buckets", "parse_buckets"]
