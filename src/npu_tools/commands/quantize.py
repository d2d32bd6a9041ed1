"""``torch-ir quantize``: quantize a float model (an IR file with --weights, a zoo name, a factory, a Hugging Face
checkpoint directory) with a preset, calibrated on .npz samples or a text, into a QDQ IR and its weights."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from npu_tools import cli_options as options
from npu_tools.commands.quantize_report import (
    accuracy_report,
    add_report_options,
    check_report_options,
    write_accuracy_report,
)
from npu_tools.commands.run import at_least
from torch_ir.errors import TorchIRError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from npu_compiler.quantize import PRESET_DOCS

    p = sub.add_parser("quantize", help="quantize a float model with a preset (w8a8, w4a16, ...): a QDQ IR and its "
                                        "quantized weights")
    p.add_argument("source", help="an IR JSON file (with --weights), a zoo name, package.module:factory, or a "
                                  "Hugging Face causal-LM checkpoint directory")
    options.weights(p, default_help="for an IR file; a zoo model or factory uses its seeded weights")
    p.add_argument("--preset", default="w8a8", metavar="NAME",
                   help="; ".join(f"{k}: {v}" for k, v in PRESET_DOCS.items()) + " (default w8a8)")
    p.add_argument("--override", action="append", default=[], metavar="PATTERN=PRESET",
                   help="a preset (or float) for the layers whose node name or module path matches the fnmatch "
                        "PATTERN (repeatable; the first match wins), e.g. 'features.0=w8a8' or 'head=float'")
    p.add_argument("--group-size", type=at_least(1), metavar="N",
                   help="weights in groups of N along K (a layer whose K it does not divide: per channel)")
    p.add_argument("--strict-groups", action="store_true",
                   help="refuse a layer whose K the group size does not divide instead of falling back")
    p.add_argument("--observer", choices=("minmax", "percentile", "mse"), help="activation observer")
    p.add_argument("--kv-bits", type=int, choices=(8, 16), help="fake-quantize what an LLM writes to its KV cache")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--calibration", metavar="DIR", help="a directory of .npz files, one per sample (input "
                                                          "name -> array)")
    src.add_argument("--calibration-text", metavar="FILE", help="an LLM: a text file, tokenized with the "
                                                                "checkpoint's tokenizer, cut into --seq-len windows")
    p.add_argument("--samples", type=at_least(1), metavar="N", help="use at most N calibration samples "
                                                                    "(default: all; a text: 16)")
    p.add_argument("--seq-len", type=at_least(2), default=64, metavar="N",
                   help="tokens per calibration window of --calibration-text (default 64)")
    p.add_argument("--max-cache-len", type=at_least(2), default=256, metavar="N",
                   help="a checkpoint directory: the KV cache length of the extracted LLM (default 256)")
    options.output(p, "a directory for <name>.quant.json and <name>.quant.safetensors")
    add_report_options(p)
    p.set_defaults(func=cmd_quantize)


def _config(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    from npu_compiler.quantize import QuantizeError, get_preset

    config = get_preset(args.preset)
    if args.group_size:
        config = replace(config, weight_granularity="group", group_size=args.group_size)
    changes = {k: v for k, v in (("act_observer", args.observer), ("kv_bits", args.kv_bits)) if v is not None}
    config = replace(config, strict_groups=args.strict_groups, **changes)
    overrides = []
    for item in args.override:
        pattern, sep, preset = item.partition("=")
        if not sep or not pattern or not preset:
            raise QuantizeError(f"--override {item!r}: expected PATTERN=PRESET, e.g. 'head=float' or 'conv1=w8a8'")
        overrides.append((pattern, None if preset == "float" else preset))
    return config.with_overrides(overrides) if overrides else config


def _needs_calibration(config: Any) -> bool:
    from npu_compiler.quantize import get_preset

    layers = [config] + [get_preset(v) if isinstance(v, str) else v for _, v in config.overrides if v is not None]
    return bool(config.kv_bits) or any(c.act_dtype is not None for c in layers)


def _progress():
    from tqdm import tqdm

    bar: dict[str, Any] = {}

    def step(done: int, total: int) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, desc="calibrating", unit="sample", leave=False, disable=None,
                              file=sys.stderr)
        bar["bar"].update(1)
        if done == total:
            bar.pop("bar").close()

    return step


def _model(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(IR, weights, tokenizer or None) of the source."""
    from torch_ir.frontends.hf_checkpoint import is_checkpoint_dir, load_checkpoint

    if is_checkpoint_dir(args.source):
        from torch_ir.frontends.hf import extract_lm

        checkpoint = load_checkpoint(args.source)
        ir = extract_lm(checkpoint.build_on_meta(), args.max_cache_len, name=Path(args.source).name)
        return ir, checkpoint.state_dict(), checkpoint
    from npu_tools.commands.normalize import _load

    ir, spec = _load(args.source)
    if spec is None:
        if not args.weights:
            raise TorchIRError(f"{args.source} is an IR file: give its weights with --weights FILE")
        return ir, args.weights, None
    from torch_ir.weights import module_state

    return ir, (args.weights or module_state(spec.build("cpu"))), None


