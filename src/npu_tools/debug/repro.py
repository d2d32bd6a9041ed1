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

The README is written by ``repro_readme``, the script is ``repro_script.SCRIPT``.
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
from torch_ir.ir import NPU_IR, TensorMeta, check_integrity, subgraph
from torch_ir.ops.values import dtype_name

from .outdir import check_entry, check_inside, check_same_directory, identity
from .repro_readme import readme_text
from .repro_script import SCRIPT

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

    readme = readme_text(case, manifest, onnx_bytes is not None, onnx_note)
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


__all__ = ["BACKENDS", "KINDS", "ReproCase", "ReproError", "SCRIPT", "sub_ir", "sub_weights", "write_repro"]
