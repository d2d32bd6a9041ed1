"""``bisect``: find the stage, then the node, rule, converter or kernel where a model's numbers go wrong.

    from npu_tools.debug import bisect
    report = bisect("qwen2", out_dir="bisect-out")       # a zoo name, module:factory, model.onnx, an IR ...
    print(report.summary())
    report.finding.kind, report.finding.rule              # ("rule", "rms_norm")

The trusted source's outputs are compared with each stage in pipeline order (``npu_tools.debug.stages``); the
first stage beyond tolerance is searched:

* ``extracted``: the first IR node whose outputs differ from the trusted source's value of the same tensor
  (its inputs agreeing): a frontend fault, named by the node's provenance origin (the ONNX converter, the
  tinygrad mapping, torch.export).
* a normalize stage or ``kernel_fusion``: the IR before the stage is the good reference; the number of rule
  applications of the stage is bisected (``NormalizeOptions(stop_after=(stage, n))``) down to the one after
  which the outputs diverge, which names the rule and its root node, then the first node that differs.
* ``compiled:<backend>``: the first dispatch whose outputs differ from the kernel-fused IR's; run alone on its
  actual inputs against its op's reference implementation, it is either wrong itself (a kernel fault, named
  with the backend's implementation) or right on wrong inputs or parameters (a lowering or memory-plan fault).
* ``partitioned``: the first partition (and node) whose outputs differ.

A standalone repro (``npu_tools.debug.repro``) of the faulty node or rewritten group is written to
``out_dir/repro`` with the last good stage's values, and the report to ``out_dir``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from npu_compiler.passes import pipeline
from torch_ir.errors import TorchIRError
from torch_ir.ir import NPU_IR, OpNode, provenance_of
from torch_ir.report.cells import one_line
from torch_ir.verify.compare import TensorDiff, compare_tensors

from .drift import Step, Verdict, error_series, judge
from .outdir import REPRO_DIR, check_output_dir, make_dir_inside
from .report import BisectReport, Finding, StageRow, code_span
from .repro import FILES
from .stages import REWRITE_STAGES, Pipeline, StageResult, check_stages
from .subject import Subject


def bisect(source: Any, *, inputs: Sequence[Any] | None = None, weights: Any = None, seed: int = 0,
           stages: Sequence[str] | None = None, rtol: float | None = None, atol: float | None = None,
           out_dir: str | os.PathLike | None = None, progress: bool = True, keep_going: bool = False,
           ) -> BisectReport:
    """Compare the trusted source with every stage, name the first that diverges and what in it is broken.

    ``source`` is anything ``npu_tools.debug.sources.load_subject`` takes (a zoo name, ``module:factory``, an
    ONNX file, ``tinygrad:module:factory``, an IR with ``weights``) or a ``Subject``. ``weights`` are an IR's,
    or are loaded into a zoo model's or factory's model; the report says which were used. ``inputs`` replace the
    seeded random ones; ``stages`` picks stages by name (``npu_tools.debug.stages.STAGE_NAMES``); ``rtol`` and
    ``atol`` override the dtype's default tolerance. Stages after the first divergent one are not run unless
    ``keep_going``. ``progress`` prints a line per stage on stderr. With ``out_dir`` the report (JSON, Markdown,
    HTML, plot) and the repro directory (``out_dir/repro``) are written there; an entry of ``out_dir`` that bisect
    would write and that is a link or a special file is refused before anything runs (``npu_tools.debug.outdir``).

    Example::

        report = bisect("my_pkg.models:tiny", stages=["extracted", "normalize:fuse"])
        assert report.ok, report.summary()
    """
    started = time.perf_counter()
    say = _printer(progress)
    if out_dir is not None:  # before the model is loaded: a bad or planted output directory costs nothing
        check_output_dir(out_dir, FILES)
    subject = _load(source, inputs, weights, seed)
    chosen = check_stages(stages)
    pipe = Pipeline(subject)
    report = BisectReport(subject.name, subject.trusted, rtol, atol, weights=subject.weights_used)
    t0 = time.perf_counter()
    with torch.no_grad():
        trusted = [t.detach() for t in subject.run_trusted()]
    say(f"trusted ({subject.trusted}, weights: {subject.weights_used.text}): {time.perf_counter() - t0:.2f} s")
    for name in chosen:
        if report.first_bad is not None and not keep_going:
            break
        row = _run_stage(pipe, name, trusted, rtol, atol)
        report.stages.append(row)
        say(_progress_line(row))
        if row.ok is False and report.first_bad is None:
            report.first_bad = name
    if report.first_bad is not None:
        t0 = time.perf_counter()
        say(f"locating the fault in {report.first_bad} ...")
        finding, verdict, case = locate(pipe, report.first_bad, trusted, rtol=rtol, atol=atol, say=say)
        report.finding, report.verdict = finding, verdict
        if finding.kind != "drift" and verdict is not None and verdict.kind == "drift":
            finding.notes.append("the error grows smoothly along the graph (drift): this node is only where it "
                                 "first crosses the tolerance")
        if case is not None and out_dir is not None:
            root = Path(out_dir)
            root.mkdir(parents=True, exist_ok=True)
            report.repro = _write_repro(make_dir_inside(root, root / REPRO_DIR), case, finding)
        say(f"located in {time.perf_counter() - t0:.2f} s: {finding.title}")
    report.seconds = time.perf_counter() - started
    if out_dir is not None:
        report.write(out_dir)
    return report


def _load(source: Any, inputs: Sequence[Any] | None, weights: Any, seed: int) -> Subject:
    from .sources import SubjectError, load_subject

    if isinstance(source, Subject):
        if weights is not None:  # a Subject's IR and trusted source already run on its weights
            raise SubjectError("bisect(subject, weights=...): a Subject carries its weights; give them when making "
                               "it (load_subject(..., weights=...))")
        return source
    return load_subject(source, inputs=inputs, weights=weights, seed=seed)


def _printer(progress: bool) -> Callable[[str], None]:
    def say(line: str) -> None:
        if progress:
            print(f"[bisect] {line}", file=sys.stderr, flush=True)
    return say


def _progress_line(row: StageRow) -> str:
    if row.skipped:
        return f"{row.name:<24} skipped: {row.skipped}"
    if row.error:
        return f"{row.name:<24} error: {row.error.splitlines()[0]}"
    return (f"{row.name:<24} {'ok' if row.ok else 'DIVERGES':<9} max abs {row.max_abs:.3g}  max rel {row.max_rel:.3g}"
            f"  {row.seconds:.2f} s")


def _run_stage(pipe: Pipeline, name: str, trusted: list[torch.Tensor], rtol: float | None,
               atol: float | None) -> StageRow:
    try:
        result: StageResult = pipe.run(name)
    except TorchIRError as e:  # a stage that cannot run the model (an op without a kernel) is not a numeric fault
        return StageRow(name, None, error=f"{type(e).__name__}: {e}")
    if result.skipped:
        return StageRow(name, None, skipped=result.skipped)
    diffs = compare_outputs(result.outputs, trusted, rtol, atol)
    return StageRow(name, all(d.ok for d in diffs), max((d.max_abs for d in diffs), default=0.0),
                    max((d.max_rel for d in diffs), default=0.0), result.seconds, outputs=diffs)


def compare_outputs(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], rtol: float | None,
                    atol: float | None, names: Sequence[str] | None = None) -> list[TensorDiff]:
    """One TensorDiff per output (a missing output is a failing diff)."""
    names = list(names or [f"output {i}" for i in range(len(expected))])
    diffs = []
    for i, want in enumerate(expected):
        if i >= len(actual):
            diffs.append(TensorDiff(names[i], list(want.shape), str(want.dtype), math.inf, math.inf, 0, 0,
                                    want.numel(), want.numel(), False, "the stage gives no such output"))
            continue
        diffs.append(compare_tensors(names[i], _like(actual[i], want), want, rtol, atol))
    return diffs


def _like(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    # a program widens bfloat16 when it reads back; the comparison is in the expected dtype
    return actual.to(expected.dtype) if actual.dtype != expected.dtype and actual.is_floating_point() else actual


# -- inside the first divergent stage ------------------------------------------------------------------

ReproSpec = dict[str, Any]  # the fields of npu_tools.debug.repro.ReproCase


def locate(pipe: Pipeline, stage: str, trusted: list[torch.Tensor], *, rtol: float | None = None,
           atol: float | None = None, say: Callable[[str], None] = lambda _: None,
           ) -> tuple[Finding, Verdict | None, ReproSpec | None]:
    """The finding in ``stage`` (known to diverge), the drift-or-fault verdict and the repro to write."""
    if stage == "extracted":
        return _locate_frontend(pipe, rtol, atol)
    if stage in REWRITE_STAGES:
        return _locate_rule(pipe, stage, trusted, rtol, atol, say)
    if stage.startswith("compiled:"):
        return _locate_dispatch(pipe, stage, rtol, atol)
    return _locate_partition(pipe, stage, rtol, atol)


def ir_steps(ir: NPU_IR) -> list[Step]:
    return [Step(n.name, n.op_type, [t.name for t in n.inputs], [t.name for t in n.outputs],
                 provenance_of(n).module) for n in ir.nodes]


def _dtype(ir: NPU_IR) -> torch.dtype:
    from torch_ir.ops.values import dtype_from_name

    floats = [dtype_from_name(t.dtype) for t in ir.graph_outputs if dtype_from_name(t.dtype).is_floating_point]
    return floats[0] if floats else torch.float32


def _suspect(verdict: Verdict) -> Any:
    return verdict.jump or verdict.first_beyond


def _node_diffs(node: OpNode, actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                rtol: float | None, atol: float | None) -> tuple[list[TensorDiff], list[TensorDiff]]:
    def diffs(names: list[str]) -> list[TensorDiff]:
        return [compare_tensors(n, _like(actual[n], expected[n]), expected[n], rtol, atol)
                for n in names if n in actual and n in expected]
    return diffs([t.name for t in node.inputs]), diffs([t.name for t in node.outputs])


def _provenance_dict(node: OpNode) -> dict[str, Any]:
    return asdict(provenance_of(node))


def _values_for(names: list[str], *sources: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name in names:
        for values in sources:
            if name in values:
                out[name] = values[name].detach().clone()
                break
    return out


def _locate_frontend(pipe: Pipeline, rtol: float | None, atol: float | None,
                     ) -> tuple[Finding, Verdict | None, ReproSpec | None]:
    subject = pipe.subject
    ir = subject.ir
    if subject.trusted_values is None:
        return Finding("stage", "extracted", f"the extracted IR diverges from {subject.trusted}; {subject.trusted} "
                       "gives no intermediate values to align with the IR, so no node can be named"), None, None
    expected = subject.trusted_values()
    actual = pipe.ir_values(ir)
    verdict = judge(error_series(ir_steps(ir), actual, expected, rtol=rtol, atol=atol), dtype=_dtype(ir))
    suspect = _suspect(verdict)
    if suspect is None:
        return Finding("stage", "extracted", f"the extracted IR's outputs diverge from {subject.trusted}, but no "
                       "intermediate value the source gives differs"), verdict, None
    node = ir.nodes[suspect.index]
    prov = provenance_of(node)
    ins, outs = _node_diffs(node, actual, expected, rtol, atol)
    converter = prov.origin or subject.frontend
    kind = "drift" if verdict.kind == "drift" else "frontend"
    title = (f"node {node.name} ({node.op_type}) of the extracted IR differs from {subject.trusted}"
             + (f"; made by {converter}" if converter else ""))
    finding = Finding(kind, "extracted", title, node=node.name, op=node.op_type, converter=converter,
                      module=prov.module, provenance=_provenance_dict(node), group=[node.name], inputs=ins,
                      outputs=outs)
    case = None
    if kind == "frontend":
        case = _case("frontend", title, ir, [node.name], pipe, [expected, actual], [expected], rtol, atol, finding)
    return finding, verdict, case


def _outputs_ok(outputs: list[torch.Tensor], trusted: list[torch.Tensor], rtol: float | None,
                atol: float | None) -> bool:
    return all(d.ok for d in compare_outputs(outputs, trusted, rtol, atol))


def _locate_rule(pipe: Pipeline, stage: str, trusted: list[torch.Tensor], rtol: float | None, atol: float | None,
                 say: Callable[[str], None]) -> tuple[Finding, Verdict | None, ReproSpec | None]:
    log = pipe.log(stage)
    total = len(log)

    def diverges_after(n: int) -> bool:
        ok = _outputs_ok(pipe.run_ir(pipe.ir(stage, n)), trusted, rtol, atol)
        say(f"  {stage}: after {n} of {total} rule applications: {'ok' if ok else 'diverges'}")
        return not ok

    # the invariant of the search: after ``good`` applications the outputs agree, after ``bad`` they do not.
    # Galloping from the start first (1, 2, 4, ...): a broken rule usually breaks its first application (every
    # layer has the pattern), and a probe costs a rewrite as long as its count, so small counts come first.
    good, bad, step = 0, total, 1
    while step < total:
        if diverges_after(step):
            bad = step
            break
        good, step = step, step * 2
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (good, mid) if diverges_after(mid) else (mid, bad)
    prev = pipe.previous(stage)
    if total == 0 or not _outputs_ok(pipe.run_ir(pipe.ir(stage, 0)), trusted, rtol, atol):
        # no application to blame: the stage's dead-code elimination or annotation changed the numbers
        return Finding("stage", stage, f"{stage} diverges without any rule application (its clean-up after the "
                       "rules changed the numbers)"), None, None
    rule_name, root = log[bad - 1]
    before, after = pipe.ir(stage, bad - 1), pipe.ir(stage, bad)
    good_values, bad_values = pipe.ir_values(before), pipe.ir_values(after)
    series = error_series(ir_steps(after), bad_values, good_values, rtol=rtol, atol=atol)
    local = judge(series, dtype=_dtype(after))
    # the verdict on the whole stage against the stage before it: one broken application, or drift over many
    whole_ir, prev_ir = pipe.ir(stage), pipe.ir(prev)
    verdict = judge(error_series(ir_steps(whole_ir), pipe.ir_values(whole_ir), pipe.ir_values(prev_ir), rtol=rtol,
                                 atol=atol), dtype=_dtype(whole_ir))
    rule = _rule_object(stage, rule_name)
    removed = _removed_nodes(before, after)
    suspect = _suspect(local)
    node = after.nodes[suspect.index] if suspect is not None else None
    kind = "drift" if verdict.kind == "drift" else "rule"
    title = (f"rule {rule_name} (family {rule.family if rule else '?'}, stage {stage}) at root node {root}: "
             f"application {bad} of {total}" + (f" makes {node.name} ({node.op_type}) differ" if node else ""))
    finding = Finding(kind, stage, title, rule=rule_name, rule_family=rule.family if rule else None,
                      rule_module=_rule_module(rule), application=bad, applications=total, root=root,
                      group=[n.name for n in removed])
    if node is not None:
        prov = provenance_of(node)
        finding.node, finding.op, finding.module = node.name, node.op_type, prov.module
        finding.provenance = _provenance_dict(node)
        finding.inputs, finding.outputs = _node_diffs(node, bad_values, good_values, rtol, atol)
        if prov.rules and prov.rules[-1] != rule_name:
            finding.notes.append(f"the first node that differs was made by rule {prov.rules[-1]}, not by the "
                                 f"application that made the outputs diverge ({rule_name})")
    case = None
    if kind == "rule" and removed:
        case = _case("rule", title, before, [n.name for n in removed], pipe, [good_values], [good_values], rtol,
                     atol, finding, rule=rule_name)
        case["rule_source"] = rule_source(rule)
    return finding, verdict, case


def _rule_object(stage: str, name: str) -> Any:
    if stage == "kernel_fusion":
        from npu_compiler.passes import kernel_fusion as fusion

        rules = fusion.KERNEL_FUSION_RULES
    else:
        rules = dict(pipeline.STAGES).get(stage.removeprefix("normalize:"), [])
    return next((r for r in rules if r.name == name), None)


def _rule_module(rule: Any) -> str | None:
    if rule is None:
        return None
    fn = rule.replace
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"


def rule_source(rule: Any) -> str | None:
    """Where repro.py imports a rule from that is not one of the toolkit's own (None for those): the attribute of
    the module defining its replacement that holds the rule (or a list of rules with it), as "module:attr"."""
    if rule is None:
        return None
    module_name = getattr(rule.replace, "__module__", None) or ""
    if module_name == "__main__" or module_name.split(".")[0] in ("torch_ir", "npu_compiler"):
        return None
    module = sys.modules.get(module_name)
    for attr, value in vars(module).items() if module is not None else ():
        if value is rule or (isinstance(value, (list, tuple)) and any(v is rule for v in value)):
            return f"{module_name}:{attr}"
    return None


def _signature(node: OpNode) -> tuple:
    return (node.name, node.op_type, tuple(t.name for t in node.inputs), tuple(t.name for t in node.outputs))


def _removed_nodes(before: NPU_IR, after: NPU_IR) -> list[OpNode]:
    """The nodes of ``before`` that one rule application replaced (root, interior, absorbed siblings), in order."""
    kept = {_signature(n) for n in after.nodes}
    return [n for n in before.nodes if _signature(n) not in kept]


def _locate_dispatch(pipe: Pipeline, stage: str, rtol: float | None, atol: float | None,
                     ) -> tuple[Finding, Verdict | None, ReproSpec | None]:
    backend = stage.removeprefix("compiled:")
    ir = pipe.ir("kernel_fusion")
    expected = pipe.ir_values(ir)
    trace = pipe.trace_program(backend)
    program = trace.program
    steps = [Step(d.node, d.kernel, list(d.inputs), list(d.outputs), (d.provenance.module if d.provenance else None))
             for d in program.dispatches]
    verdict = judge(error_series(steps, trace.values, expected, rtol=rtol, atol=atol), dtype=_dtype(ir))
    suspect = _suspect(verdict)
    if suspect is None:
        return Finding("stage", stage, f"the program's outputs diverge on {backend}, but no dispatch output that "
                       "the IR also computes differs (an output copy or a view)"), verdict, None
    index = suspect.index
    dispatch = program.dispatches[index]
    ins, outs, ref = pipe.dispatch_check(backend, index)
    alone = [compare_tensors(n, _like(o, r), r, rtol, atol) for n, o, r in zip(dispatch.outputs, outs, ref)]
    kernel_wrong = not all(d.ok for d in alone)
    node = next((n for n in ir.nodes if n.name == dispatch.node), None)
    prov = provenance_of(node) if node is not None else None
    impl = _implementation(dispatch, backend)
    if verdict.kind == "drift":
        kind = "drift"
    else:
        kind = "kernel" if kernel_wrong else "lowering"
    if kind == "kernel":
        title = (f"kernel {dispatch.kernel} on {backend} ({impl}) is wrong on its actual inputs: dispatch {index} "
                 f"(node {dispatch.node})")
    else:
        title = (f"dispatch {index} ({dispatch.kernel}, node {dispatch.node}) on {backend} differs from the IR, but "
                 "its kernel is right on the inputs and parameters it was given: the lowering or the memory plan "
                 "is wrong")
    in_diffs = [compare_tensors(n, _like(v, expected[n]), expected[n], rtol, atol)
                for n, v in zip(dispatch.inputs, ins) if n in expected]
    out_diffs = [compare_tensors(n, _like(trace.values[n], expected[n]), expected[n], rtol, atol)
                 for n in dispatch.outputs if n in trace.values and n in expected]
    finding = Finding(kind, stage, title, node=dispatch.node, op=node.op_type if node else dispatch.kernel,
                      dispatch=index, kernel=dispatch.kernel, implementation=impl, backend=backend,
                      module=prov.module if prov else None,
                      provenance=asdict(prov) if prov else None, group=[dispatch.node], inputs=in_diffs,
                      outputs=out_diffs)
    finding.notes.append("alone on its actual inputs, the dispatch " + (
        "differs from its op's reference implementation: " + "; ".join(
            f"{d.name} max abs {d.max_abs:.3g}" for d in alone if not d.ok)
        if kernel_wrong else "agrees with its op's reference implementation"))
    case = None
    if kind in ("kernel", "lowering") and node is not None:
        case = _case(kind, title, ir, [node.name], pipe, [expected], [expected], rtol, atol, finding, backend=backend)
    return finding, verdict, case


def _implementation(dispatch: Any, backend: str) -> str:
    """What runs the dispatch on the backend: the kernel table's implementation, or the host reference."""
    if getattr(dispatch, "host", None):
        return f"host reference ({dispatch.host})"
    from npu_program.kernels import KERNELS

    record = KERNELS.get(dispatch.kernel)
    if record is None:
        return "?"
    impl = record.impls.get(backend, "reference")
    if backend == "webgpu" and record.wgsl:
        return f"{impl} (WGSL: {record.wgsl})"
    return impl


