"""Compile coverage: which real models compile into one program, and does every one run equal to its reference?

    .venv/bin/python bench/compile_coverage/run.py                          # every model (a few minutes)
    .venv/bin/python bench/compile_coverage/run.py --source onnx            # the nine ONNX CNNs
    .venv/bin/python bench/compile_coverage/run.py --models bert,swin --json rows.json
    .venv/bin/python bench/compile_coverage/run.py --dag        # fall back through partition + DAGExecutor

The models (``models.py``): the built-in zoo (``npu_tools.zoo``), about sixty transformers architectures
from tiny configs with seeded random weights, and the nine classic CNNs that ship with the ``onnx``
package (light models, their constant weights replaced by seeded random ones).

PyTorch models are built on the meta device and extracted (``torch_ir.extract_ir``, static shapes at
the example inputs); ONNX models are imported (``torch_ir.import_onnx``). The IR is first run by the
reference executor (``torch_ir.IRExecutor``) and compared with the reference: an IR that cannot run or
differs is a frontend failure, not the compiler's. Then ``npu_compiler.compile``:

- **whole**: one program, run by ``npu_runtime.Executor``;
- **partitioned**: ``compile`` raised ``UnsupportedOpsError``; the nodes it lists are the ops that
  fell back. The model is then compiled with ``compile(..., fallback="cpu")`` when the compiler has
  that mode (host dispatches: those of the listed nodes), else split with ``npu_compiler.partition``
  and run by ``npu_runtime.DAGExecutor`` (host dispatches: the nodes placed on the CPU);
- **failed**: any other compile or run error; **extract failed**: the frontend could not produce IR,
  or not one that runs equal to the reference (listed, and left out of the percentage's denominator).

Every output is compared with eager PyTorch's (onnxruntime's for ONNX models) on the same seeded
inputs and weights: dtype-aware tolerance (``torch_ir.verify.default_tolerance``; float32 rtol 1e-4,
atol 1e-5) with atol scaled by the output's largest magnitude (when above 1), since compiled kernels
(folded batch norms, NHWC convolutions) sum in another order than eager does. Integers are exact.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import json
import platform
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE))

import npu_compiler  # noqa: E402
from models import OnnxModel, onnx_entries, randomized_light_model, transformers_entries, zoo_entries  # noqa: E402
from npu_compiler.llm import is_lm, sequence_symbol  # noqa: E402
from npu_runtime import Device, Executor, load_weights  # noqa: E402
from npu_tools.zoo import ZooEntry  # noqa: E402
from torch_ir import extract_ir  # noqa: E402
from torch_ir.ir import NPU_IR, specialize  # noqa: E402
from torch_ir.verify import compare_tensors, default_tolerance  # noqa: E402
from torch_ir.weights import module_state  # noqa: E402

SOURCES = ("zoo", "transformers", "onnx")
Model = ZooEntry | OnnxModel
Timer = Callable[[str, Callable[[], Any]], Any]  # timed(stage, fn): fn() with its seconds added to the stage


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ExtractError(Exception):
    """The frontend (``extract_ir`` / ``import_onnx``) could not produce IR for the model, or not one that runs."""

    def __init__(self, message: str, nodes: int | None = None) -> None:
        super().__init__(message)
        self.nodes = nodes


@dataclass
class Case:
    """What one model needs to be compiled and checked: its IR, weights, inputs and reference outputs."""

    ir: NPU_IR
    weights: Mapping[str, torch.Tensor]
    inputs: list[torch.Tensor]
    expected: list[torch.Tensor]


@dataclass
class Row:
    model: str
    source: str
    nodes: int | None = None
    status: str = ""  # "whole", "partitioned", "failed: ...", "extract failed: ..."
    runner: str = ""  # "program", "fallback program", "DAGExecutor"
    dispatches: int | None = None  # all of them, host ones included
    host: int | None = None  # those that run on the host CPU (DAGExecutor: the nodes of its CPU partitions)
    fell_back: dict[str, int] = field(default_factory=dict)  # op -> nodes
    reasons: dict[str, str] = field(default_factory=dict)  # op -> why (the first node's reason)
    equal: bool | None = None
    max_abs_error: float | None = None
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def extract_failed(self) -> bool:
        return self.status.startswith("extract failed")


# -- preparing a case ------------------------------------------------------------------------------------

def leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of a nested output or input, in the order ``torch.export`` flattens them."""
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def one_line(error: BaseException) -> str:
    """The error in one line: its first line, and the last one that is not a "Fix:" when the first ends in ':'."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    detail = [line for line in lines[1:] if not line.startswith("Fix:")]
    if text.endswith(":") and detail:
        text = f"{text} {detail[-1]}"
    return f"{type(error).__name__}: {text[:240]}".rstrip(": ")


def torch_case(entry: ZooEntry, timed: Timer) -> Case:
    """Extract on meta (static shapes: programs are planned for them), and run eager with seeded weights."""
    args, kwargs = entry.example_inputs()
    meta = timed("build", lambda: entry.build("meta"))
    try:
        ir = timed("extract", lambda: extract_ir(meta, args, example_kwargs=kwargs, model_name=entry.name))
    except Exception as e:  # noqa: BLE001 - any frontend failure is one row of the table
        raise ExtractError(one_line(e)) from e
    real = entry.build("cpu")
    state = {k: v.detach().clone() for k, v in module_state(real).items()}  # before eager updates any buffer
    with torch.no_grad():
        expected = timed("eager", lambda: leaves(real(*args, **kwargs)))
    case = Case(ir, state, leaves((args, kwargs)), expected)
    timed("reference IR", lambda: check_ir(case))
    return case


def onnx_case(model: OnnxModel, timed: Timer) -> Case:
    """Import the light model with seeded random weights; onnxruntime gives the reference."""
    from torch_ir import import_onnx

    proto = randomized_light_model(model.path)
    try:
        ir, weights = timed("import", lambda: import_onnx(proto, model_name=model.name))
    except Exception as e:  # noqa: BLE001
        raise ExtractError(one_line(e)) from e
    shape = [int(d) for d in ir.graph_inputs[0].shape]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    expected = timed("onnxruntime", lambda: ort_run(proto.SerializeToString(), [x]))
    case = Case(ir, weights, [x], expected)
    timed("reference IR", lambda: check_ir(case))
    return case


def check_ir(case: Case) -> None:
    """The IR itself, run by the reference executor, must equal the reference: else no program can, and the
    model counts as a frontend failure (an IR that needs weights the model lacks, a device-specific trace)."""
    from torch_ir import IRExecutor

    weights = {k: v.clone() for k, v in case.weights.items()} if case.ir.mutations else dict(case.weights)
    try:
        outputs = IRExecutor(case.ir, weights).run(case.inputs)
    except Exception as e:  # noqa: BLE001
        raise ExtractError(f"the IR does not run on IRExecutor: {one_line(e)}", len(case.ir.nodes)) from e
    ok, error = compare(outputs, case.expected)
    if not ok:
        raise ExtractError(f"the IR's outputs differ from the reference (max abs error {error:.2e})",
                           len(case.ir.nodes))


def ort_run(model_bytes: bytes, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # not the warning about every unused __SHAPE initializer of the light models
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    return [torch.from_numpy(np.asarray(y)) for y in session.run(None, feeds)]


# -- compiling and running -------------------------------------------------------------------------------

def compiler_has_fallback() -> bool:
    return "fallback" in inspect.signature(npu_compiler.compile).parameters


def host_dispatches(program: Any, host_nodes: set[str]) -> int:
    """The program's dispatches that run on the host CPU (``Dispatch.host`` set; else those of the listed nodes)."""
    listed = getattr(program, "host_dispatches", None)
    if isinstance(listed, list):
        return len(listed)
    return sum(d.node in host_nodes for d in program.dispatches)


