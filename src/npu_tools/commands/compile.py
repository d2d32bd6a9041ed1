"""``torch-ir compile`` and ``torch-ir partition``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from npu_compiler.library import Target
from npu_compiler.llm import DEFAULT_CHUNK
from npu_compiler.passes.precision import PRECISIONS
from npu_tools import cli_options as options
from npu_tools.commands.compile_dynamic import OnnxSource, check_flags, compile_buckets
from npu_tools.commands.compile_dynamic import add_arguments as add_dynamic_arguments
from npu_tools.commands.dynamic_report import add_arguments as add_report_arguments
from npu_tools.commands.dynamic_report import run_report, wants_report
from npu_tools.commands.import_onnx import UsageError, parse_input_shapes
from torch_ir.naming import default_output


def add_parsers(sub: argparse._SubParsersAction) -> None:
    source_help = ("an IR JSON file, a zoo name, package.module:factory, or a Hugging Face model directory or its "
                   "config.json (extracted now, on meta; no weights are read)")
    p = sub.add_parser("compile", help="compile an IR into a program of kernel dispatches (.npubin)")
    p.add_argument("source", help=source_help)
    options.output(p, "the program file (default: <name>.npubin)")
    p.add_argument("--target", default="cpu", help="kernel library to compile for (default: cpu)")
    p.add_argument("--no-fuse", action="store_true",
                   help="one dispatch per node: no kernel fusion (a CONV keeps its residual add apart)")
    p.add_argument("--memory", default="greedy_by_size", choices=("greedy_by_size", "naive"),
                   help="memory planning strategy (naive: no reuse, for comparison)")
    p.add_argument("--no-ir", action="store_true", help="leave the normalized IR out of the program file")
    p.add_argument("--fallback", choices=("cpu",), default=None,
                   help="run the nodes the target has no kernel for on the host CPU inside the program (host "
                        "dispatches) instead of refusing the model; the summary shows the placement")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                   help=f"an LLM with a KV cache: the smallest prefill bucket in tokens (default: {DEFAULT_CHUNK})")
    p.add_argument("--prefill-buckets", metavar="N,N,...",
                   help="an LLM with a KV cache: the prompt lengths the prefill is compiled for, one program file "
                        "(default: --chunk doubled up to the cache length, the largest arena within 1 GiB)")
    p.add_argument("--bind", action="append", default=[], metavar="SYMBOL=SIZE",
                   help="fix a symbolic dimension (a dynamic batch: --bind batch=1); repeatable")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="fix an input's symbolic dimensions by its shape (--input-shape x=1,3,224,224); repeatable")
    add_dynamic_arguments(p)
    p.add_argument("--name", help="the program's model name (default: the IR's)")
    p.add_argument("--precision", choices=sorted(PRECISIONS), default=None,
                   help="compute a float model in this dtype (weights and activations; the program's inputs and "
                        "outputs keep theirs); the summary gives the error against fp32 on seeded inputs when the "
                        "weights are at hand (a model source, or --weights)")
    options.kv_bits(p)
    options.weights(p, default_help="with an IR file: the weights to measure --precision's error with, and to check "
                                    "--buckets' padding with")
    options.inputs(p)
    options.seed(p)
    add_report_arguments(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("partition", help="placement summary: which nodes run on the NPU, which on the CPU and why")
    p.add_argument("source", help=source_help)
    p.add_argument("--target", default="cpu", help="kernel library to place against (default: cpu)")
    p.add_argument("--hw", metavar="HARDWARE",
                   help="place against the kernels of the NPU described in HARDWARE (a hardware .toml/.json file or "
                        "cost-model preset with a [kernels] supported = [...] list): the rest goes to the CPU")
    options.json_file(p)  # the plan: placements and partitions
    p.set_defaults(func=cmd_partition)

    from .generate import add_parser as add_generate_parser

    add_generate_parser(sub)


def _load(source: str):
    ir, _ = _load_with_spec(source)
    return ir


def _load_with_spec(source: str):
    from npu_tools.commands.normalize import _load as load_ir_or_model

    return load_ir_or_model(source)


def cmd_compile(args: argparse.Namespace) -> int:
    from npu_compiler import CompileOptions, UnsupportedOpsError, compile, is_op_supported, partition
    from npu_compiler.llm import is_lm
    from torch_ir.fileio import check_output_path

    if args.output:  # refuse an unwritable path before compiling, not after
        check_output_path(args.output, "program file")
    check_flags(args)
    bind = _parse_bind(args.bind)
    shapes = parse_input_shapes(args.input_shape)
    if args.source.endswith(".onnx"):  # with --buckets (check_flags): imported once per bucket
        spec = OnnxSource(args.source)
        ir = spec.ir
    else:
        ir, spec = _load_with_spec(args.source)
    if args.name:
        ir.model_name = args.name
    if wants_report(args):  # --report-dynamic: a report on buckets, no program
        return run_report(args, ir)
    options = CompileOptions(fuse=not args.no_fuse, memory_strategy=args.memory, embed_ir=not args.no_ir,
                             precision=args.precision)
    if is_lm(ir):
        if args.buckets or args.upper_bound:
            raise UsageError(f"--buckets/--upper-bound: IR {ir.model_name!r} is an LLM with a KV cache, whose prefill "
                             "and decode programs are made by compile's LLM path; leave them out")
        return _compile_lm(ir, args, options)
    if args.kv_bits is not None:
        raise UsageError(f"--kv-bits: IR {ir.model_name!r} has no KV cache (not an LLM extracted with its cache); "
                         "leave --kv-bits out")
    if args.buckets or args.upper_bound:
        return compile_buckets(ir, spec, args, options, bind, shapes)
    try:
        program = compile(ir, target=args.target, options=options, fallback=args.fallback, bind=bind,
                          input_shapes=shapes)
    except UnsupportedOpsError as e:
        print(f"torch-ir compile: {e}\n", file=sys.stderr)
        print(partition(ir, is_op_supported, target=args.target).summary())
        print("nothing written", file=sys.stderr)
        return 1
    note = _precision_error(program, ir, spec, args, bind, shapes) if args.precision else None
    out = Path(args.output) if args.output else default_output(program.model_name, ".npubin")
    program.save(out)
    print(program.summary())
    if note:
        print(note)
    print(f"wrote {out}")
    return 0


def _precision_error(program, ir, spec, args: argparse.Namespace, bind: dict[str, int],
                     shapes: dict[str, list[int]]) -> str | None:
    """Measure ``--precision``'s error against fp32 into the program (``npu_compiler.precision``): with the model's
    seeded weights and example inputs for a model source, with ``--weights`` and seeded (or ``--input``) inputs for
    an IR file; else a note saying how to have it."""
    from npu_compiler.precision import attach, precision_error
    from npu_compiler.static_shapes import bind_shapes
    from torch_ir.inputs import given_or_random_inputs
    from torch_ir.weights import module_state

    static = bind_shapes(ir, bind, shapes)
    if spec is not None and not args.weights:
        model = spec.build("cpu")
        weights, note = module_state(model), "the model's example inputs, seeded weights"
        named = dict(spec.kwargs or {})  # example keyword inputs, by the graph input they became
        inputs = [*spec.args, *(named.get(t.name) for t in static.graph_inputs[len(spec.args):])]
        if any(x is None for x in inputs):  # an input the model's examples leave out (a default): seeded values
            seeded = given_or_random_inputs(static, [], args.seed, error=UsageError)
            inputs = [s if x is None else x for x, s in zip(inputs, seeded)]
            note += f", seeded values (--seed {args.seed}) for inputs without an example"
    elif args.weights:
        weights = args.weights
        inputs = given_or_random_inputs(static, args.input, args.seed, error=UsageError)
        note = f"seeded inputs (--seed {args.seed})" if not args.input else "the --input arrays"
    else:
        return ("error against fp32: not measured (an IR file carries no weights: give --weights FILE, or compile "
                "the model itself)")
    attach(program, precision_error(static, args.precision, weights, inputs, inputs_note=note))
    return None


def _parse_bind(items: list[str]) -> dict[str, int]:
    """``["batch=1", "seq=128"]`` -> ``{"batch": 1, "seq": 128}``."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep or not name.strip() or not size.strip().isdigit():
            raise UsageError(f"--bind {item!r}: expected SYMBOL=SIZE with a whole number (e.g. --bind batch=1)")
        out[name.strip()] = int(size)
    return out


