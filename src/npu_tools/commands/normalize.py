"""``torch-ir normalize``: rewrite an IR (a file, or a model extracted now) into the NPU op set."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from npu_tools import cli_options as options
from torch_ir.naming import default_output


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("normalize", help="clean up, canonicalize and fuse an IR into the NPU op set")
    p.add_argument("source", nargs="?", help="an IR JSON file, a zoo name, package.module:factory, or a Hugging "
                                             "Face model directory or its config.json")
    options.output(p, "the normalized IR JSON (default: <name>.npu.json)")
    p.add_argument("--disable", action="append", default=[], metavar="FAMILY",
                   help="switch a rule family off (repeatable): see --list-rules")
    p.add_argument("--disable-rule", action="append", default=[], metavar="RULE", help="switch one rule off")
    p.add_argument("--bits", type=int, help="QConfig default bit-width recorded on float tensors")
    p.add_argument("--node-prefix", help="rename nodes <prefix>0, <prefix>1, ...")
    p.add_argument("--tensor-prefix", help="rename intermediate tensors <prefix>0, ...")
    options.markdown(p, "the normalization report (Markdown + Mermaid)")
    p.add_argument("--verify", action="store_true",
                   help="for a model: verify the normalized IR against the model with its weights (seeded ones "
                        "for a zoo model or a config.json alone)")
    p.add_argument("--list-rules", action="store_true", help="list the rules by family and exit")
    p.set_defaults(func=cmd_normalize)


def cmd_normalize(args: argparse.Namespace) -> int:
    from npu_compiler.passes import ALL_RULES, NormalizeOptions, QConfig, normalize
    from torch_ir.fileio import atomic_write, check_output_path
    from torch_ir.report import normalize_report, normalize_summary

    if args.list_rules:
        for rule in ALL_RULES:
            print(f"{rule.family:11s} {rule.name:26s} {rule.doc}")
        return 0
    if not args.source:
        print("torch-ir normalize: give an IR file or a model (or --list-rules)", file=sys.stderr)
        return 2
    try:
        options = NormalizeOptions(
            disable=set(args.disable), disabled_rules=set(args.disable_rule), node_prefix=args.node_prefix,
            tensor_prefix=args.tensor_prefix, qconfig=QConfig(default=args.bits) if args.bits else None)
    except ValueError as e:
        print(f"torch-ir normalize: {e}", file=sys.stderr)
        return 2
    if args.output:  # refuse unwritable outputs before the work, and before writing either of them
        check_output_path(args.output, "IR file")
    if args.markdown not in (None, "-"):
        check_output_path(args.markdown, "report file")
    ir, spec = _load(args.source)
    npu_ir = normalize(ir, options)
    out = Path(args.output) if args.output else default_output(ir.model_name, ".npu.json")
    check_output_path(out, "IR file")
    npu_ir.save(out)
    print(normalize_summary(npu_ir))
    print(f"wrote {out}")
    if args.markdown == "-":
        print(normalize_report(npu_ir))
    elif args.markdown:
        atomic_write(args.markdown, normalize_report(npu_ir), what="report file")
        print(f"wrote {args.markdown}")
    if args.verify:
        return _verify(npu_ir, spec)
    return 0


def _load(source: str):
    """An IR file as it is, an ONNX file imported, or a model (anything ``resolve_spec`` takes) extracted now on the
    meta device, with its spec (None for a file). ``normalize``, ``compile``, ``partition``, ``cost``, ``report`` and
    ``view`` all load their source here."""
    from torch_ir.frontends.hf_model import is_hf_model_path
    from torch_ir.ir import load_ir

    if source.endswith(".onnx") and Path(source).is_file():
        from torch_ir.frontends.onnx import import_onnx

        return import_onnx(source)[0], None

    # a Hugging Face config.json is a model, not an IR, although it is a .json file
    if not is_hf_model_path(source) and (source.endswith(".json") or Path(source).is_file()):
        return load_ir(source), None
    from npu_tools.zoo.runner import resolve_spec

    spec = resolve_spec(source)
    return spec.extract(spec.build("meta")), spec


def _verify(npu_ir, spec) -> int:
    """The normalized IR against the model itself, by the verifier (per output, then per node)."""
    from torch_ir.verify import verify_ir
    from torch_ir.weights import module_state

    if spec is None:
        print("--verify needs a model (not an IR file): it runs the IR with the model's seeded weights",
              file=sys.stderr)
        return 2
    model = spec.build("cpu")
    ok, report = verify_ir(npu_ir, module_state(model), model, spec.args, test_kwargs=spec.kwargs)
    print(report)
    return 0 if ok else 1
