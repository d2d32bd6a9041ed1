"""Verify an imported IR against onnxruntime, naming the first node that diverges.

onnxruntime runs the original ONNX model; the IR runs on the reference executor with the weights
the import returned. When an output differs, every IR tensor that kept its ONNX name is made an
extra output of the ONNX model, both sides run again, and the first IR node (in topological order)
whose outputs leave the tolerance is reported, with its inputs' and outputs' errors.

onnxruntime allocates whatever the model asks for; :func:`check_onnx_sizes` checks every tensor size
shape inference knows against ``torch_ir.limits`` first (``verify-onnx`` calls it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import torch

from ...executor import IRExecutor
from ...ir import NPU_IR, OpNode
from ...limits import check_shape
from ...verify import Localization, TensorDiff, VerificationReport, compare_tensors
from .context import np_dtype_name
from .dtypes import to_numpy, to_torch
from .loader import LoadedModel


def verify_onnx(ir: NPU_IR, weights: Mapping[str, torch.Tensor], model: str | os.PathLike | onnx.ModelProto,
                inputs: Sequence[torch.Tensor], *, rtol: float | None = None,
                atol: float | None = None) -> tuple[bool, VerificationReport]:
    """Run ``ir`` and ``model`` (with onnxruntime) on ``inputs`` and compare every output.

    Example::

        ir, weights = import_onnx("model.onnx")
        ok, report = verify_onnx(ir, weights, "model.onnx", [torch.randn(1, 3, 224, 224)])
        print(report)
    """
    proto = onnx.load(str(model)) if not isinstance(model, onnx.ModelProto) else model
    names = [t.name for t in ir.graph_outputs]
    expected = run_onnxruntime(proto, ir, inputs, names)
    actual = IRExecutor(ir, weights).run(list(inputs))
    diffs = [compare_tensors(n, a, e, rtol, atol) for n, a, e in zip(names, actual, expected)]
    ok = all(d.ok for d in diffs)
    report = VerificationReport(ir.model_name, ok, diffs)
    if not ok:
        report.localization = _localize(ir, weights, proto, inputs, rtol, atol)
    return ok, report


def check_onnx_sizes(loaded: LoadedModel) -> None:
    """Refuse (``LimitExceededError``) a model with a tensor of static shape over ``max_alloc_bytes``.

    A run (onnxruntime's, the executor's) would allocate it; a tensor of symbolic or unknown shape is
    not known here and left to the executors.
    """
    graph = loaded.model.graph
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if None in dims:
            continue
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize
        except (KeyError, ValueError, TypeError):
            itemsize = 1
        check_shape(dims, itemsize, f"{loaded.source}: tensor {vi.name!r}")


def run_onnxruntime(proto: onnx.ModelProto, ir: NPU_IR, inputs: Sequence[torch.Tensor],
                    names: Sequence[str]) -> list[torch.Tensor]:
    """The values of tensors ``names`` when onnxruntime runs ``proto`` (extra names become outputs)."""
    import onnxruntime as ort

    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    present = {o.name for o in proto.graph.output}
    for name in names:
        if name not in present:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    proto.ir_version = min(proto.ir_version, 10)  # onnxruntime may lag the newest IR version
    ort.set_default_logger_severity(3)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {meta.name: to_numpy(x) for meta, x in zip(ir.graph_inputs, inputs)}
    values = session.run(list(names), feeds)
    return [to_torch(np.asarray(v), np_dtype_name(np.asarray(v))) for v in values]


def _localize(ir: NPU_IR, weights: Mapping[str, torch.Tensor], proto: onnx.ModelProto,
              inputs: Sequence[torch.Tensor], rtol: float | None, atol: float | None) -> Localization:
    onnx_names = {o for n in proto.graph.node for o in n.output}
    named = [t.name for n in ir.nodes for t in n.outputs if t.name in onnx_names]
    try:
        reference = dict(zip(named, run_onnxruntime(proto, ir, inputs, named)))
    except Exception as e:  # noqa: BLE001 - onnxruntime refuses some intermediate outputs
        return Localization(note=f"onnxruntime could not return the intermediate values ({type(e).__name__}: {e})")
    values: dict[str, torch.Tensor] = dict(zip((t.name for t in ir.graph_inputs), inputs))
    loc = Localization()

    def on_node(node: OpNode, outs: list[torch.Tensor]) -> None:
        for meta, value in zip(node.outputs, outs):
            values[meta.name] = value
        diffs = [compare_tensors(m.name, v, reference[m.name], rtol, atol)
                 for m, v in zip(node.outputs, outs) if m.name in reference]
        if not diffs:
            return
        loc.compared += 1
        if all(d.ok for d in diffs):
            return
        loc.diverging += 1
        if loc.node is None:
            loc.node, loc.op_type, loc.node_text, loc.outputs = node.name, node.op_type, str(node), diffs
            loc.inputs = [_input_diff(t.name, values, reference) for t in node.inputs]

    IRExecutor(ir, weights).run_traced(list(inputs), on_node)
    if loc.node is None:
        loc.note = "every intermediate value onnxruntime returned agrees; only the outputs differ"
    return loc


def _input_diff(name: str, values: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> TensorDiff:
    value = values.get(name)
    if value is None or name not in reference:
        empty = value if value is not None else torch.empty(0)
        return compare_tensors(name, empty, empty)  # a weight or an unnamed intermediate: nothing to compare
    return compare_tensors(name, value, reference[name])