def _locate_partition(pipe: Pipeline, stage: str, rtol: float | None, atol: float | None,
                      ) -> tuple[Finding, Verdict | None, ReproSpec | None]:
    ir = pipe.ir("kernel_fusion")
    expected = pipe.ir_values(ir)
    _, env, plan = pipe.run_partitioned()
    steps = [Step(f"partition {p.index} ({p.device})", p.device, p.inputs, p.outputs) for p in plan.partitions]
    verdict = judge(error_series(steps, env, expected, rtol=rtol, atol=atol), dtype=_dtype(ir))
    suspect = _suspect(verdict)
    if suspect is None:
        return Finding("stage", stage, "the partitioned DAG's outputs diverge, but no partition boundary value "
                       "differs"), verdict, None
    part = plan.partitions[suspect.index]
    bad = {n for n in part.outputs if n in env and n in expected
           and not compare_tensors(n, _like(env[n], expected[n]), expected[n], rtol, atol).ok}
    node = next((n for n in part.ir.nodes if any(t.name in bad for t in n.outputs)), None)
    title = (f"partition {part.index} ({part.device}, {len(part.nodes)} nodes) gives values that differ from the "
             "IR" + (f", first at node {node.name} ({node.op_type})" if node else ""))
    finding = Finding("drift" if verdict.kind == "drift" else "partition", stage, title,
                      node=node.name if node else None, op=node.op_type if node else None,
                      provenance=_provenance_dict(node) if node else None,
                      module=provenance_of(node).module if node else None,
                      outputs=[compare_tensors(n, _like(env[n], expected[n]), expected[n], rtol, atol)
                               for n in sorted(bad)])
    return finding, verdict, None


