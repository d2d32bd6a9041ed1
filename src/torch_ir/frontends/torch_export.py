"""PyTorch frontend: ``torch.export`` on the meta device, then ExportedProgram -> NPU_IR.

The model's parameters live on the meta device, so export only ever sees shapes and dtypes and
no weight is materialized, however large the model. ``from_exported_program`` does the graph
conversion and is public for users who already hold an ``ExportedProgram``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import Node
from torch.utils import _pytree as pytree
from torch.utils._sympy.numbers import int_oo

from .. import __version__
from ..errors import ExtractionError
from ..ir import NPU_IR, OpNode, TensorMeta, check_integrity
from ..ops.values import dtype_name, encode_value, sym_text
from .constants import ConstantRecorder
from .export_errors import explain_export_failure
from .hf import without_dynamic_cache

# Nodes that only assert facts the exporter already checked; they compute nothing.
_DROPPED_TARGETS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten._assert_async.msg,
}
# Ops that read a tensor's value into a Python scalar.
_SCALAR_READS = {torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default}
# Ops that return their first input unchanged in an inference graph (dropout with train=False).
_IDENTITY_TARGETS = {torch.ops.aten.dropout.default, torch.ops.aten.detach.default, torch.ops.aten.alias.default}
_INLINE_CONSTANT_LIMIT = 1 << 16  # elements; larger lifted constants are left to the weights file


def extract_ir(
    model: torch.nn.Module,
    example_inputs: Sequence[Any] = (),
    model_name: str | None = None,
    dynamic_shapes: Any = None,
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    allow_real_weights: bool = False,
    strict: bool = False,
) -> NPU_IR:
    """Export ``model`` with ``torch.export`` on the meta device and convert it to IR.

    Example::

        with torch.device("meta"):
            model = MyModel()
        ir = extract_ir(model.eval(), (torch.randn(1, 3, 224, 224, device="meta"),))

    ``example_inputs`` are the positional inputs and ``example_kwargs`` the keyword inputs, as
    ``torch.export.export`` takes them; they are moved to the meta device. Weights must be on the
    meta device, so that extraction never needs memory for them; ``allow_real_weights=True`` accepts
    a model with real weights (torch.export then traces with fake copies; nothing is computed).
    """
    if not isinstance(model, torch.nn.Module):
        raise ExtractionError(f"extract_ir expects a torch.nn.Module, got {type(model).__name__}")
    name = model_name or type(model).__name__
    if not allow_real_weights:
        _require_meta_weights(model, name)
    # Inputs go where the weights are: meta normally, the real device behind the flag.
    device = next((t.device for _, t in _named_state(model)), torch.device("meta"))
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    args = tuple(_to_device(a, device) for a in example_inputs)
    kwargs = {k: _to_device(v, device) for k, v in (example_kwargs or {}).items()}
    if model.training:
        model = model.eval()  # dropout and batch-norm statistics as in inference
    try:
        ep = export_program(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as e:  # noqa: BLE001 - every export failure is explained, then re-raised
        raise explain_export_failure(e, name) from e
    return from_exported_program(ep, model_name=name, model=model)


def export_program(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any] | None = None, *,
                   dynamic_shapes: Any = None, strict: bool = False) -> ExportedProgram:
    """``torch.export`` exactly as ``extract_ir`` runs it (the verifier re-exports with it, so names match).

    Traced with grad disabled, as inference runs. A model that switches grad mode itself
    (Hugging Face's rotary embedding is @torch.no_grad()) would otherwise leave a
    wrap_with_set_grad_enabled higher-order op, which only run_decompositions removes: a second
    full trace, as slow as the export. Constants made in forward from Python data keep their values.
    """
    recorder = ConstantRecorder()
    kwargs = dict(kwargs or {})
    with torch.no_grad(), recorder:
        try:
            ep = torch.export.export(model, args, kwargs=kwargs or None, dynamic_shapes=dynamic_shapes, strict=strict)
        except RuntimeError as e:
            retry = without_dynamic_cache(model, kwargs, e)
            if retry is None:
                raise
            ep = torch.export.export(model, args, kwargs=retry, dynamic_shapes=dynamic_shapes, strict=strict)
    if _needs_functionalization(ep):
        ep = ep.run_decompositions({})
    recorder.fill(ep)
    return ep


def from_exported_program(
    ep: ExportedProgram, model_name: str = "model", *, model: torch.nn.Module | None = None
) -> NPU_IR:
    """Convert an ``ExportedProgram`` into IR; its state dict keys become the weight names.

    In-place ops and higher-order ops (``wrap_with_set_grad_enabled``) are first removed by
    functionalizing the program (``run_decompositions({})``), which is only paid for when the graph
    needs it. That step decomposes nothing from the decomposition table, but it does lower
    CompositeImplicit ops: ``reshape`` becomes ``view``, ``contiguous`` becomes ``clone``, ``to``
    becomes ``_to_copy``.
    """
    if _needs_functionalization(ep):
        ep = ep.run_decompositions({})
    ir = _Converter(ep, model_name, model).convert()
    check_integrity(ir)
    return ir


# -- inputs and weights ---------------------------------------------------------------------------

def _to_device(value: Any, device: torch.device) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), value)


def _require_meta_weights(model: torch.nn.Module, name: str) -> None:
    real = [n for n, t in _named_state(model) if t.device.type != "meta"]
    if real:
        shown = ", ".join(real[:5]) + (f" and {len(real) - 5} more" if len(real) > 5 else "")
        raise ExtractionError(
            f"model {name!r} has weights that are not on the meta device ({shown}). "
            "Extraction never needs weight values: build the model under the meta device, e.g.\n"
            "    with torch.device('meta'):\n        model = MyModel(config)\n"
            "(Hugging Face: build from the config inside that block). To extract a model that already "
            "holds real weights anyway, pass allow_real_weights=True."
        )


def _named_state(model: torch.nn.Module):
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)


def _tied_names(model: torch.nn.Module | None) -> dict[str, list[str]]:
    """State-dict key -> the other keys that name the very same tensor (tied embeddings)."""
    if model is None:
        return {}
    groups: dict[int, list[str]] = {}
    for n, t in _named_state(model):
        groups.setdefault(id(t), []).append(n)
    return {names[0]: names[1:] for names in groups.values() if len(names) > 1}


def _needs_functionalization(ep: ExportedProgram) -> bool:
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator):
            return True
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable and target not in _DROPPED_TARGETS:
            return True
    return False


# -- graph conversion -------------------------------------------------------------------------------

def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _meta(name: str, value: torch.Tensor, role: str | None = None) -> TensorMeta:
    shape = [d if isinstance(d, int) else _dim_text(d) for d in value.shape]
    return TensorMeta(name=name, shape=shape, dtype=dtype_name(value.dtype), role=role)


def _dim_text(d: Any) -> int | str:
    text = sym_text(d)
    return text if isinstance(text, int) else text["sym"]


class _Converter:
    def __init__(self, ep: ExportedProgram, model_name: str, model: torch.nn.Module | None):
        self.ep, self.model_name, self.model = ep, model_name, model
        self.metas: dict[Node, TensorMeta] = {}  # FX node -> tensor it defines (single-output nodes)
        self.alias: dict[Node, Node] = {}  # dropped identity node -> its input
        self.derived: dict[str, Any] = {}  # unbacked symbol -> the shape expression it equals
        self.tied = _tied_names(model)  # first state-dict key -> the other keys of the same tensor
        self.tied_to = {alias: key for key, aliases in self.tied.items() for alias in aliases}
        self.seen_keys: dict[str, TensorMeta] = {}  # state-dict key -> its weight in the IR
        self.ir = NPU_IR(model_name=model_name, graph_inputs=[], graph_outputs=[], weights=[], nodes=[])

    def convert(self) -> NPU_IR:
        sig = self.ep.graph_signature
        specs = {s.arg.name: s for s in sig.input_specs}
        mutated = {s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node, specs[node.name], mutated)
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                self._outputs(node)
            else:
                raise ExtractionError(f"unexpected FX node {node.format_node()} in the exported graph")
        self.ir.producer = {
            "name": "torch_ir", "version": __version__, "frontend": "torch.export", "torch": torch.__version__,
        }
        self.ir.symbols = _symbols(self.ep)
        for name, expr in self.derived.items():
            self.ir.symbols[name] = {**self.ir.symbols.get(name, {}), "expr": expr}
        self.ir.weight_aliases = {k: v for k, v in self.tied.items() if k in self.seen_keys}
        return self.ir

    def _placeholder(self, node: Node, spec, mutated: set[str]) -> None:
        val = node.meta.get("val")
        if spec.kind == InputKind.USER_INPUT:
            if not _is_tensor(val) and not node.users:
                return  # a non-tensor keyword (use_cache=False): export specialized on it, nothing reads it
            if not _is_tensor(val):
                raise ExtractionError(
                    f"input {node.name!r} of model {self.model_name!r} is a {type(val).__name__}, not a tensor; "
                    "pass non-tensor settings as Python constants (functools.partial or a wrapper module)"
                )
            meta = _meta(node.name, val, "input")
            self.ir.graph_inputs.append(meta)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            tied = self.seen_keys.get(self.tied_to.get(spec.target, ""))
            if tied is not None:
                # On meta, export lifts each name of a tied tensor separately; the IR keeps one weight
                # (weight_aliases lists the other names), as an export with real weights does.
                self.metas[node] = tied
                return
            role = "weight" if spec.kind == InputKind.PARAMETER else ("kv" if spec.target in mutated else "buffer")
            meta = _meta(node.name, val, role)
            self.ir.weights.append(meta)
            self.ir.weight_name_mapping[node.name] = spec.target
            self.seen_keys[spec.target] = meta
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            meta = _meta(node.name, val, "constant")
            self.ir.constants.append(meta)
            value = self.ep.constants.get(spec.target)
            known = isinstance(value, torch.Tensor) and value.device.type != "meta"
            if known and value.numel() <= _INLINE_CONSTANT_LIMIT:
                self.ir.constant_values[node.name] = value.tolist()
            else:
                self.ir.weight_name_mapping.setdefault(node.name, spec.target)
        else:
            raise ExtractionError(
                f"input {node.name!r} of kind {spec.kind.name} is not supported "
                "(script objects cannot be stored in the IR); keep such state out of forward()"
            )
        self.metas[node] = meta

    def _call(self, node: Node) -> None:
        target, val = node.target, node.meta.get("val")
        if target in _DROPPED_TARGETS:
            return
        if target is operator.getitem and not _is_tensor(node.args[0].meta.get("val")):
            return  # an element of a multi-output op: named when its producer is converted
        if not isinstance(target, torch._ops.OpOverload):
            if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
                return  # shape arithmetic (sym_size, operator.mul): uses read its value as {"sym": expr}
            raise ExtractionError(
                f"node {node.name!r} calls {target} which is not an ATen op ({node.format_node()}); "
                "export it as a torch.library custom op so it can be registered with @register_op"
            )
        if not (_is_tensor(val) or isinstance(val, (tuple, list))):
            if target in _SCALAR_READS:
                self._bind_scalar_read(node, val)
            return  # a SymInt-valued ATen op (aten.sym_size.int, aten.item on a shape)
        if target in _IDENTITY_TARGETS and not _bind_args(target, node).get("train", False):
            self.alias[node] = self._resolve(node.args[0])  # (dropout only when not training)
            return
        self.ir.nodes.append(self._op_node(node, target, val))

    def _bind_scalar_read(self, node: Node, val: Any) -> None:
        """``aten.item`` of a tensor made from a shape (``torch.tensor(x.shape[1]).item()``).

        Export gives the result a fresh (unbacked) symbol ``u0``; its value is the shape expression
        the tensor was made from, so the symbol is recorded as derived from it. An ``item`` of
        computed data has no such expression: that is data-dependent and cannot be extracted.
        """
        src = self._resolve(node.args[0])
        if src.target is torch.ops.aten.scalar_tensor.default and isinstance(val, torch.SymInt):
            shape_value = src.args[0]
            self.derived[str(val.node.expr)] = sym_text(
                shape_value.meta["val"] if isinstance(shape_value, Node) else shape_value
            )
            return
        raise ExtractionError(
            f"node {node.name!r} reads a tensor value into Python ({node.format_node()}): the model has "
            "data-dependent control flow or shapes. Fix: keep the value a tensor, or use torch.cond/torch.where."
        )

    def _resolve(self, node: Node) -> Node:
        while node in self.alias:
            node = self.alias[node]
        return node

    def _op_node(self, node: Node, target: torch._ops.OpOverload, val: Any) -> OpNode:
        inputs: list[TensorMeta] = []
        attrs: dict[str, Any] = {}
        given = _bind_args(target, node)
        for arg in target._schema.arguments:
            if arg.name not in given:
                if _is_tensor_type(arg.type):
                    attrs[arg.name] = None  # keeps positional tensor decoding unambiguous
                continue
            value = given[arg.name]
            attrs_value = self._encode_arg(value, inputs)
            if attrs_value is not _TENSOR:
                attrs[arg.name] = attrs_value
        outputs = self._outputs_of(node, val)
        return OpNode(name=node.name, op_type=_op_type(target), inputs=inputs, outputs=outputs, attrs=attrs)

    def _encode_arg(self, value: Any, inputs: list[TensorMeta]) -> Any:
        if isinstance(value, Node):
            value = self._resolve(value)
            if _is_tensor(value.meta.get("val")):
                inputs.append(self.metas[value])
                return _TENSOR
            return sym_text(value.meta["val"])
        if isinstance(value, (list, tuple)) and any(_is_tensor_node(v) for v in value):
            refs: list[int | None] = []
            for v in value:
                if v is None:
                    refs.append(None)
                else:
                    refs.append(len(inputs))
                    inputs.append(self.metas[self._resolve(v)])
            return refs
        if isinstance(value, (list, tuple)):
            return [self._encode_arg(v, inputs) for v in value]
        return encode_value(value)

    def _outputs_of(self, node: Node, val: Any) -> list[TensorMeta]:
        if _is_tensor(val):
            meta = _meta(node.name, val, "activation")
            self.metas[node] = meta
            return [meta]
        getitems = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        outputs = []
        for i, v in enumerate(val):
            if not _is_tensor(v):
                continue
            user = getitems.get(i)
            meta = _meta(user.name if user is not None else f"{node.name}_out{i}", v, "activation")
            if user is not None:
                self.metas[user] = meta
            outputs.append(meta)
        return outputs

    def _outputs(self, node: Node) -> None:
        specs = self.ep.graph_signature.output_specs
        for value, spec in zip(node.args[0], specs):
            if spec.kind == OutputKind.BUFFER_MUTATION:
                buffer = next(n for n, k in self.ir.weight_name_mapping.items() if k == spec.target)
                self.ir.mutations[buffer] = self.metas[self._resolve(value)].name
            elif spec.kind == OutputKind.USER_OUTPUT:
                if not isinstance(value, Node) or not _is_tensor(value.meta.get("val")):
                    raise ExtractionError(
                        f"output {value!r} of model {self.model_name!r} is not a tensor; return tensors only"
                    )
                meta = self.metas[self._resolve(value)]
                if meta.role == "activation":
                    meta.role = "output"
                self.ir.graph_outputs.append(meta)
            else:
                raise ExtractionError(f"output kind {spec.kind.name} ({spec.target}) is not supported")


_TENSOR = object()  # marker: the argument went to OpNode.inputs


def _is_tensor_node(value: Any) -> bool:
    return isinstance(value, Node) and _is_tensor(value.meta.get("val"))


def _is_tensor_type(t: Any) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)


def _bind_args(target: torch._ops.OpOverload, node: Node) -> dict[str, Any]:
    given = dict(zip((a.name for a in target._schema.arguments), node.args))
    given.update(node.kwargs)
    return given


def _op_type(target: torch._ops.OpOverload) -> str:
    return str(target)  # "aten.conv2d.default": namespace.name.overload, as torch.ops spells it


def _symbols(ep: ExportedProgram) -> dict[str, dict[str, int | None]]:
    out: dict[str, dict[str, int | None]] = {}
    for sym, vr in ep.range_constraints.items():
        def bound(x: Any) -> int | None:
            if x in (int_oo, -int_oo) or getattr(x, "is_finite", True) is False:
                return None  # unbounded
            return int(x)
        out[str(sym)] = {"min": bound(vr.lower), "max": bound(vr.upper)}
    return out