def run_program(program: Any, weights: Mapping[str, torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    device = Device()
    executor = Executor(program, device)
    bound = load_weights(dict(weights), program, device)
    if len(program.input_specs) != len(inputs):
        raise RuntimeError(f"the program takes {len(program.input_specs)} inputs, the model {len(inputs)}")
    feeds = {s.name: np.ascontiguousarray(x.detach().numpy()) for s, x in zip(program.input_specs, inputs)}
    outputs = executor.run(feeds, weights=bound)
    return [torch.from_numpy(outputs[s.name].to_numpy()) for s in program.output_specs]


def run_partitioned(ir: NPU_IR, weights: Mapping[str, torch.Tensor], inputs: list[torch.Tensor],
                    row: Row) -> list[torch.Tensor]:
    """``partition`` + ``DAGExecutor``, for a compiler without ``fallback=``."""
    from npu_runtime import DAGExecutor

    plan = npu_compiler.partition(ir, npu_compiler.is_op_supported)
    dag = DAGExecutor(plan)
    host = len(plan.cpu_placements())  # each CPU node is one host call of the reference executor
    row.runner, row.dispatches, row.host = "DAGExecutor", dag.dispatch_count + host, host
    dag.load_weights(dict(weights))
    names = [t.name for t in plan.ir.graph_inputs]
    if len(names) != len(inputs):
        raise RuntimeError(f"the graph takes {len(names)} inputs, the model {len(inputs)}")
    outputs = dag.execute({name: x.detach() for name, x in zip(names, inputs)})
    return [torch.from_numpy(outputs[t.name]) for t in plan.ir.graph_outputs]


def compile_and_run(case: Case, row: Row, timed: Timer,
                    dag: bool = False) -> list[torch.Tensor]:
    """Compile whole, or fall back (``dag``: through ``partition`` + ``DAGExecutor`` even when ``compile`` has
    ``fallback=``); fills in the row's status, dispatches and fallen-back ops."""
    ir = case.ir
    if is_lm(ir):  # an LLM with a KV cache: the program of the example's length (compile_lm makes two of them)
        ids = [t.name for t in ir.graph_inputs].index("input_ids")
        ir = specialize(ir, {sequence_symbol(ir): int(case.inputs[ids].shape[-1])})
        case = dataclasses.replace(case, ir=ir)
    try:
        program = timed("compile", lambda: npu_compiler.compile(case.ir))
    except npu_compiler.UnsupportedOpsError as e:
        row.status = "partitioned"
        for _, op, reason in e.unsupported:
            row.fell_back[op] = row.fell_back.get(op, 0) + 1
            row.reasons.setdefault(op, reason)
        if dag or not compiler_has_fallback():
            return timed("run", lambda: run_partitioned(case.ir, case.weights, case.inputs, row))
        program = timed("compile", lambda: npu_compiler.compile(case.ir, fallback="cpu"))
        row.runner, row.host = "fallback program", host_dispatches(program, {node for node, _, _ in e.unsupported})
    else:
        row.status, row.runner = "whole", "program"
    row.dispatches = program.dispatch_count
    return timed("run", lambda: run_program(program, case.weights, case.inputs))


def compare(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> tuple[bool, float]:
    """(all outputs within tolerance, largest absolute error)."""
    if len(actual) != len(expected):
        return False, float("inf")
    ok, worst = True, 0.0
    for i, (a, e) in enumerate(zip(actual, expected)):
        if e.dtype == torch.bfloat16:
            a = a.to(e.dtype)  # NPUBuffer.to_numpy widens bfloat16 to float32
        rtol, atol = default_tolerance(e.dtype)
        if e.is_floating_point() and e.numel():
            atol *= max(1.0, float(e.detach().abs().float().nan_to_num(0.0, 0.0, 0.0).max()))
        diff = compare_tensors(f"output {i}", a, e.detach(), rtol=rtol, atol=atol)
        ok &= diff.ok
        worst = max(worst, diff.max_abs)
    return ok, worst


def bench_model(model: Model, source: str, dag: bool = False) -> Row:
    row = Row(model.name, source)
    start = time.perf_counter()

    def timed(stage: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        try:
            return fn()
        finally:
            row.stages[stage] = row.stages.get(stage, 0.0) + time.perf_counter() - t

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers and the exporter are chatty
        try:
            case = onnx_case(model, timed) if isinstance(model, OnnxModel) else torch_case(model, timed)
            row.nodes = len(case.ir.nodes)
            outputs = compile_and_run(case, row, timed, dag)
            row.equal, row.max_abs_error = compare(outputs, case.expected)
        except ExtractError as e:
            row.status, row.nodes = f"extract failed: {e}", e.nodes
        except Exception as e:  # noqa: BLE001 - a failure of any kind is one row of the table
            stage = next(reversed(row.stages), "build")
            row.status = f"failed ({stage}): {one_line(e)}"
    row.seconds = time.perf_counter() - start
    return row


# -- reporting -------------------------------------------------------------------------------------------

def short_op(op: str) -> str:
    """``aten.constant_pad_nd.default`` -> ``constant_pad_nd``; other overloads are kept."""
    return op.removeprefix("aten.").removesuffix(".default")


def table(rows: list[Row]) -> str:
    lines = ["| model | source | nodes | compiled | dispatches | ops that fell back | equal (max abs err) | s |",
             "|---|---|---:|---|---:|---|---|---:|"]
    for r in rows:
        dispatches = "" if r.dispatches is None else f"{r.dispatches}" + (f" ({r.host} host)" if r.host else "")
        ops = ", ".join(f"{short_op(op)}: {n}" for op, n in sorted(r.fell_back.items()))
        equal = "" if r.equal is None else f"{'yes' if r.equal else '**NO**'} ({r.max_abs_error:.1e})"
        status = r.status.replace("|", "\\|")
        lines.append(f"| {r.model} | {r.source} | {r.nodes if r.nodes is not None else ''} | {status} | "
                     f"{dispatches} | {ops} | {equal} | {r.seconds:.1f} |")
    return "\n".join(lines)


def totals(rows: list[Row]) -> str:
    counted = [r for r in rows if not r.extract_failed]
    n = len(counted)
    whole = sum(r.status == "whole" for r in counted)
    parted = sum(r.status == "partitioned" for r in counted)
    failed = n - whole - parted
    ran = [r for r in counted if r.equal is not None]
    unequal = [r.model for r in ran if not r.equal]
    text = (f"**{n} models: {whole} compile whole ({100 * whole / max(n, 1):.0f} %), {parted} partitioned, "
            f"{failed} failed; all {len(ran)} that ran equal to the reference: {'no' if unequal else 'yes'}**")
    if unequal:
        text += f" (unequal: {', '.join(unequal)})"
    extract = [r.model for r in rows if r.extract_failed]
    if extract:
        text += f"; extract failed, not counted: {len(extract)} ({', '.join(extract)})"
    return text


def fallback_ops(rows: list[Row]) -> list[tuple[str, int, int, str]]:
    """(op, models affected, nodes, reason), most models first."""
    models, nodes, reasons = Counter(), Counter(), {}
    for r in rows:
        for op, n in r.fell_back.items():
            models[op] += 1
            nodes[op] += n
            reasons.setdefault(op, r.reasons.get(op, ""))
    return [(op, models[op], nodes[op], reasons[op]) for op in sorted(models, key=lambda o: (-models[o], o))]


def fallback_table(rows: list[Row]) -> str:
    ops = fallback_ops(rows)
    if not ops:
        return "No op fell back."
    lines = ["| op | models | nodes | why (first node) |", "|---|---:|---:|---|"]
    for op, m, n, reason in ops:
        lines.append(f"| {op} | {m} | {n} | {reason[:140].replace('|', '/')} |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    import onnx
    import onnxruntime
    import transformers

    return {"date": date.today().isoformat(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "threads": torch.get_num_threads(),
            "compiler_fallback": compiler_has_fallback()}


# -- main ------------------------------------------------------------------------------------------------

def all_models() -> list[tuple[str, Model]]:
    return ([("zoo", e) for e in zoo_entries()] + [("transformers", e) for e in transformers_entries()]
            + [("onnx", m) for m in onnx_entries()])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated model names (default: all of the selected sources)")
    parser.add_argument("--source", choices=SOURCES, help="only the models of this source")
    parser.add_argument("--json", metavar="FILE", help="also write the rows (and the environment) here")
    parser.add_argument("--dag", action="store_true",
                        help="run partitioned models with partition + DAGExecutor, not compile(..., fallback='cpu')")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    return parser.parse_args(argv)


def select(args: argparse.Namespace) -> list[tuple[str, Model]]:
    chosen = [(s, m) for s, m in all_models() if args.source in (None, s)]
    if args.models:
        wanted = [n.strip() for n in args.models.split(",") if n.strip()]
        known = {m.name for _, m in chosen}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise SystemExit(f"unknown model(s) {unknown}; see --list")
        chosen = [(s, m) for s, m in chosen if m.name in wanted]
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = select(args)
    if args.list:
        print("\n".join(f"{m.name} ({s})" for s, m in chosen))
        return 0
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    dag = args.dag or not compiler_has_fallback()
    mode = "partition + DAGExecutor" if dag else 'compile(..., fallback="cpu")'
    log(f"ops without a kernel run through: {mode}")
    rows, start = [], time.perf_counter()
    for i, (source, model) in enumerate(chosen, 1):
        log(f"[{i}/{len(chosen)}] {model.name} ({source}) ...")
        row = bench_model(model, source, dag)
        rows.append(row)
        gc.collect()
        equal = "" if row.equal is None else f", {'equal' if row.equal else 'NOT EQUAL'} ({row.max_abs_error:.1e})"
        log(f"[{i}/{len(chosen)}] {model.name}: {row.status}{equal}, {row.seconds:.1f} s")
    info = environment()
    print(table(rows))
    print(f"\n{totals(rows)}\n")
    print(f"### Ops that fell back\n\n{fallback_table(rows)}\n")
    print(f"{len(rows)} models in {time.perf_counter() - start:.0f} s; torch {info['torch']}, transformers "
          f"{info['transformers']}, onnx {info['onnx']}, onnxruntime {info['onnxruntime']}, "
          f"{info['threads']} threads, {info['date']}")
    if args.json:
        data = {"environment": info, "rows": [asdict(r) for r in rows],
                "fallback_ops": [dict(zip(("op", "models", "nodes", "reason"), f)) for f in fallback_ops(rows)]}
        Path(args.json).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return 1 if any(r.equal is False for r in rows) else 0  # a program that computes something else is a bug


if __name__ == "__main__":
    sys.exit(main())
