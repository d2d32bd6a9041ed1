"""PyTorch frontend: ``torch.export`` on the meta device, then ExportedProgram -> NPU_IR.

The model's parameters live on the meta device, so export only ever sees shapes and dtypes and
no weight is materialized, however large the model. ``from_exported_program`` does the graph
conversion and is public for users who already hold an ``ExportedProgram``.
"""

from __future__ import annotations

import contextlib
import keyword
import operator
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import Node
from torch.utils import _pytree as pytree
from torch.utils._sympy.numbers import int_oo

from .. import __version__
from ..errors import ExtractionError
from ..ir import NPU_IR, OpNode, Provenance, TensorMeta, check_integrity
from ..ops.symbolic import FUNCTIONS
from ..ops.values import dtype_name, encode_value
from ..weights import buffer_recipe
from .constants import SHADOW_LIMIT, ConstantRecorder, build_on_meta, known_value
from .export_errors import explain_export_failure
from .hf import without_dynamic_cache
from .meta_model import attributes_kept, named_state, on_cpu, refuse_leaked_trace_tensors, strays_on_meta

__all__ = ["build_on_meta", "export_program", "extract_ir", "from_exported_program"]

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
# Real tensors on a model otherwise on the meta device, at most this many elements in all, are strays that
# __init__ made without the default device (``torch.Tensor(n).uniform_()``): they go to meta, with a warning.


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
    A few small real tensors on a model otherwise on the meta device (made in ``__init__`` without the
    default device, as ``torch.Tensor(n).uniform_()`` does) are traced as meta tensors, with a warning
    that names them. Build the model under :func:`build_on_meta` rather than ``torch.device("meta")`` to
    have the IR record how to rebuild its non-persistent buffers, and the values of its tensor attributes.

    Dynamic dimensions keep the names of their ``torch.export.Dim`` (``Dim("batch")`` is ``batch`` in the
    IR). The model is left as it was found: attributes its ``forward`` sets while traced (a detection head
    caching anchors for the input shape) are restored afterwards.
    """
    if not isinstance(model, torch.nn.Module):
        raise ExtractionError(f"extract_ir expects a torch.nn.Module, got {type(model).__name__}")
    name = model_name or type(model).__name__
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    refuse_leaked_trace_tensors(model, name)
    with contextlib.nullcontext() if allow_real_weights else strays_on_meta(model, name):
        # Inputs go where the weights are: meta normally, the real device behind the flag.
        device = next((t.device for _, t in named_state(model)), torch.device("meta"))
        args = tuple(_to_device(a, device) for a in example_inputs)
        kwargs = {k: _to_device(v, device) for k, v in (example_kwargs or {}).items()}
        if model.training:
            model = model.eval()  # dropout and batch-norm statistics as in inference
        try:
            ep = export_program(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
        except Exception as e:  # noqa: BLE001 - every export failure is explained, then re-raised
            ep = _export_on_cpu(model, example_inputs, example_kwargs, dynamic_shapes, strict) \
                if device.type == "meta" and _needs_cpu_inputs(e) else None
            if ep is None:
                raise explain_export_failure(e, name) from e
        else:
            if device.type == "meta" and _unknown_constants(ep, model):
                # A tensor an op made from Python data in C++ (the index list of ``x[[1, 2]]``) has no value on
                # meta, and would become a weight nobody has; traced with CPU inputs, it is real.
                retry = _export_on_cpu(model, example_inputs, example_kwargs, dynamic_shapes, strict)
                if retry is not None and not _unknown_constants(retry, model):
                    ep = retry
        return from_exported_program(ep, model_name=name, model=model)


def _unknown_constants(ep: ExportedProgram, model: torch.nn.Module) -> bool:
    """Whether a lifted tensor constant of ``ep`` made inside an op is a meta tensor whose value extraction does
    not know. A constant that is a model attribute (a plain tensor attribute) is not: the model supplies it at
    run time, as a weight slot."""
    return any(isinstance(t, torch.Tensor) and t.is_meta and known_value(t) is None
               and not isinstance(_attribute(model, key), torch.Tensor) for key, t in ep.constants.items())


#: An export on the meta device that failed for want of a Meta kernel (``geqrf``, ``histogram``, sparse ops)
#: or because an op asserts that an argument is on the CPU (``tensor_split``'s tensor of indices).
_META_ONLY_FAILURE = re.compile(r"Meta tensors|Meta kernel|DispatchKey\.\w*Meta\b|must be on CPU, got meta")


def _needs_cpu_inputs(error: Exception) -> bool:
    return isinstance(error, (NotImplementedError, AssertionError, RuntimeError)) and \
        _META_ONLY_FAILURE.search(f"{error}") is not None


def _export_on_cpu(model: torch.nn.Module, example_inputs: Sequence[Any], example_kwargs: Mapping[str, Any] | None,
                   dynamic_shapes: Any, strict: bool) -> ExportedProgram | None:
    """Export again with the example inputs on the CPU, where an op has no Meta kernel; None when that fails too.

    Only for a model without weights or buffers, so no weight is ever allocated (a model with meta weights would
    mix devices and keeps the meta export's error). torch.export traces the CPU inputs as fake tensors: the CPU
    kernels' shape rules run, no op computes. Meta example inputs become zeros of their shape on the CPU.
    """
    if next(iter(named_state(model)), None) is not None:
        return None
    try:
        args = tuple(on_cpu(a) for a in example_inputs)
        kwargs = {k: on_cpu(v) for k, v in (example_kwargs or {}).items()}
    except Exception:  # noqa: BLE001 - an input that has no CPU form (a meta sparse tensor)
        return None
    try:
        with _recursion_capped(_RETRY_RECURSION_LIMIT):
            return export_program(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception:  # noqa: BLE001 - the meta export's error is the one to explain
        return None


# torch 2.13 can recurse without end tracing some graphs with CPU inputs (``aten.to.dtype_layout`` of a lifted
# constant); under Python's default limit that is a RecursionError the retry reports as "no retry", but a library
# that raised the limit (tinygrad sets 10000) lets it overflow the C stack and kill the process.
_RETRY_RECURSION_LIMIT = 3000


@contextlib.contextmanager
def _recursion_capped(limit: int) -> Iterator[None]:
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(min(previous, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


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
    with torch.no_grad(), attributes_kept(model), recorder, warnings.catch_warnings():
        # torch.export puts tensor attributes set by forward back, and says so; attributes_kept does the rest.
        warnings.filterwarnings("ignore", message=r"The tensor attributes? .* (was|were) assigned during export")
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

    The weights to run the IR with are the program's own: ``IRExecutor(ir, ep)`` (or
    ``torch_ir.weights.exported_program_state(ep)``, which is ``ep.state_dict`` plus the tensors of
    ``ep.constants``). Small lifted constants are held inline by the IR (``constant_values``); their keys
    are recorded in ``inlined_constant_keys``, so a source that still holds them is accepted.

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


def _tied_names(model: torch.nn.Module | None) -> dict[str, list[str]]:
    """State-dict key -> the other keys that name the very same tensor (tied embeddings)."""
    if model is None:
        return {}
    groups: dict[int, list[str]] = {}
    for n, t in named_state(model):
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


class _Converter:
    def __init__(self, ep: ExportedProgram, model_name: str, model: torch.nn.Module | None):
        self.ep, self.model_name, self.model = ep, model_name, model
        self.metas: dict[Node, TensorMeta] = {}  # FX node -> tensor it defines (single-output nodes)
        self.alias: dict[Node, Node] = {}  # dropped identity node -> its input
        self.derived: dict[str, Any] = {}  # unbacked symbol -> the shape expression it equals
        self.tied = _tied_names(model)  # first state-dict key -> the other keys of the same tensor
        self.tied_to = {alias: key for key, aliases in self.tied.items() for alias in aliases}
        self.seen_keys: dict[str, TensorMeta] = {}  # state-dict key -> its weight in the IR
        self.specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        # sympy symbol -> its replacement: the user's Dim name, or the number an .item() of a constant read
        self.subs: dict[sympy.Symbol, Any] = _user_symbol_names(ep)
        self.values: dict[Node, Any] = {}  # FX node -> its value computed from known constants (or None)
        self.order: dict[Node, int] = {}  # FX node -> its position in the graph (built on first use)
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

    # -- values known without weights ----------------------------------------------------------------
    def _known(self, spec: Any) -> torch.Tensor | None:
        """The value of a lifted constant or non-persistent buffer, where extraction can know it: the program
        holds it on a real device, or it was made under ``build_on_meta`` (a meta tensor with a known value)."""
        value = self.ep.constants.get(spec.target)
        if value is None and self.model is not None:
            value = _attribute(self.model, spec.target)
        if not isinstance(value, torch.Tensor):
            return None
        return value.detach() if value.device.type != "meta" else known_value(value)

    def _evaluate(self, node: Node) -> torch.Tensor | None:
        """``node``'s value when it is computed from known constants only (a stride selected from a constant),
        run on the CPU; None when it depends on an input, a weight or an unknown constant."""
        if node in self.values:
            return self.values[node]
        needed, stack = set(), [node]
        while stack:  # the nodes it depends on, all of which must be computable here
            n = stack.pop()
            if n in needed or n in self.values:
                continue
            needed.add(n)
            if n.op == "placeholder":
                spec = self.specs.get(n.name)
                value_kind = spec is not None and (spec.kind == InputKind.CONSTANT_TENSOR or (
                    spec.kind == InputKind.BUFFER and spec.persistent is False))
                if not value_kind or self._known(spec) is None:
                    return None
                continue
            if n.op != "call_function" or not (isinstance(n.target, torch._ops.OpOverload)
                                                or n.target is operator.getitem):
                return None
            for t in pytree.tree_leaves(n.meta.get("val")):
                if not isinstance(t, torch.Tensor) or not all(isinstance(d, int) for d in t.shape) \
                        or t.numel() > SHADOW_LIMIT:
                    return None  # a symbolic size, a large tensor, a Python scalar: not a constant to compute here
            stack.extend(n.all_input_nodes)
        order = self.order or {n: i for i, n in enumerate(self.ep.graph.nodes)}
        self.order = order
        for n in sorted(needed, key=order.__getitem__):
            self.values[n] = self._known(self.specs[n.name]) if n.op == "placeholder" else self._run_on_known(n)
        return self.values[node]

    def _run_on_known(self, node: Node) -> Any:
        """Run one node on the CPU values of its inputs (all computed by ``_evaluate``); None if it fails."""
        if any(self.values.get(a) is None for a in node.all_input_nodes):
            return None

        def arg(a: Any) -> Any:
            if isinstance(a, Node):
                return self.values[a]
            return torch.device("cpu") if a.type == "meta" else a

        args, kwargs = pytree.tree_map_only((Node, torch.device), arg, (node.args, dict(node.kwargs)))
        try:
            with torch.no_grad():
                return node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - a value that cannot be computed here is simply not known
            return None

    def _unknown_leaf(self, node: Node) -> tuple[str, bool]:
        """What an unknown value is computed from, for a message, and whether that is a constant (or
        non-persistent buffer) whose value was merely not recorded, rather than data."""
        seen, stack, found = set(), [node], None
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n.op == "placeholder":
                spec = self.specs.get(n.name)
                if spec is None or spec.kind == InputKind.USER_INPUT:
                    return f"the input {n.name!r}", False
                if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.persistent is not False:
                    return f"the {'parameter' if spec.kind == InputKind.PARAMETER else 'buffer'} {spec.target!r}", False
                if self._known(spec) is None:
                    kind = "tensor constant" if spec.kind == InputKind.CONSTANT_TENSOR else "non-persistent buffer"
                    found = found or f"the {kind} {spec.target!r}"
            stack.extend(n.all_input_nodes)
        return (found, True) if found else ("values extraction cannot compute", False)

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
        self.ir.symbols = {self._dim(sym): rng for sym, rng in _symbols(self.ep).items()
                           if not getattr(sym.xreplace(self.subs), "is_number", False)}
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
                recipe = buffer_recipe(self._known(spec))
                if recipe is not None and (recipe["shape"] != meta.shape or recipe["dtype"] != meta.dtype):
                    recipe = None
                self.ir.non_persistent_buffers[spec.target] = recipe
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            meta = self._meta(node.name, val, "constant")
            self.ir.constants.append(meta)
            value = self._known(spec)
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
        value = self._evaluate(src)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            number = value.item()
            expr = getattr(getattr(val, "node", None), "expr", None)
            if isinstance(expr, sympy.Symbol):
                self.subs[expr] = sympy.Integer(number) if isinstance(number, (bool, int)) else sympy.Float(number)
            return
        leaf, constant = self._unknown_leaf(src)
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
        provenance = Provenance(nodes=[node.name], module=_module_path(node), origin="torch.export")
        return OpNode(name=node.name, op_type=_op_type(target), inputs=inputs, outputs=outputs, attrs=attrs,
                      provenance=provenance)

    def _encode_arg(self, value: Any, inputs: list[TensorMeta]) -> Any:
        if isinstance(value, Node):
            value = self._resolve(value)
            if _is_tensor(value.meta.get("val")):
                inputs.append(self.metas[value])
                return _TENSOR
            return self._sym(value.meta["val"])
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
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self._sym(value)
        return encode_value(value)

    def _outputs_of(self, node: Node, val: Any) -> list[TensorMeta]:
        if _is_tensor(val):
            meta = self._meta(node.name, val, "activation")
            self.metas[node] = meta
            return [meta]
        val = _shapes_on_cpu(node, val)
        getitems = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        outputs = []
        for i, v in enumerate(val):
            if isinstance(v, (list, tuple)) and any(_is_tensor(x) for x in v):
                raise ExtractionError(
                    f"node {node.name!r} ({node.target}) returns a list of tensors inside its outputs; the IR's "
                    "outputs of a node are a flat list of tensors, so this op cannot be extracted yet"
                )
            if not _is_tensor(v):
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
                if not isinstance(value, Node) or not _is_tensor(value.meta.get("val")):
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


def innermost_module(node: Node) -> tuple[str, Any] | None:
    """(module path, module class) of the innermost module ``node`` was traced in; the path is "" for the model
    itself; None when torch.export recorded no module stack."""
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1] if stack else None


def _module_path(node: Node) -> str | None:
    """``"layers.3.mlp"``: the provenance's module path (None for the model itself)."""
    path = (innermost_module(node) or ("", None))[0]
    return path if isinstance(path, str) and path else None


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


def _symbols(ep: ExportedProgram) -> dict[Any, dict[str, int | None]]:
    """Each symbol of the program (a sympy symbol) -> its range."""
    out: dict[Any, dict[str, int | None]] = {}
    for sym, vr in ep.range_constraints.items():
        def bound(x: Any) -> int | None:
            if x in (int_oo, -int_oo) or getattr(x, "is_finite", True) is False:
                return None  # unbounded
            return int(x)
        out[sym] = {"min": bound(vr.lower), "max": bound(vr.upper)}
    return out


def _shape_env(ep: ExportedProgram) -> Any:
    for node in ep.graph.nodes:
        mode = getattr(node.meta.get("val"), "fake_mode", None)
        if node.op == "placeholder" and getattr(mode, "shape_env", None) is not None:
            return mode.shape_env
    return None


def _user_symbol_names(ep: ExportedProgram) -> dict[sympy.Symbol, sympy.Symbol]:
    """Each symbol of a dimension the user named with ``torch.export.Dim("batch")`` -> a symbol ``batch``.

    torch.export names the symbols ``s0``, ``s27``...; its shape environment remembers which input dimension
    each comes from (``L['x'].size()[0]``) and which Dim name the user gave that dimension. A name is used
    only when it is unambiguous: one symbol per name, an identifier that is no keyword, no function of the
    symbolic-size grammar (``Max``) and no other symbol's name; otherwise the symbol keeps torch's name.
    """
    env = _shape_env(ep)
    debug = getattr(env, "source_name_to_debug_name", None) if env is not None else None
    if not debug:
        return {}
    names: dict[sympy.Symbol, set[str]] = {}
    for sym, sources in getattr(env, "var_to_sources", {}).items():
        target = env.replacements.get(sym, sym)
        if not isinstance(target, sympy.Symbol):
            continue
        for source in sources:
            source_name = source.name if isinstance(source.name, str) else source.name()
            if source_name in debug:
                names.setdefault(target, set()).add(debug[source_name])
    chosen = {sym: next(iter(found)) for sym, found in names.items() if len(found) == 1}
    counts = Counter(chosen.values())
    taken = {str(sym) for sym in ep.range_constraints} | {str(sym) for sym in env.var_to_sources}
    return {
        sym: sympy.Symbol(name, **sym.assumptions0)
        for sym, name in chosen.items()
        if counts[name] == 1 and name.isidentifier() and not keyword.iskeyword(name) and name not in FUNCTIONS
        and (name == str(sym) or name not in taken)
    }


def _shapes_on_cpu(node: Node, val: Any) -> Any:
    """A multi-output op's outputs as the CPU kernel makes them, where that differs from the meta kernel.

    Extraction traces on the meta device, and a few meta kernels declare outputs other than what real kernels
    return: ``_native_batch_norm_legit_no_training`` declares its saved mean and invstd as ``[C]``, while the
    CPU (and the decomposition) return ``[0]``, the op having nothing to save in inference. The IR declares
    what the op returns, so the outputs of multi-output ops are propagated again with CPU fake tensors (shapes
    only: nothing is computed or allocated) and the CPU shapes are kept; ``val`` stays when that cannot be done.
    """
    leaves = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, Node)]
    mode = next((getattr(a.meta.get("val"), "fake_mode", None) for a in leaves
                 if getattr(a.meta.get("val"), "fake_mode", None) is not None), None)
    if mode is None or not isinstance(node.target, torch._ops.OpOverload):
        return val

    def cpu_arg(a: Any) -> Any:
        if isinstance(a, Node):
            v = a.meta.get("val")
            return v.to("cpu") if _is_tensor(v) and v.device.type == "meta" else v
        if isinstance(a, torch.device) and a.type == "meta":
            return torch.device("cpu")
        return a

    try:
        with mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args, kwargs = pytree.tree_map_only((Node, torch.device), cpu_arg, (node.args, dict(node.kwargs)))
            cpu = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the meta shapes stand when the CPU ones cannot be had
        return val
    if not isinstance(cpu, (tuple, list)) or len(cpu) != len(val):
        return val
    return [c if _is_tensor(c) and _is_tensor(v) and c.dtype == v.dtype and c.dim() == v.dim() else v
            for c, v in zip(cpu, val)]


def _attribute(model: torch.nn.Module, path: str) -> Any:
    obj: Any = model
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj
