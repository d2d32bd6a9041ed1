"""ExportedProgram -> NPU_IR: the graph walk that turns placeholders, ATen calls and outputs into the IR."""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import Node

from .. import __version__
from ..errors import ExtractionError
from ..ir import NPU_IR, OpNode, Provenance, TensorMeta
from ..ops.values import dtype_name, encode_value
from ..weights import buffer_recipe
from .export_nodes import (
    DROPPED_TARGETS,
    IDENTITY_TARGETS,
    SCALAR_READS,
    TENSOR,
    bind_args,
    is_tensor,
    is_tensor_node,
    is_tensor_type,
    module_path,
    op_type,
    shapes_on_cpu,
)
from .export_quant import is_quant_target, quant_node
from .export_symbols import symbol_ranges, user_symbol_names
from .export_values import KnownValues
from .meta_model import named_state

_INLINE_CONSTANT_LIMIT = 1 << 16  # elements; larger lifted constants are left to the weights file


def _tied_names(model: torch.nn.Module | None) -> dict[str, list[str]]:
    """State-dict key -> the other keys that name the very same tensor (tied embeddings)."""
    if model is None:
        return {}
    groups: dict[int, list[str]] = {}
    for n, t in named_state(model):
        groups.setdefault(id(t), []).append(n)
    return {names[0]: names[1:] for names in groups.values() if len(names) > 1}


