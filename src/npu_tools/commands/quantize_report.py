"""``torch-ir quantize --report DIR``: the quantized model against the float one (per-layer SQNR and cosine, the
first layer whose error jumps, an LLM's next-token KL divergence and top-1 agreement) and, with a target, a
mixed-precision proposal costed on a hardware description: ``npu_compiler.quantize.report``'s files in DIR."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from npu_compiler.costmodel.hardware import DEFAULT_PRESET
from torch_ir.errors import TorchIRError


def add_report_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("accuracy report")
    g.add_argument("--report", metavar="DIR", help="compare the quantized model with the float one and write "
                                                    "accuracy.csv, pareto.csv, a plot and report.html into DIR")
    g.add_argument("--eval", metavar="DIR", help="a directory of .npz samples the report compares on (default: the "
                                                 "calibration samples)")
    g.add_argument("--target-sqnr", type=float, metavar="DB", help="with --report: propose a mixed-precision "
                   "assignment, widening the most sensitive layers (--ladder) until the output's SQNR is at least DB")
    g.add_argument("--target-kld", type=float, metavar="X", help="with --report: as --target-sqnr, until an LLM's "
                   "mean next-token KL divergence against float is at most X")
    g.add_argument("--ladder", default="w8a8,float", metavar="P1,P2", help="the presets a layer is widened "
                   "through, narrowest first ('float': unquantized; default w8a8,float)")
    g.add_argument("--hw", default=DEFAULT_PRESET, metavar="NAME|FILE", help="the hardware the mixed-precision table "
                   f"is costed on: a preset name or a hardware file (default {DEFAULT_PRESET})")


def check_report_options(args: argparse.Namespace) -> None:
    """The report's flags, refused before any work."""
    targets = args.target_sqnr is not None or args.target_kld is not None
    if targets and not args.report:
        raise TorchIRError("--target-sqnr/--target-kld propose a mixed-precision assignment in the report: give "
                           "--report DIR as well")
    if args.report and not (args.eval or args.calibration or args.calibration_text):
        raise TorchIRError("--report compares on sample inputs: give --eval DIR (.npz samples) or --calibration")
    if args.report:
        from npu_compiler.quantize import get_preset

        for name in _ladder(args):
            if name is not None:
                get_preset(name)  # an unknown preset in --ladder is refused now


def _ladder(args: argparse.Namespace) -> tuple[str | None, ...]:
    return tuple(None if s.strip() == "float" else s.strip() for s in args.ladder.split(",") if s.strip())


def accuracy_report(args: argparse.Namespace, ir: Any, weights: Any, qir: Any, qweights: Any, config: Any,
                    calibration: Any) -> Any:
    """The report (not yet written): the quantized IR compared with the float one, or the mixed-precision search's
    chosen assignment with every assignment tried."""
    from npu_compiler.passes import normalize
    from npu_compiler.quantize import quantize, samples_from
    from npu_compiler.quantize.report import Target, compare_quantized, propose_mixed_precision

    float_ir = ir if "normalize" in ir.metadata else normalize(ir)
    inputs = samples_from(float_ir, args.eval or calibration, args.samples or 8)
    if args.target_sqnr is None and args.target_kld is None:
        return compare_quantized(float_ir, weights, qir, qweights, inputs)
    target = Target(min_sqnr_db=args.target_sqnr, max_kld=args.target_kld)
    return propose_mixed_precision(float_ir, weights, config, calibration, inputs, target=target,
                                   quantize_fn=quantize, hardware=args.hw, ladder=_ladder(args))


def write_accuracy_report(args: argparse.Namespace, report: Any) -> list[Path]:
    from npu_compiler.quantize.report import write_report
    from torch_ir.fileio import make_output_dir

    out = make_output_dir(Path(args.report), "report directory")
    return write_report(report, out)