def _compile_lm(ir, args: argparse.Namespace, options) -> int:
    """An LLM with a KV cache: prefill (prompt-length buckets) and decode programs in one directory, and the
    per-phase dispatch table."""
    from npu_compiler.llm import compile_lm, fusion_table, unfused_options

    buckets = _prefill_buckets(args.prefill_buckets)
    programs = compile_lm(ir, chunk=args.chunk, target=args.target, options=options, fallback=args.fallback,
                          kv_bits=args.kv_bits, prefill_buckets=buckets)
    out = Path(args.output) if args.output else default_output(ir.model_name, "_lm")
    programs.save(out)
    print(programs.decode.summary())
    print(programs.prefill.summary())
    # the same IR without the transformer fusions (host fallback for what has no unfused kernel): what they buy, at
    # the smallest bucket only (the table shows one prefill run)
    unfused = compile_lm(ir, target=args.target, options=unfused_options(), fallback="cpu",
                         prefill_buckets=[programs.chunk])
    print(fusion_table(unfused, programs))
    print(f"wrote {out}/prefill.npubin (prefill buckets {','.join(map(str, programs.prefill_buckets))}), "
          f"{out}/decode.npubin (weights and KV cache shared)")
    return 0


def _prefill_buckets(text: str | None) -> list[int] | None:
    """``"16,64,256"`` -> ``[16, 64, 256]``; None -> None (the default buckets)."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",")]
    if not items or not all(t.isdigit() and int(t) > 0 for t in items):
        raise UsageError(f"--prefill-buckets {text!r}: expected prompt lengths in tokens, comma-separated whole "
                         "numbers above 0 (e.g. --prefill-buckets 16,64,256)")
    return [int(t) for t in items]


def cmd_partition(args: argparse.Namespace) -> int:
    from npu_compiler import is_op_supported, partition
    from torch_ir.fileio import atomic_write, check_output_path

    if args.json:
        check_output_path(args.json, "partition plan file")
    target, note = _partition_target(args)  # a bad hardware file is refused before the model is loaded
    plan = partition(_load(args.source), is_op_supported, target=target)
    print(plan.summary())
    if note:
        print(f"note: {note}")
    if args.json:
        atomic_write(args.json, json.dumps(plan.to_dict(), indent=1), what="partition plan file")
        print(f"wrote {args.json}")
    return 0


def _partition_target(args: argparse.Namespace) -> tuple[Target, str]:
    """``--target``, narrowed to the kernels of ``--hw``'s NPU, and a note when nothing narrows it: the default
    target (the host's own kernel library) has every kernel, so alone it places the whole model on the "NPU"."""
    from npu_compiler.library import get_target, target_for_hardware

    target = get_target(args.target)
    if args.hw is None:
        note = ("target 'cpu' has every kernel; --hw FILE places against an NPU's own [kernels] list (torch-ir "
                "cost --hw-template writes a hardware file to start from)") if args.target == "cpu" else ""
        return target, note
    from npu_compiler.costmodel.hardware import load_hardware

    hw = load_hardware(args.hw)
    if hw.kernels is None:
        return target, (f"{hw.described_in} declares no [kernels] list, so every kernel of target {target.name!r} "
                        "is assumed; add [kernels] supported = [...] for the NPU's own")
    return target_for_hardware(hw, target), ""