def _calibration(args: argparse.Namespace, ir: Any, tokenizer: Any) -> Any:
    from torch_ir.fileio import read_input

    if args.calibration:
        return args.calibration
    if not args.calibration_text:
        return None
    if tokenizer is None:
        raise TorchIRError("--calibration-text needs a Hugging Face checkpoint directory as the model (its tokenizer "
                           "turns the text into tokens); for another model give --calibration DIR of .npz files")
    from npu_compiler.passes import normalize
    from npu_compiler.quantize import text_samples

    text = read_input(args.calibration_text, "calibration text").decode("utf-8", errors="replace")
    seq_len = min(args.seq_len, args.max_cache_len)
    return text_samples(normalize(ir), tokenizer.encode(text), args.samples or 16, seq_len)


def cmd_quantize(args: argparse.Namespace) -> int:
    from npu_compiler.quantize import quantize
    from torch_ir.fileio import check_writable_dir, make_output_dir
    from torch_ir.ir import check_integrity
    from torch_ir.weights import save_weights

    config = _config(args)  # a bad preset or override is refused before the model is loaded
    if _needs_calibration(config) and not (args.calibration or args.calibration_text):
        what = "activations (or the KV cache)" if config.kv_bits else "activations"
        raise TorchIRError(f"--preset {args.preset} quantizes {what}: give --calibration DIR (.npz samples) or "
                           "--calibration-text FILE (an LLM), or a weight-only preset (w8a16, w4a16)")
    check_report_options(args)
    target = Path(args.output or "quantized")
    # refuse an unwritable output before the work; the directory itself is made only once there is a result
    check_writable_dir(target if target.is_dir() else target.parent, "output directory", target=target)
    ir, weights, tokenizer = _model(args)
    calibration = _calibration(args, ir, tokenizer)
    qir, qweights = quantize(ir, weights, config, calibration, samples=args.samples, progress=_progress())
    report = accuracy_report(args, ir, weights, qir, qweights, config, calibration) if args.report else None
    out_dir = make_output_dir(target, "output directory")
    name = qir.model_name.replace("/", "_") or "model"
    ir_path, w_path = out_dir / f"{name}.quant.json", out_dir / f"{name}.quant.safetensors"
    check_integrity(qir, source=f"the quantized IR {qir.model_name!r}")  # before either file is written
    save_weights(qweights, w_path)  # each file is written whole or not at all (torch_ir.fileio.atomic_write)
    qir.save(ir_path)
    layers = qir.metadata["quantize"]["layers"]
    print(f"{qir.model_name}: {config.name}, {len(layers)} layer(s) quantized; "
          f"ops {dict(list(qir.op_histogram().items())[:6])}")
    print(f"wrote {ir_path}")
    print(f"wrote {w_path}")
    if report is not None:
        print(report.summary())
        for path in write_accuracy_report(args, report):
            print(f"wrote {path}")
    return 0
