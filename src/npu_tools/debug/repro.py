"""A standalone repro of one numerical fault: a directory anyone can run without the original model.

    sub = sub_ir(ir, ["rms_norm_3"], name="rms_norm_3")          # only the faulty node(s)
    case = ReproCase("kernel", "kernel RMS_NORM (cpu) makes rms_norm_3 differ", sub, sub_weights(sub, weights),
                     inputs={...}, expected={...}, backend="cpu")
    write_repro("repro_rms_norm_3", case)

The directory holds::

    ir.json              the minimal IR (only the faulty node or fused group)
    weights.safetensors  the weights it reads (absent when it reads none)
    inputs.npz           its graph inputs, expected.npz its expected outputs (``input_<i>``/``output_<i>`` in graph
                         order; bfloat16 is stored as float32, numpy having no bfloat16, and restored on load)
    case.json            the kind, rule, backend, tolerances and each array's name and dtype
    model.onnx           (an ONNX frontend fault, when the ONNX node could be cut out) the trusted node alone
    README.md            what is wrong and how to run it
    repro.py             ``python repro.py`` runs the faulty path and exits 1 when it differs from expected.npz;
                         ``python repro.py --reference`` runs the reference path and exits 0 when it matches

``repro.py`` imports only the installed toolkit (torch_ir, npu_compiler, npu_runtime), torch and numpy (and
onnxruntime for an ONNX reference). It reproduces a fault of the *installed* code: a fault injected into a
running process (a monkeypatched rule or kernel) is not in the repro's process, whose faulty path then passes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_ir.errors import OutputWriteError, TorchIRError
from torch_ir.fileio import atomic_write, check_writable_dir
from torch_ir.ir import NPU_IR, OpNode, TensorMeta, check_integrity, provenance_of, subgraph
from torch_ir.ops.values import dtype_name
from torch_ir.report.markdown import cell

from .outdir import check_entry, check_inside, check_same_directory, identity
from .report import code_span, fenced

KINDS = ("frontend", "rule", "kernel", "lowering")
BACKENDS = ("cpu", "webgpu")
FILES = ("ir.json", "weights.safetensors", "inputs.npz", "expected.npz", "case.json", "model.onnx", "README.md",
         "repro.py")


class ReproError(TorchIRError, ValueError):
    """A repro case that cannot be written as given (an unknown kind, a missing input, an unknown rule)."""


@dataclass
class ReproCase:
    """One fault, minimal: what ``write_repro`` writes.

    ``ir`` holds only the faulty node(s) (for kind "rule": the source nodes the rule rewrote, before it);
    ``inputs``/``expected`` are by graph input/output name, from the trusted or last good stage.
    ``rule_source`` ("package.module:attr", a Rule or a list of them) names where a rule that is in neither
    ``npu_compiler.passes.pipeline.ALL_RULES`` nor ``npu_compiler.passes.kernel_fusion.KERNEL_FUSION_RULES``
    is imported from.
    ``onnx_model`` (an ``onnx.ModelProto``, for an ONNX frontend fault) is the source model the faulty ONNX
    node is cut from, for the reference path.
    """

    kind: str  # "frontend" | "rule" | "kernel" | "lowering"
    title: str  # one line: what is wrong
    ir: NPU_IR
    weights: Mapping[str, torch.Tensor]  # by state-dict key (may be empty)
    inputs: Mapping[str, torch.Tensor]
    expected: Mapping[str, torch.Tensor]
    rule: str | None = None
    backend: str | None = None
    rtol: float | None = None
    atol: float | None = None
    details: str = ""  # markdown for the README
    rule_source: str | None = None
    onnx_model: Any = None
    trusted: str | None = None  # who computed ``expected`` ("onnxruntime", "the IR before the rule", ...)


# -- the minimal IR ------------------------------------------------------------------------------------

def sub_ir(ir: NPU_IR, node_names: Iterable[str], *, name: str) -> NPU_IR:
    """The IR of only ``node_names`` (kept in ``ir``'s order): what they read and no listed node makes becomes
    a graph input (weights and constants stay weights and constants, with their keys and values); what they
    make that is read outside them, or is a graph output or a buffer's new value, becomes a graph output.

    Example::

        small = sub_ir(ir, ["linear_2", "relu_2"], name="linear_2")
        IRExecutor(small, weights).run({"relu_1": x})
    """
    wanted = list(dict.fromkeys(node_names))
    present = {n.name for n in ir.nodes}
    unknown = [n for n in wanted if n not in present]
    if unknown or not wanted:
        raise ReproError(f"sub_ir of IR {ir.model_name!r}: " + (f"no node named {unknown}" if unknown else
                         "no nodes given") + "; pass names of its nodes (ir.nodes[i].name)")
    chosen = [n for n in ir.nodes if n.name in set(wanted)]
    return subgraph(ir, chosen, name=name,
                    metadata={"repro_of": {"model": ir.model_name, "nodes": [n.name for n in chosen]}})


def sub_weights(sub: NPU_IR, weights: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The entries of ``weights`` (a state dict) that the minimal IR ``sub`` reads, by state-dict key.

    A weight the state dict lacks is an error unless the IR can rebuild it (a non-persistent buffer's recipe).
    """
    from torch_ir.errors import WeightsMismatchError
    from torch_ir.weights import as_tensor, find_weight_key, reverse_aliases

    reverse = reverse_aliases(sub.weight_aliases)
    out: dict[str, torch.Tensor] = {}
    missing = []
    for meta in [*sub.weights, *(c for c in sub.constants if c.name not in sub.constant_values)]:
        key = sub.weight_name_mapping.get(meta.name, meta.name)
        found = find_weight_key(key, meta.name, sub.weight_aliases, weights, reverse)
        if found is not None:
            out[key] = as_tensor(weights[found], f"weight {found!r}")
        elif sub.non_persistent_buffers.get(key) is None:
            missing.append(key)
    if missing:
        raise WeightsMismatchError(f"minimal IR {sub.model_name!r} reads weights {missing} that the state dict "
                                   "given to sub_weights lacks; pass the whole model's weights")
    return out


# -- writing ---------------------------------------------------------------------------------------------

def write_repro(out_dir: str | os.PathLike, case: ReproCase, *, overwrite: bool = False) -> Path:
    """Write ``case`` as a runnable directory (see the module docstring); returns its path.

    Example::

        path = write_repro("repro_rms_norm", case)
        # then: cd repro_rms_norm && python repro.py    (exit 1: the fault reproduces)

    Everything is checked before anything is written. Each file is written atomically; a directory that
    exists and is not empty is refused unless ``overwrite`` (then only this module's files are replaced, and
    those the new case does not have are removed). ``out_dir`` itself is the caller's path; a file of the repro
    in it that is a link (or not a regular file) is refused (``npu_tools.debug.outdir.PlantedOutputError``),
    before the first write and again before each, and so is ``out_dir`` swapped for another directory meanwhile.
    Names from the IR are inert text in the README (escaped, or in code spans and fences they cannot close).
    """
    _check_case(case)
    out = Path(out_dir)
    _prepare_dir(out, overwrite)
    for name in FILES:  # all before the first write: a link planted in the directory leaves nothing half-written
        check_entry(out / name, "file")
    target = _Targets(out)
    inputs = [case.inputs[t.name] for t in case.ir.graph_inputs]
    expected = [case.expected[t.name] for t in case.ir.graph_outputs]
    input_entries, input_arrays = _arrays("input", case.ir.graph_inputs, inputs)
    output_entries, output_arrays = _arrays("output", case.ir.graph_outputs, expected)
    onnx_note = None
    onnx_bytes = None
    if case.kind == "frontend" and case.onnx_model is not None:
        onnx_bytes, onnx_note = _onnx_node_model(case)
    manifest = {
        "kind": case.kind, "title": case.title, "rule": case.rule, "rule_source": case.rule_source,
        "backend": case.backend, "rtol": case.rtol, "atol": case.atol, "trusted": case.trusted,
        "inputs": input_entries, "outputs": output_entries,
    }
    from torch_ir.weights import save_weights

    readme = _readme(case, manifest, onnx_bytes is not None, onnx_note)
    case.ir.save(str(target("ir.json")), indent=1)
    if case.weights:
        save_weights({k: v.detach().cpu().contiguous() for k, v in case.weights.items()},
                     target("weights.safetensors"))
    else:
        _remove(target("weights.safetensors"))
    atomic_write(target("inputs.npz"), lambda f: np.savez(f, **input_arrays), what="repro inputs file")
    atomic_write(target("expected.npz"), lambda f: np.savez(f, **output_arrays), what="repro expected file")
    atomic_write(target("case.json"), json.dumps(manifest, indent=1) + "\n", what="repro case file")
    if onnx_bytes is not None:
        atomic_write(target("model.onnx"), onnx_bytes, what="repro ONNX model")
    else:
        _remove(target("model.onnx"))
    atomic_write(target("README.md"), readme, what="repro README")
    atomic_write(target("repro.py"), SCRIPT, what="repro script")
    return out


class _Targets:
    """The files of one repro directory, each checked again right before it is written: the directory is still
    the one checked at the start (not swapped for a link to another), and the file is not a link planted since."""

    def __init__(self, out: Path) -> None:
        self.out, self.identity = out, identity(out)

    def __call__(self, name: str) -> Path:
        check_same_directory(self.out, self.identity)
        check_inside(self.out, self.out / name)
        return self.out / name


def _check_case(case: ReproCase) -> None:
    where = f"repro case {case.title!r}"
    if case.kind not in KINDS:
        raise ReproError(f"{where}: kind {case.kind!r} is none of {', '.join(KINDS)}")
    if "\n" in case.title:
        raise ReproError(f"{where}: the title is one line; put the rest in details")
    check_integrity(case.ir, source=f"the minimal IR of {where}")
    missing = [t.name for t in case.ir.graph_inputs if t.name not in case.inputs]
    missing += [f"expected {t.name}" for t in case.ir.graph_outputs if t.name not in case.expected]
    if missing:
        raise ReproError(f"{where}: no value for {missing}; give inputs for every graph input of the minimal IR "
                         "and expected values for every graph output")
    if case.kind == "rule":
        if not case.rule:
            raise ReproError(f"{where}: kind 'rule' needs rule= (the rewrite rule's name)")
        if case.rule_source is None and not _builtin_rules(case.rule):
            raise ReproError(f"{where}: rule {case.rule!r} is in neither npu_compiler.passes.pipeline.ALL_RULES "
                             "nor npu_compiler.passes.kernel_fusion.KERNEL_FUSION_RULES; give "
                             "rule_source='package.module:attr' so that repro.py can import it")
    if case.kind in ("kernel", "lowering") and case.backend not in BACKENDS:
        raise ReproError(f"{where}: kind {case.kind!r} needs backend= one of {', '.join(BACKENDS)}, "
                         f"not {case.backend!r}")


def _builtin_rules(name: str) -> list[Any]:
    from npu_compiler.passes.kernel_fusion import KERNEL_FUSION_RULES
    from npu_compiler.passes.pipeline import ALL_RULES

    return [r for r in [*ALL_RULES, *KERNEL_FUSION_RULES] if r.name == name]


def _prepare_dir(out: Path, overwrite: bool) -> None:
    """``out`` itself is the caller's path (a link the caller made to a directory is followed); its entries are
    checked by ``write_repro``."""
    if out.exists():
        if not out.is_dir():
            raise OutputWriteError(f"cannot write the repro directory {str(out)!r}: it is a file; choose a new path")
        if any(out.iterdir()) and not overwrite:
            raise OutputWriteError(f"repro directory {str(out)!r} exists and is not empty; choose a new path or "
                                   "pass overwrite=True (--overwrite) to replace the repro in it")
        check_writable_dir(out, "repro directory")
        return
    check_writable_dir(out.parent, "repro directory", target=out)
    try:
        out.mkdir()
    except OSError as e:
        raise OutputWriteError(f"cannot create the repro directory {str(out)!r}: {e.strerror}") from e


def _remove(path: Path) -> None:
    if path.exists():  # a file of an earlier repro in the same directory (overwrite=True); checked by _Targets
        path.unlink()


def _arrays(prefix: str, metas: list[TensorMeta], values: list[torch.Tensor]) -> tuple[list[dict], dict[str, Any]]:
    """npz arrays keyed ``<prefix>_<i>`` (IR names may hold '/', which a zip member name cannot) and their
    manifest entries; a dtype numpy lacks (bfloat16) is stored as float32 and named in ``dtype``."""
    entries, arrays = [], {}
    for i, (meta, value) in enumerate(zip(metas, values)):
        t = torch.as_tensor(value).detach().cpu()
        key = f"{prefix}_{i}"
        try:
            arrays[key] = t.numpy()
            stored = dtype_name(t.dtype)
        except TypeError:  # bfloat16, float8: numpy has no such dtype
            arrays[key] = t.float().numpy()
            stored = "float32"
        entries.append({"key": key, "name": meta.name, "dtype": dtype_name(t.dtype), "stored": stored,
                        "shape": list(t.shape)})
    return entries, arrays


def _onnx_node_model(case: ReproCase) -> tuple[bytes | None, str | None]:
    """The source ONNX model cut to the minimal IR's inputs and outputs (ONNX value names), or why not."""
    try:
        import onnx
        from onnx.utils import Extractor
    except ImportError as e:
        return None, f"onnx is not installed ({e})"
    proto = case.onnx_model
    values = {v for n in proto.graph.node for v in n.output} | {i.name for i in proto.graph.input}
    names_in = [t.name for t in case.ir.graph_inputs]
    names_out = [t.name for t in case.ir.graph_outputs]
    absent = [n for n in names_in + names_out if n not in values]
    if absent:
        return None, (f"the minimal IR's tensors {absent} are not values of the ONNX model (the converter made "
                      "them), so the ONNX node could not be cut out")
    try:
        # the extractor reads every value's type from value_info, which only shape inference fills in
        cut = Extractor(onnx.shape_inference.infer_shapes(proto)).extract_model(names_in, names_out)
        onnx.checker.check_model(cut)
    except Exception as e:  # noqa: BLE001 - the repro stands without it; the README says why
        return None, f"cutting the ONNX node out failed ({type(e).__name__}: {e})"
    return cut.SerializeToString(), None


# -- the README ---------------------------------------------------------------------------------------

_RUNS = {
    "frontend": ("the minimal IR on the reference executor (`IRExecutor`): the frontend's translation",
                 "the trusted framework's values in expected.npz; with model.onnx, onnxruntime runs the ONNX "
                 "node itself"),
    "rule": ("the rule {rule} rewrites the minimal IR, then `IRExecutor` runs the result",
             "`IRExecutor` on the minimal IR as it was before the rule"),
    "kernel": ("`npu_compiler.compile(ir, target='{backend}')` (no normalization, no fusion), run by "
               "`npu_runtime.Executor` on the {backend} backend",
               "`IRExecutor` on the minimal IR (the op's reference implementation)"),
    "lowering": ("`npu_compiler.compile(ir, target='{backend}')` (no normalization, no fusion), run by "
                 "`npu_runtime.Executor` on the {backend} backend",
                 "`IRExecutor` on the minimal IR (the op's reference implementation)"),
}


def _readme(case: ReproCase, manifest: dict, has_onnx: bool, onnx_note: str | None) -> str:
    """The README. Node, tensor, module and rule names come from a file (the model's IR): each is escaped
    (``markdown.cell``) or in a code span, and on one line, so no name is live markup (``<script>``, a link)
    or ends its line, row or code block. ``case.details`` is Markdown its caller wrote and escaped."""
    faulty, reference = (s.format(rule=code_span(case.rule), backend=case.backend) for s in _RUNS[case.kind])
    lines = [f"# {cell(case.title)}", "", f"Kind: **{case.kind}**"
             + (f", rule {code_span(case.rule)}" if case.rule else "")
             + (f", backend {code_span(case.backend)}" if case.backend else "") + ".", ""]
    if case.details.strip():
        lines += [case.details.strip(), ""]
    lines += ["## The minimal IR", "", *fenced([str(n) for n in case.ir.nodes]), ""]
    for node in case.ir.nodes:
        lines.append(f"- {code_span(node.name)}: {cell(_provenance_text(node))}")
    lines += ["", "## How to run", "", "```", "python repro.py              # the faulty path: exits 1 when it "
              "differs from expected.npz", "python repro.py --reference  # the reference path: exits 0 when it "
              "matches", "```", "", f"- faulty path: {faulty}.", f"- reference path: {reference}.",
              "- exit codes: 0 the values match expected.npz within tolerance, 1 they differ, 2 the path could not "
              "run here (no GPU adapter, onnxruntime missing).", "",
              f"Expected values come from {cell(case.trusted or 'the trusted (last good) stage')}. Tolerances: "
              + (f"rtol={case.rtol}, atol={case.atol}" if case.rtol is not None or case.atol is not None
                 else "the dtype's defaults (torch_ir.verify.tolerance)") + ".",
              "", "It needs only the installed toolkit (torch_ir, npu_compiler, npu_runtime), torch and numpy"
              + (" (and onnxruntime for the reference path)" if has_onnx else "") + ".", ""]
    if case.kind == "frontend" and not has_onnx:
        lines += ["There is no standalone trusted model here" + (f" ({cell(onnx_note)})" if onnx_note else "")
                  + ": the reference path only checks expected.npz, which holds the trusted framework's values.",
                  ""]
    if case.rule_source:
        lines += [f"The rule is imported from {code_span(case.rule_source)}: that module must be importable.", ""]
    lines += _files_section(case, has_onnx)
    widened = [e["name"] for e in manifest["inputs"] + manifest["outputs"] if e["stored"] != e["dtype"]]
    if widened:
        lines += [f"npz has no bfloat16: {cell(', '.join(widened))} are stored as float32 (exactly: every bfloat16 "
                  "is a float32) and `repro.py` casts them back to the dtype in case.json.", ""]
    lines += ["## Inputs and expected outputs", "", "| array | tensor | dtype | shape |", "|---|---|---|---|"]
    lines += [f"| {e['key']} | {cell(e['name'])} | {e['dtype']} | {e['shape']} |"
              for e in manifest["inputs"] + manifest["outputs"]]
    return "\n".join(lines) + "\n"


def _files_section(case: ReproCase, has_onnx: bool) -> list[str]:
    lines = ["## Files", "", "| file | what |", "|---|---|", "| `ir.json` | the minimal IR: only the faulty node(s) |"]
    if case.weights:
        lines.append("| `weights.safetensors` | the weights it reads, by state-dict key |")
    lines += ["| `inputs.npz` | its graph inputs (`input_<i>`, graph order) |",
              "| `expected.npz` | the expected graph outputs (`output_<i>`, graph order) |",
              "| `case.json` | kind, rule, backend, tolerances; each array's tensor name and dtype |"]
    if has_onnx:
        lines.append("| `model.onnx` | the trusted ONNX node(s) alone, run by onnxruntime |")
    return [*lines, "| `repro.py` | runs the faulty or the reference path and compares |", ""]


def _provenance_text(node: OpNode) -> str:
    p = provenance_of(node)
    parts = [f"{node.op_type}, from {', '.join(p.nodes)}"]
    if p.module:
        parts.append(f"module {p.module}")
    if p.origin:
        parts.append(f"made by {p.origin}")
    if p.rules:
        parts.append(f"rules {' -> '.join(p.rules)}")
    return "; ".join(parts)


# -- the script ---------------------------------------------------------------------------------------

SCRIPT = '''\
#!/usr/bin/env python
"""Standalone repro of one numerical fault; README.md says what is wrong.

    python repro.py              # the faulty path: exit 1 when it differs from expected.npz
    python repro.py --reference  # the reference path: exit 0 when it matches

Needs only the installed toolkit (torch_ir, npu_compiler, npu_runtime), torch and numpy.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from torch_ir.arrays import load_arrays as read_npz
from torch_ir.executor import IRExecutor
from torch_ir.ir import load_ir
from torch_ir.ops.values import dtype_from_name
from torch_ir.verify.compare import TABLE_HEADER, compare_tensors
from torch_ir.weights import load_state_dict

HERE = Path(__file__).resolve().parent


class CannotRunError(Exception):
    """The path cannot run here (no GPU adapter, onnxruntime missing): exit 2."""


def load_arrays(file, entries):
    """The tensors of an npz file in graph order, in their own dtype (bfloat16 was stored as float32); read by
    the toolkit's reader (numeric arrays only, sized before they are decompressed)."""
    data = read_npz(HERE / file, f"repro {file}")
    return [torch.from_numpy(data[e["key"]]).to(dtype_from_name(e["dtype"])) for e in entries]


def ir_reference(ir, weights, inputs):
    return IRExecutor(ir, weights).run(inputs)


def find_rules(case):
    """The rule(s) of that name: the toolkit's, or imported from case["rule_source"]."""
    if case.get("rule_source"):
        import importlib

        module, _, attr = case["rule_source"].partition(":")
        found = getattr(importlib.import_module(module), attr)
        rules = list(found) if isinstance(found, (list, tuple)) else [found]
    else:
        from npu_compiler.passes.kernel_fusion import KERNEL_FUSION_RULES
        from npu_compiler.passes.pipeline import ALL_RULES

        rules = [*ALL_RULES, *KERNEL_FUSION_RULES]
    rules = [r for r in rules if r.name == case["rule"]]
    if not rules:
        raise CannotRunError(f"no rewrite rule named {case['rule']!r} in this installation")
    return rules


def rule_applied(ir, weights, inputs, case):
    from torch_ir.rewrite import rewrite

    result = rewrite(ir, find_rules(case))
    if not result.changed:
        print(f"note: rule {case['rule']!r} did not apply to the minimal IR (the fault is elsewhere, or the rule "
              "now checks what it did not)")
    else:
        print(f"rule {case['rule']!r} applied {sum(result.applied.values())} time(s):")
        for node in result.ir.nodes:
            print(f"  {node}")
    return IRExecutor(result.ir, weights).run(inputs)


def compiled(ir, weights, inputs, case):
    import npu_compiler
    from npu_runtime import Device, Executor, NoAdapterError, load_weights

    options = npu_compiler.CompileOptions(normalize=False, fuse=False, public_output_names=False)
    program = npu_compiler.compile(ir, target=case["backend"], options=options, fallback="cpu")
    for d in program.dispatches:
        print(f"  dispatch {d.kernel} ({d.node})" + (f" on the host: {d.host}" if d.host else ""))
    try:
        device = Device(case["backend"])
    except NoAdapterError as e:
        raise CannotRunError(f"no {case['backend']} adapter here: {e}") from None
    executor = Executor(program, device)
    feeds = {spec.name: x for spec, x in zip(program.input_specs, inputs)}
    outs = executor.run(feeds, weights=load_weights(weights, program, device))
    by_name = {spec.name: torch.from_numpy(np.ascontiguousarray(outs[spec.name].to_numpy()))
               for spec in program.output_specs}
    # the runtime widens bfloat16 to float32 on the way out (numpy has none): back to the IR's dtype
    return [by_name[t.name].to(dtype_from_name(t.dtype)) for t in ir.graph_outputs]


def onnx_reference(ir, inputs, expected):
    if not (HERE / "model.onnx").exists():
        print("note: no standalone trusted model here; expected.npz holds the trusted framework's values")
        return expected
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise CannotRunError(f"the ONNX reference needs onnxruntime ({e})") from None
    session = ort.InferenceSession(str(HERE / "model.onnx"), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    feeds = {t.name: x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()
             for t, x in zip(ir.graph_inputs, inputs) if t.name in wanted}
    values = session.run([t.name for t in ir.graph_outputs], feeds)
    return [torch.from_numpy(np.asarray(v)) for v in values]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", action="store_true", help="run the reference path instead of the faulty one")
    args = parser.parse_args()
    case = json.loads((HERE / "case.json").read_text())
    ir = load_ir(HERE / "ir.json")
    weights = load_state_dict(HERE / "weights.safetensors") if (HERE / "weights.safetensors").exists() else {}
    inputs = load_arrays("inputs.npz", case["inputs"])
    expected = load_arrays("expected.npz", case["outputs"])
    kind = case["kind"]
    path = "reference" if args.reference else "faulty"
    print(f"{case['title']}\\n{path} path of a {kind} repro")
    try:
        if args.reference:
            actual = onnx_reference(ir, inputs, expected) if kind == "frontend" else ir_reference(ir, weights, inputs)
        elif kind == "rule":
            actual = rule_applied(ir, weights, inputs, case)
        elif kind in ("kernel", "lowering"):
            actual = compiled(ir, weights, inputs, case)
        else:
            actual = ir_reference(ir, weights, inputs)
    except CannotRunError as e:
        print(f"cannot run the {path} path here: {e}")
        return 2
    diffs = [compare_tensors(e["name"], a, x, case["rtol"], case["atol"])
             for e, a, x in zip(case["outputs"], actual, expected)]
    rows = [TABLE_HEADER] + [d.cells() for d in diffs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    bad = [d.name for d in diffs if not d.ok]
    if bad:
        print(f"DIFFERS: {len(bad)} of {len(diffs)} output(s) differ from expected.npz: {', '.join(bad)}")
        return 1
    print(f"MATCHES: every output matches expected.npz within tolerance ({path} path)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

__all__ = ["BACKENDS", "KINDS", "ReproCase", "ReproError", "SCRIPT", "sub_ir", "sub_weights", "write_repro"]