class ProgramConverter:
    """One exported program's conversion: ``convert()`` walks its graph once and returns the IR."""

    def __init__(self, ep: ExportedProgram, model_name: str, model: torch.nn.Module | None):
        self.ep, self.model_name, self.model = ep, model_name, model
        self.metas: dict[Node, TensorMeta] = {}  # FX node -> tensor it defines (single-output nodes)
        self.alias: dict[Node, Node] = {}  # dropped identity node -> its input
        self.derived: dict[str, Any] = {}  # unbacked symbol -> the shape expression it equals
        self.tied = _tied_names(model)  # first state-dict key -> the other keys of the same tensor
        self.tied_to = {alias: key for key, aliases in self.tied.items() for alias in aliases}
        self.seen_keys: dict[str, TensorMeta] = {}  # state-dict key -> its weight in the IR
        # sympy symbol -> its replacement: the user's Dim name, or the number an .item() of a constant read
        self.subs: dict[sympy.Symbol, Any] = user_symbol_names(ep)
        self.known = KnownValues(ep, model)  # values computed from constants only
        self.ir = NPU_IR(model_name=model_name, graph_inputs=[], graph_outputs=[], weights=[], nodes=[])

    # -- symbolic values ---------------------------------------------------------------------------
    def _sym(self, value: Any) -> Any:
        """A SymInt/SymFloat (or sympy expression, or number) as the IR writes it: a number, or {"sym": expr}
        with the user's dimension names and with folded values substituted."""
        expr = value.node.expr if hasattr(value, "node") else value
        if isinstance(expr, (bool, int, float)):
            return encode_value(expr)
        if self.subs and isinstance(expr, sympy.Basic):
            expr = expr.xreplace(self.subs)
        if getattr(expr, "is_number", False):
            number = int(expr) if expr.is_integer else float(expr)
            return encode_value(number)
        return {"sym": str(expr)}

    def _dim(self, d: Any) -> int | str:
        text = self._sym(d)
        return text["sym"] if isinstance(text, dict) else int(text)

    def _meta(self, name: str, value: torch.Tensor, role: str | None = None) -> TensorMeta:
        shape = [d if isinstance(d, int) else self._dim(d) for d in value.shape]
        return TensorMeta(name=name, shape=shape, dtype=dtype_name(value.dtype), role=role)

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
        self.ir.symbols = {self._dim(sym): rng for sym, rng in symbol_ranges(self.ep).items()
                           if not getattr(sym.xreplace(self.subs), "is_number", False)}
        for name, expr in self.derived.items():
            self.ir.symbols[name] = {**self.ir.symbols.get(name, {}), "expr": expr}
        self.ir.weight_aliases = {k: v for k, v in self.tied.items() if k in self.seen_keys}
        return self.ir

    def _placeholder(self, node: Node, spec, mutated: set[str]) -> None:
        val = node.meta.get("val")
        if spec.kind == InputKind.USER_INPUT:
            if not is_tensor(val) and not node.users:
                return  # a non-tensor keyword (use_cache=False): export specialized on it, nothing reads it
            if not is_tensor(val):
                raise ExtractionError(
                    f"input {node.name!r} of model {self.model_name!r} is a {type(val).__name__}, not a tensor; "
                    "pass non-tensor settings as Python constants (functools.partial or a wrapper module)"
                )
            meta = self._meta(node.name, val, "input")
            self.ir.graph_inputs.append(meta)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            tied = self.seen_keys.get(self.tied_to.get(spec.target, ""))
            if tied is not None:
                # On meta, export lifts each name of a tied tensor separately; the IR keeps one weight
                # (weight_aliases lists the other names), as an export with real weights does.
                self.metas[node] = tied
                return
            role = "weight" if spec.kind == InputKind.PARAMETER else ("kv" if spec.target in mutated else "buffer")
            meta = self._meta(node.name, val, role)
            self.ir.weights.append(meta)
            self.ir.weight_name_mapping[node.name] = spec.target
            self.seen_keys[spec.target] = meta
            if spec.kind == InputKind.BUFFER and spec.persistent is False:
                # Never in a state dict: record how to rebuild it, where extraction knows its value.
                recipe = buffer_recipe(self.known.value_of(spec))
                if recipe is not None and (recipe["shape"] != meta.shape or recipe["dtype"] != meta.dtype):
                    recipe = None
                self.ir.non_persistent_buffers[spec.target] = recipe
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            meta = self._meta(node.name, val, "constant")
            self.ir.constants.append(meta)
            value = self.known.value_of(spec)
            if value is not None and value.numel() <= _INLINE_CONSTANT_LIMIT and list(value.shape) == meta.shape:
                self.ir.constant_values[node.name] = value.tolist()
                self.ir.inlined_constant_keys[node.name] = spec.target
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
        if target in DROPPED_TARGETS:
            return
        if target is operator.getitem and not is_tensor(node.args[0].meta.get("val")):
            return  # an element of a multi-output op: named when its producer is converted
        if not isinstance(target, torch._ops.OpOverload):
            if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
                return  # shape arithmetic (sym_size, operator.mul): uses read its value as {"sym": expr}
            raise ExtractionError(
                f"node {node.name!r} calls {target} which is not an ATen op ({node.format_node()}); "
                "export it as a torch.library custom op so it can be registered with @register_op"
            )
        if not (is_tensor(val) or isinstance(val, (tuple, list))):
            if target in SCALAR_READS:
                self._bind_scalar_read(node, val)
            return  # a SymInt-valued ATen op (aten.sym_size.int, aten.item on a shape)
        if target in IDENTITY_TARGETS and not bind_args(target, node).get("train", False):
            self.alias[node] = self._resolve(node.args[0])  # (dropout only when not training)
            return
        if is_quant_target(target):  # PT2E's quantize/dequantize: the NPU ops, with the tensors' specs
            self.ir.nodes.append(quant_node(self, node, target))
            return
        self.ir.nodes.append(self._op_node(node, target, val))

    def _bind_scalar_read(self, node: Node, val: Any) -> None:
        """``aten.item``: a tensor's value read into a Python number, which export names with a fresh symbol.

        Two cases extract. A tensor made from a shape (``torch.tensor(x.shape[1]).item()``): the symbol is
        recorded as derived from that shape expression. A tensor computed from constants whose values are
        known (``feats.new_full(size, self.stride[i])`` with a stride attribute): the value is computed here
        and written in place of the symbol wherever it is used. An ``item`` of computed data (inputs,
        weights) is data-dependent and cannot be extracted.
        """
        src = self._resolve(node.args[0])
        if src.target is torch.ops.aten.scalar_tensor.default and isinstance(val, torch.SymInt):
            shape_value = src.args[0]
            self.derived[self._dim(val)] = self._sym(
                shape_value.meta["val"] if isinstance(shape_value, Node) else shape_value
            )
            return
        value = self.known.evaluate(src)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            number = value.item()
            expr = getattr(getattr(val, "node", None), "expr", None)
            if isinstance(expr, sympy.Symbol):
                self.subs[expr] = sympy.Integer(number) if isinstance(number, (bool, int)) else sympy.Float(number)
            return
        leaf, constant = self.known.unknown_leaf(src)
        if constant:
            raise ExtractionError(
                f"node {node.name!r} reads the value of {leaf} into Python ({node.format_node()}); the model was "
                "built on the meta device, where that value is not kept, so extraction cannot know it. Fix: build "
                "the model under torch_ir.build_on_meta() instead of torch.device('meta') "
                "(it keeps the values of small tensors made in __init__), or extract the model with its real "
                "tensors and allow_real_weights=True."
            )
        raise ExtractionError(
            f"node {node.name!r} reads a tensor value computed from {leaf} into Python ({node.format_node()}): "
            "the model has data-dependent control flow or shapes. Fix: keep the value a tensor, or use "
            "torch.cond/torch.where."
        )

    def _resolve(self, node: Node) -> Node:
        while node in self.alias:
            node = self.alias[node]
        return node

    def _op_node(self, node: Node, target: torch._ops.OpOverload, val: Any) -> OpNode:
        inputs: list[TensorMeta] = []
        attrs: dict[str, Any] = {}
        given = bind_args(target, node)
        for arg in target._schema.arguments:
            if arg.name not in given:
                if is_tensor_type(arg.type):
                    attrs[arg.name] = None  # keeps positional tensor decoding unambiguous
                continue
            value = given[arg.name]
            attrs_value = self._encode_arg(value, inputs)
            if attrs_value is not TENSOR:
                attrs[arg.name] = attrs_value
        outputs = self._outputs_of(node, val)
        provenance = Provenance(nodes=[node.name], module=module_path(node), origin="torch.export")
        return OpNode(name=node.name, op_type=op_type(target), inputs=inputs, outputs=outputs, attrs=attrs,
                      provenance=provenance)

    def _encode_arg(self, value: Any, inputs: list[TensorMeta]) -> Any:
        if isinstance(value, Node):
            value = self._resolve(value)
            if is_tensor(value.meta.get("val")):
                inputs.append(self.metas[value])
                return TENSOR
            return self._sym(value.meta["val"])
        if isinstance(value, (list, tuple)) and any(is_tensor_node(v) for v in value):
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
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self._sym(value)
        return encode_value(value)

    def _outputs_of(self, node: Node, val: Any) -> list[TensorMeta]:
        if is_tensor(val):
            meta = self._meta(node.name, val, "activation")
            self.metas[node] = meta
            return [meta]
        val = shapes_on_cpu(node, val)
        getitems = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        outputs = []
        for i, v in enumerate(val):
            if isinstance(v, (list, tuple)) and any(is_tensor(x) for x in v):
                raise ExtractionError(
                    f"node {node.name!r} ({node.target}) returns a list of tensors inside its outputs; the IR's "
                    "outputs of a node are a flat list of tensors, so this op cannot be extracted yet"
                )
            if not is_tensor(v):
                continue
            user = getitems.get(i)
            meta = self._meta(user.name if user is not None else f"{node.name}_out{i}", v, "activation")
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
                if not isinstance(value, Node) or not is_tensor(value.meta.get("val")):
                    raise ExtractionError(
                        f"output {value!r} of model {self.model_name!r} is not a tensor; return tensors only"
                    )
                meta = self.metas[self._resolve(value)]
                if meta.role == "activation":
                    meta.role = "output"
                self.ir.graph_outputs.append(meta)
            elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                # An op wrote into an input (``x.uniform_()``, batch norm's running statistics in training):
                # the input's new value, which the executor writes back into the caller's tensor.
                self.ir.mutations[spec.target] = self.metas[self._resolve(value)].name
            else:
                raise ExtractionError(f"output kind {spec.kind.name} ({spec.target}) is not supported")