# -- the repro -----------------------------------------------------------------------------------------

def _case(kind: str, title: str, ir: NPU_IR, nodes: list[str], pipe: Pipeline, input_sources: list[dict],
          expected_sources: list[dict], rtol: float | None, atol: float | None, finding: Finding, *,
          rule: str | None = None, backend: str | None = None) -> ReproSpec:
    """The fields of a ReproCase; the minimal IR is cut later, when the repro is written."""
    return {"kind": kind, "title": title, "ir": ir, "nodes": nodes, "pipe": pipe, "input_sources": input_sources,
            "expected_sources": expected_sources, "rule": rule, "backend": backend, "rtol": rtol, "atol": atol,
            "finding": finding}


def _write_repro(out: Path, spec: ReproSpec, finding: Finding) -> Path | None:
    from .repro import ReproCase, sub_ir, sub_weights, write_repro

    ir: NPU_IR = spec["ir"]
    small = sub_ir(ir, spec["nodes"], name=f"{ir.model_name}.repro")
    inputs = _values_for([t.name for t in small.graph_inputs], *spec["input_sources"])
    expected = _values_for([t.name for t in small.graph_outputs], *spec["expected_sources"])
    weights = sub_weights(small, spec["pipe"].subject.weights)
    details = "\n".join([f"- stage: {code_span(finding.stage)}",
                         *(f"- {k}: {code_span(v)}" for k, v in _repro_fields(finding))])
    subject = spec["pipe"].subject
    trusted = {"frontend": subject.trusted, "rule": "the IR before the rule application",
               "kernel": "the kernel-fused IR (reference executor)",
               "lowering": "the kernel-fused IR (reference executor)"}
    case = ReproCase(kind=spec["kind"], title=one_line(spec["title"]), ir=small, weights=weights, inputs=inputs,
                     expected=expected, rule=spec["rule"], backend=spec["backend"], rtol=spec["rtol"],
                     atol=spec["atol"], details=details, rule_source=spec.get("rule_source"),
                     onnx_model=getattr(subject, "onnx_model", None) if spec["kind"] == "frontend" else None,
                     trusted=trusted[spec["kind"]])
    # the directory is bisect's own: a second run over the same out_dir replaces the repro in it
    return Path(write_repro(out, case, overwrite=True))


def _repro_fields(f: Finding) -> list[tuple[str, Any]]:
    names = ("node", "op", "dispatch", "kernel", "implementation", "backend", "rule", "rule_module", "root",
             "converter", "module")
    return [(n, getattr(f, n)) for n in names if getattr(f, n) is not None]


__all__ = ["bisect", "compare_outputs", "ir_steps", "locate"]
