"""The trusted per-node values: the original model re-exported and run node by node.

The IR's node and tensor names are the FX node names of the exported graph, so exporting the
original model again the same way (same functionalization, same dynamic dimensions) gives a graph
whose names are the IR's; ``torch.fx.Interpreter`` runs it on the real weights and inputs.

Two exports are tried, in order. The real-weights model as it is, which is how an IR extracted
with ``allow_real_weights=True`` was made; and the same model with its weights swapped for meta
tensors, the conditions of a meta extraction. They can differ: a meta kernel may return other
strides than the CPU one, so a ``.contiguous()`` that is a no-op on the CPU records a ``clone``
on meta, and every later name numbered after it shifts.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node
from torch.utils import _pytree as pytree

from ..ir import NPU_IR

EXPORT_MODES = ("real weights", "meta weights")


def export_reference(ir: NPU_IR, model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any],
                     mode: str) -> ExportedProgram:
    """Export ``model`` as ``extract_ir`` does; ``mode`` is one of ``EXPORT_MODES``."""
    # the frontend here, not at the top: the runtime's validation imports this package's comparisons and must
    # not load the torch.export frontend with them
    from ..frontends.meta_model import on_meta
    from ..frontends.torch_export import export_program

    shapes = _dynamic_shapes(ir, model, args, kwargs)
    if mode == "meta weights":
        args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), (args, dict(kwargs)))
    with on_meta(model) if mode == "meta weights" else contextlib.nullcontext():
        return export_program(model, args, kwargs, dynamic_shapes=shapes)


def unaligned(ir: NPU_IR, ep: ExportedProgram) -> list[str]:
    """Every IR name the exported graph lacks or gives another op; empty when all line up."""
    nodes = {n.name: n for n in ep.graph.nodes}
    tensors = set(nodes) | _unnamed_outputs(ep)
    problems = [f"{t.role or 'tensor'} {t.name!r} is not a placeholder there"
                for t in [*ir.graph_inputs, *ir.weights, *ir.constants]
                if t.name not in nodes or nodes[t.name].op != "placeholder"]
    for node in ir.nodes:
        fx_op = _fx_op(nodes.get(node.name))
        if fx_op != node.op_type:
            problems.append(f"node {node.name!r} is {node.op_type} in the IR, {fx_op or 'absent'} there")
        problems += [f"tensor {t.name!r} is absent there" for t in node.outputs if t.name not in tensors]
    return problems


def aligned_prefix(ir: NPU_IR, ep: ExportedProgram) -> int:
    """How many IR nodes, from the first, have a same-named node of the same op in the exported graph: after a
    node that does not line up, later FX names may shift, so only this prefix's values can be trusted by name."""
    nodes = {n.name: n for n in ep.graph.nodes}
    return next((i for i, node in enumerate(ir.nodes) if _fx_op(nodes.get(node.name)) != node.op_type),
                len(ir.nodes))


def _fx_op(fx: Node | None) -> str | None:
    """The op type an FX node calls (None for a placeholder, an output or no node)."""
    return str(fx.target) if fx is not None and fx.op == "call_function" else None


def _unnamed_outputs(ep: ExportedProgram) -> set[str]:
    """``<node>_out<i>``: the IR's names for elements of multi-output nodes that no getitem reads."""
    multi = [n for n in ep.graph.nodes if isinstance(n.meta.get("val"), (tuple, list))]
    return {f"{n.name}_out{i}" for n in multi for i in range(len(n.meta["val"]))}


def run_reference(ep: ExportedProgram, model: torch.nn.Module, args: tuple,
                  kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor the exported graph computes on the real weights and inputs, by FX node name."""
    inputs = _flat_inputs(ep, model, args, kwargs)
    device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    recorder = _Recorder(ep.graph_module, device)
    with torch.no_grad():
        recorder.run(*inputs)
    return recorder.values


def module_of(ep: ExportedProgram, name: str) -> str | None:
    """``"model.layers.0.mlp (LlamaMLP)"``: the innermost module the node ``name`` was traced in."""
    from ..frontends.export_nodes import innermost_module

    node = next((n for n in ep.graph.nodes if n.name == name), None)
    module = innermost_module(node) if node is not None else None
    if module is None:
        return None
    path, cls = module
    cls_name = getattr(cls, "__name__", str(cls).rsplit(".", 1)[-1])
    return f"{path} ({cls_name})" if path else cls_name  # an empty path is the model itself


class _Recorder(torch.fx.Interpreter):
    """Runs the graph like ``torch.fx.Interpreter`` and keeps every tensor, by FX node name.

    A meta export records ``device=meta`` in factory calls (``arange``, ``_to_copy``) and metadata
    asserts; they are run on ``device``, the data's, as the IR executor runs them.
    """

    def __init__(self, module: torch.fx.GraphModule, device: torch.device):
        super().__init__(module)
        self.device = device
        self.values: dict[str, torch.Tensor] = {}

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        on_device = lambda d: self.device if d.type == "meta" else d
        args, kwargs = pytree.tree_map_only(torch.device, on_device, (args, kwargs))
        return super().call_function(target, args, kwargs)

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.values[n.name] = result
        elif isinstance(result, (tuple, list)):
            # an element no getitem reads is named "<node>_out<i>" in the IR, as the frontend names it
            for i, r in enumerate(result):
                if isinstance(r, torch.Tensor):
                    self.values[f"{n.name}_out{i}"] = r
        return result


def _dynamic_shapes(ir: NPU_IR, model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """The IR inputs' symbolic dimensions as ``torch.export`` specs, or None for a static IR.

    A static export of a dynamic model has fewer shape nodes (``sym_size``, ``mul`` on sizes), and
    those shift FX names (``mul`` becomes ``mul_1``), so the dims the IR left symbolic are made
    dynamic again. Derived dims (``2*s0``) stay static; the name check catches what that breaks.
    """
    if not ir.symbols:
        return None
    dims = {name: _dim(name, rng) for name, rng in ir.symbols.items() if name.isidentifier()}
    per_input = [{axis: dims[d] for axis, d in enumerate(t.shape) if d in dims} or None for t in ir.graph_inputs]
    leaves, spec = pytree.tree_flatten((args, dict(kwargs)))
    specs = iter(per_input)
    try:
        arg_specs, kwarg_specs = pytree.tree_unflatten(
            [next(specs) if isinstance(x, torch.Tensor) else None for x in leaves], spec
        )
        return inspect.signature(model.forward).bind_partial(*arg_specs, **kwarg_specs).arguments
    except (StopIteration, TypeError):
        return None  # the inputs are not the IR's; a static export is the best left


def _dim(name: str, rng: dict[str, int | None]) -> Any:
    # the IR's range, not Dim's default: range guards are graph nodes too, and they shift names
    bounds = {k: v for k, v in (("min", rng.get("min")), ("max", rng.get("max"))) if v is not None}
    return Dim(name, **bounds)


def _flat_inputs(ep: ExportedProgram, model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> list[Any]:
    """Placeholder values in graph order: lifted weights and constants, then the user's inputs.

    Lifted tensors are read from the model by their dotted target, because a meta export's own
    state dict holds no data; tensors made inside forward exist only in the program's constants.
    """
    user = iter(pytree.tree_leaves((args, dict(kwargs))))
    values = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            values.append(next(user))
            continue
        try:
            values.append(functools.reduce(getattr, spec.target.split("."), model))
        except AttributeError:
            values.append(ep.constants[spec.target])
    return values
