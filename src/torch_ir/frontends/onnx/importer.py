"""ONNX graph -> NPU_IR: one walk over the nodes in order, with an environment of values.

A value is an IR ``TensorMeta`` (computed at run time), a numpy array (known at import time:
an initializer, a ``Constant``, a folded subgraph) or None (an absent optional input). Each node
is folded when its inputs are known, else handed to its converter (``converters.TABLE``). Nodes
nobody can convert are collected and reported together at the end; no IR is returned half-way.

The model is untrusted: a fold or a converter's constant is made only under ``torch_ir.limits``
(``fold_allowed``, checked before allocating), and every failure, however malformed the model, ends
as a ``TorchIRError`` that names the file and the node.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
import torch

from ... import __version__
from ...errors import ExtractionError, LimitExceededError, TorchIRError, UnsupportedOpError
from ...ir import NPU_IR, Provenance, TensorMeta, check_integrity
from ...limits import check_shape, fold_allowed
from ...ops.values import INLINE_DTYPES, eval_sym
from . import fold
from .context import Ctx, FoldLimitExceeded, UnsupportedNode, Value, np_dtype_name
from .converters import lookup
from .converters.reference import reference_node
from .dtypes import WIDE, held_dtype, ir_dtype, to_torch
from .loader import InvalidModelError, LoadedModel, initializer_value, packed_value, tensor_value
from .symbolic import all_ints, fold_symbolic, is_symbolic

#: Initializers up to this many elements are read at import time, so that shape-like ones
#: (reshape targets, axes) fold; larger ones are weights referenced by name.
_SMALL_INITIALIZER = 1 << 16
#: Constants up to this many elements are stored inline in the IR JSON; larger ones in the weights file.
_INLINE_LIMIT = 1 << 12
_HINT_BASE = 3001  # symbolic dims run on meta with distinct odd sizes from here (rarely a real size)


class Importer:
    """One import: the loaded model in, ``(ir, weights)`` out of ``run()``; converters reach it as ``ctx.graph``."""

    def __init__(self, loaded: LoadedModel, model_name: str, *, reference_fallback: bool = True):
        self.loaded, self.opset, self.reference_fallback = loaded, loaded.opset, reference_fallback
        self.fallbacks: dict[str, str] = {}  # IR node -> why it stayed an ONNX op
        self.converted_by: dict[str, str] = {}  # ONNX node -> the converter that made its IR nodes (provenance)
        graph = loaded.model.graph
        self.ir = NPU_IR(model_name=model_name, graph_inputs=[], graph_outputs=[], weights=[], nodes=[])
        self.weights: dict[str, torch.Tensor] = {}
        self.env: dict[str, Value] = {}
        self.types = {vi.name: vi for vi in [*graph.value_info, *graph.output, *graph.input]}
        self.used_tensors = set(self.types) | {i.name for i in graph.initializer} | {
            o for n in graph.node for o in n.output}
        self.used_nodes: set[str] = set()
        self.hints: dict[str, int] = {}  # symbol -> the size it has on the meta device
        self.input_symbols: set[str] = set()  # symbols of the graph inputs: the executor binds these
        self._unhints: dict[int, str] = {}
        self._initializer_of: dict[int, str] = {}  # id(array) -> initializer name, to keep ONNX names
        self._materialized: dict[str, TensorMeta] = {}  # initializer / constant name -> IR tensor
        self.wide_constants: dict[str, tuple] = {}  # 4-bit initializer -> (IR tensor, array) one code per byte
        self.held_as: dict[str, str] = {}  # tensor -> its ONNX 4-bit type, where it is held unpacked (dtypes.WIDE)
        self.unsupported: list[str] = []
        self._poisoned: set[str] = set()  # outputs of unconvertible nodes (their users are not reported)
        self._where = "the graph"  # what the walk is at, for errors
        self._symbols_used = set(loaded.symbols.values())  # every symbol name given out
        # (set id, base) -> last suffix given: a file naming 10**5 nodes alike costs linear time, not quadratic
        self._suffixes: dict[tuple[int, str], int] = {}

    # -- the walk ---------------------------------------------------------------------------------
    def run(self) -> tuple[NPU_IR, dict[str, torch.Tensor]]:
        """The IR and weights; any failure is a ``TorchIRError`` naming the file and where the walk was."""
        source = self.loaded.source
        try:
            return self._run()
        except LimitExceededError as e:  # the registry refuses a node over max_alloc_bytes: name the file
            if source in str(e):
                raise
            raise LimitExceededError(f"{source}: {e}") from None
        except TorchIRError:
            raise
        except UnsupportedNode as e:  # outside a node (a graph input of no tensor type, ...)
            raise ExtractionError(f"{source}: {self._where}: {e}") from None
        except RecursionError:
            raise InvalidModelError(f"{source}: {self._where}: nested too deeply to import") from None
        except MemoryError:
            raise LimitExceededError(
                f"{source}: {self._where}: out of memory; the model asks for more than this machine has "
                "(see torch_ir.limits)") from None
        except Exception as e:  # noqa: BLE001 - a malformed model must not escape as a KeyError, IndexError, ...
            raise ExtractionError(f"{source}: {self._where} cannot be imported ({type(e).__name__}: {e}); the "
                                  "model is malformed, or this is a bug in the ONNX importer") from e

    def _run(self) -> tuple[NPU_IR, dict[str, torch.Tensor]]:
        graph = self.loaded.model.graph
        if graph.sparse_initializer:
            names = [t.values.name for t in graph.sparse_initializer][:5]
            raise ExtractionError(f"{self.loaded.source}: sparse initializers ({names}) are not supported; "
                                  "store them as dense initializers")
        initialized = {t.name for t in graph.initializer}
        for vi in graph.input:
            if vi.name not in initialized:  # an input with an initializer is a default: keep it constant
                self._where = f"graph input {vi.name!r}"
                meta = self.meta_of(vi, "input")
                check_shape([d for d in meta.shape if isinstance(d, int)], 0, f"{self.loaded.source}: {self._where}")
                self.ir.graph_inputs.append(meta)
                self.env[vi.name] = meta
                self.input_symbols.update(d for d in meta.shape if isinstance(d, str))
        for t in graph.initializer:
            self._where = f"initializer {t.name!r}"
            self._initializer(t)
        for index, node in enumerate(graph.node):
            self._where = f"node {node.name or f'{node.op_type}_{index}'!r} ({node.op_type})"
            self._node(index, node)
        self._where = "the graph outputs"
        if self.unsupported:
            raise UnsupportedOpError(self._unsupported_report())
        for vi in graph.output:
            self.ir.graph_outputs.append(self._output(vi))
        self.ir.symbols = {s: {"min": None, "max": None} for s in self.hints}
        self.ir.weight_name_mapping = {w.name: w.name for w in self.ir.weights}
        self.ir.producer = {"name": "torch_ir", "version": __version__, "frontend": "onnx", "onnx": onnx.__version__,
                            "source_producer": self.loaded.model.producer_name, "opset": str(self.opset)}
        self.ir.metadata = {"source": self.loaded.source, "onnx_ops_kept": self.fallbacks}
        check_integrity(self.ir, source=f"IR imported from {self.loaded.source}")
        return self.ir, self.weights

    def _initializer(self, t: onnx.TensorProto) -> None:
        # the declared size is checked (tensor_value) before anything is read or allocated
        numel = math.prod(t.dims) if t.dims else 1
        if numel <= _SMALL_INITIALIZER:
            value = initializer_value(t, self.loaded.base_dir, self.loaded.source)
            self._initializer_of[id(value)] = t.name
            self.env[t.name] = value
        else:  # a weight: described now, read now (one tensor at a time)
            dtype = ir_dtype(t.data_type, f"{self.loaded.source}: initializer {t.name!r}")
            meta = TensorMeta(t.name, list(t.dims), held_dtype(dtype, list(t.dims)), role="weight")
            packed = packed_value(t, self.loaded.base_dir, self.loaded.source) if meta.dtype in WIDE else None
            # 4-bit codes stay as ONNX packs them (no unpacking); everything else is read as numpy
            value = packed if packed is not None else initializer_value(t, self.loaded.base_dir, self.loaded.source)
            self.ir.weights.append(meta)
            self.weights[t.name] = torch.from_numpy(value) if packed is not None else to_torch(value, meta.dtype)
            self.env[t.name] = meta

    def _node(self, index: int, node: onnx.NodeProto) -> None:
        name = node.name or f"{node.op_type}_{index}"
        if any(i in self._poisoned for i in node.input):
            self._poisoned.update(node.output)
            return
        missing = [i for i in node.input if i and i not in self.env]
        if missing:  # onnx.checker catches these in a graph; a converter may have left an output unset
            self._unsupported(node, name, f"input(s) {missing} have no value")
            return
        inputs = [self.env[i] if i else None for i in node.input]
        attrs = self._attributes(node, name)
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
            folded = None  # a quantized constant stays quantized: its DEQUANTIZE is kept, not folded to floats
        else:
            folded = self._fold(node, inputs, attrs)
        if folded is not None:
            for out, value in zip(node.output, folded):
                if out:
                    self.env[out] = value
            return
        ctx = Ctx(self, name, self.opset, len(node.output))
        try:
            outputs = self._convert(ctx, node, inputs, attrs)
        except FoldLimitExceeded as e:  # neither a constant nor an ONNX op: refused, with the limit
            raise LimitExceededError(
                f"{self.loaded.source}: node {name!r} ({node.op_type}): {e}; it cannot stay a graph node here "
                "(reference_fallback=False or no ONNX form); if the model is trusted, raise the limit: set "
                "TORCH_IR_MAX_FOLD_BYTES or call torch_ir.limits.set_limits(max_fold_bytes=...)") from None
        except UnsupportedNode as e:
            self._unsupported(node, name, str(e))
            return
        origin = f"onnx:{node.op_type} {self.converted_by.pop(name, 'reference')}"
        for n in ctx.emitted:  # each IR node says which ONNX node and which converter made it
            n.provenance = Provenance(nodes=[n.name], module=name, origin=origin)
        self.ir.nodes.extend(ctx.emitted)
        for out, value in zip([o for o in node.output if o], outputs):
            self.env[out] = value
        _rename_in_specs(ctx.emitted, ctx.names_before_bind)

    def _attributes(self, node: onnx.NodeProto, name: str) -> dict[str, Any]:
        """The node's attributes as Python values; a tensor attribute is read like an initializer (checked)."""
        def tensor(t: onnx.TensorProto, what: str) -> np.ndarray:
            return tensor_value(t, self.loaded.base_dir, self.loaded.source, f"{what} of node {name!r}")

        out = {}
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                out[a.name] = tensor(a.t, f"attribute {a.name!r}")
                continue
            if a.type == onnx.AttributeProto.TENSORS:
                out[a.name] = [tensor(t, f"attribute {a.name!r}") for t in a.tensors]
                continue
            try:
                value = onnx.helper.get_attribute_value(a)
            except Exception as e:  # noqa: BLE001 - an attribute with no value set, or of an unknown type
                raise InvalidModelError(f"{self.loaded.source}: node {name!r}: attribute {a.name!r} cannot be "
                                        f"read ({type(e).__name__}: {e})") from None
            try:
                if isinstance(value, bytes):
                    value = value.decode()
                elif isinstance(value, list) and value and isinstance(value[0], bytes):
                    value = [v.decode() for v in value]
            except UnicodeDecodeError:
                raise InvalidModelError(f"{self.loaded.source}: node {name!r}: string attribute {a.name!r} is not "
                                        "UTF-8 text") from None
            out[a.name] = value
        return out

    def _convert(self, ctx: Ctx, node: onnx.NodeProto, inputs: list[Value], attrs: dict[str, Any]) -> list[Value]:
        """Convert with the ATen converter; where there is none, or it declines, keep the ONNX op."""
        opset = self.domain_opset(node.domain)
        entry = lookup(node.domain, node.op_type, opset)
        reason = "no ATen converter"
        over_limit: FoldLimitExceeded | None = None
        if entry is not None:
            try:
                result = entry.fn(ctx, *inputs, **attrs)
                outputs = result if isinstance(result, (tuple, list)) else (result,)
                self.converted_by[ctx.name] = f"{entry.fn.__module__}.{entry.fn.__qualname__}"
                return [self._bind(ctx, out, value) for out, value in zip(node.output, outputs) if out]
            except FoldLimitExceeded as e:
                if not self.reference_fallback:
                    raise
                over_limit, reason = e, str(e)
            except UnsupportedNode as e:
                reason = str(e)
            except TypeError as e:  # an ONNX attribute the converter does not take
                reason = f"converter {entry.fn.__name__}: {e}"
            except TorchIRError:
                raise
            except (MemoryError, RecursionError):
                raise
            except Exception as e:  # noqa: BLE001 - a hostile attribute or shape (an axis out of range, a 0 size)
                reason = f"converter {entry.fn.__name__} fails on this node ({type(e).__name__}: {str(e)[:200]})"
            ctx.emitted.clear()
        if not self.reference_fallback:
            raise UnsupportedNode(reason)
        try:
            outputs = reference_node(ctx, node, inputs, attrs, opset)
        except UnsupportedNode as e:
            if over_limit is not None:
                raise FoldLimitExceeded(f"{over_limit}; as an ONNX op: {e}") from None
            raise UnsupportedNode(f"{reason}; {e}") from None
        self.fallbacks[ctx.name] = f"{node.op_type}: {reason}"
        return [self._bind(ctx, out, value) for out, value in zip([o for o in node.output if o], outputs)]

    def domain_opset(self, domain: str) -> int:
        if domain in ("", "ai.onnx"):
            return self.opset
        return next((i.version for i in self.loaded.model.opset_import if i.domain == domain), 1)

    def _fold(self, node: onnx.NodeProto, inputs: list[Value], attrs: dict[str, Any]) -> list[np.ndarray] | None:
        symbolic = fold_symbolic(node, inputs, attrs, self.input_symbols)
        if symbolic is not None:  # shape arithmetic on symbols; an all-int result is an ordinary constant
            return [v.astype(np.int64) if all_ints(v) else v for v in symbolic]
        if any(is_symbolic(v) for v in inputs):
            return None
        if node.op_type in ("Shape", "Size") and inputs and isinstance(inputs[0], TensorMeta):
            value = fold.static_shape_value(node.op_type, node, inputs[0])
            return None if value is None else [value]
        if not fold.can_fold(node, inputs):
            return None
        # the size of the result, before making it: over max_fold_bytes the node stays a graph node
        nbytes = fold.output_nbytes(node, inputs, self.opset)
        if nbytes is None or not fold_allowed(nbytes):
            return None
        try:
            return fold.evaluate(node, inputs, self.opset)
        except Exception:  # noqa: BLE001 - the reference cannot run it: leave the node to its converter
            return None

    def _bind(self, ctx: Ctx, out: str, value: Value) -> Value:
        """Give the converter's result the ONNX output's name, dtype and (symbolic) shape."""
        if not isinstance(value, TensorMeta) or not any(value is o for n in ctx.emitted for o in n.outputs):
            return value  # a constant, or an input passed through: an alias, no node
        declared = self.types.get(out)
        tt = declared.type.tensor_type if declared is not None else None
        if tt is not None and tt.elem_type:
            want = ir_dtype(tt.elem_type, f"tensor {out!r}")
            if WIDE.get(want) == value.dtype:  # a 4-bit output held unpacked (WIDE) is that type already
                self.held_as[out] = want
            elif want != value.dtype:  # ONNX fixes the output type; ATen may promote differently
                value = ctx.cast(value, want)
            if tt.HasField("shape"):  # (shape inference may know the type but not the rank)
                value.shape = _merge_shape(value.shape, [self._dim(d) for d in tt.shape.dim], out)
        ctx.names_before_bind.setdefault(id(value), value.name)
        value.name = out
        return value

    def _output(self, vi: onnx.ValueInfoProto) -> TensorMeta:
        if vi.name not in self.env:
            raise ExtractionError(f"{self.loaded.source}: graph output {vi.name!r} is computed by no node")
        value = self.env[vi.name]
        if isinstance(value, TensorMeta) and value.name == vi.name and value.role != "input":
            value.role = "output"
            return value
        # a constant or an alias of another tensor: a copy gives the output its own name
        ctx = Ctx(self, vi.name, self.opset)
        out = ctx.aten("clone", ctx.tensor(value))
        out.name, out.role = vi.name, "output"
        self.ir.nodes.extend(ctx.emitted)
        return out

    # -- names, constants, symbols --------------------------------------------------------------------
    def node_name(self, base: str) -> str:
        return _unique(base, self.used_nodes, self._suffixes)

    def fresh(self, meta: TensorMeta, base: str) -> TensorMeta:
        """A copy of ``meta`` under a new unique name derived from the node's (``Conv_0__0``)."""
        return TensorMeta(_unique(f"{base}__0", self.used_tensors, self._suffixes), list(meta.shape), meta.dtype,
                          role="activation")

    def add_constant(self, value: np.ndarray, base: str) -> TensorMeta:
        """An IR tensor for a value known at import time: the weight of an initializer, else a constant."""
        source = self._initializer_of.get(id(value))
        if source is not None and source in self._materialized:
            return self._materialized[source]
        dtype = np_dtype_name(value)
        onnx_dtype = dtype
        if dtype in WIDE and held_dtype(dtype, list(value.shape)) != dtype:  # 4-bit codes that cannot be packed
            dtype = WIDE[dtype]
            value = value.astype(dtype)
        if source is not None and not _inline_scalar(value, dtype):
            meta = TensorMeta(source, list(value.shape), dtype, role="weight")
            self.ir.weights.append(meta)
            self.weights[source] = to_torch(value, dtype)
            self._materialized[source] = meta
            return meta
        name = source if source is not None else _unique(base, self.used_tensors, self._suffixes)
        meta = TensorMeta(name, list(value.shape), dtype, role="constant")
        self.ir.constants.append(meta)
        if source is not None:
            self._materialized[source] = meta
        if onnx_dtype != dtype:
            self.held_as[meta.name] = onnx_dtype
        if value.size <= _INLINE_LIMIT and _inlinable(value, dtype):
            self.ir.constant_values[meta.name] = value.tolist()
        else:
            self.weights[meta.name] = to_torch(value, dtype)
        return meta

    def meta_of(self, vi: onnx.ValueInfoProto, role: str) -> TensorMeta:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            raise UnsupportedNode(f"tensor {vi.name!r} is not a tensor of known rank (a sequence, map or optional)")
        shape = [self._dim(d) for d in tt.shape.dim]
        dtype = ir_dtype(tt.elem_type, f"tensor {vi.name!r}")
        if held_dtype(dtype, shape) != dtype:
            self.held_as[vi.name] = dtype
        return TensorMeta(vi.name, shape, held_dtype(dtype, shape), role=role)

    def add_weight(self, name: str, value: torch.Tensor, dtype: str, shape: list[int]) -> TensorMeta:
        """A weight of IR ``dtype`` and ``shape`` held as ``value`` (4-bit codes: packed uint8), under a fresh name
        derived from ``name`` (the ONNX initializer it was made from)."""
        meta = TensorMeta(_unique(name, self.used_tensors, self._suffixes), list(shape), dtype, role="weight")
        self.ir.weights.append(meta)
        self.weights[meta.name] = value
        return meta

    def _dim(self, dim: onnx.TensorShapeProto.Dimension) -> int | str:
        if dim.HasField("dim_value"):
            return dim.dim_value
        symbol = self.loaded.symbols.get(dim.dim_param) if dim.HasField("dim_param") else None
        symbol = symbol or _unique("unk", self._symbols_used, self._suffixes)
        if symbol not in self.hints:
            hint = _HINT_BASE + 2 * len(self.hints)
            self.hints[symbol], self._unhints[hint] = hint, symbol
        return symbol

    def hint(self, dim: int | str) -> int:
        if isinstance(dim, int):
            return dim
        if dim in self.hints:
            return self.hints[dim]
        try:  # an expression of symbols ("(batch)*(seq)"): remember its size, so results map back to it
            size = eval_sym(dim, self.hints)
        except (ValueError, SyntaxError):
            raise UnsupportedNode(f"dimension {dim!r} uses unknown symbols; bind the input shapes") from None
        self._unhints.setdefault(size, dim)
        return size

    def unhint(self, size: int) -> int | str:
        return self._unhints.get(size, size)

    def _unsupported(self, node: onnx.NodeProto, name: str, reason: str) -> None:
        domain = node.domain or "ai.onnx"
        opset = self.domain_opset(node.domain)
        self.unsupported.append(f"node {name!r}: {domain}::{node.op_type} (opset {opset}): {reason}")
        self._poisoned.update(node.output)

    def _unsupported_report(self) -> str:
        ops = sorted({line.split(": ")[1].split(" (")[0] for line in self.unsupported})
        lines = [f"{self.loaded.source}: {len(self.unsupported)} node(s) cannot be imported ({', '.join(ops)}):"]
        lines += [f"  {line}" for line in self.unsupported[:50]]
        if len(self.unsupported) > 50:
            lines.append(f"  ... and {len(self.unsupported) - 50} more")
        lines.append("Fix: add a converter (torch_ir.frontends.onnx.converters, @converter(op_type, since=opset)) "
                     "or re-export the model without these ops. Nodes that only depend on them are not listed.")
        return "\n".join(lines)




def _rename_in_specs(emitted: list, names: dict[int, str]) -> None:
    """A quantization spec made by a converter names the tensors it read its scale and zero point from; binding
    may have renamed those (a node's outputs take the ONNX names): follow the renames."""
    renames = {old: t.name for n in emitted for t in n.outputs if (old := names.get(id(t))) and old != t.name}
    for t in (t for n in emitted for t in n.outputs if t.quant is not None and renames):
        q = t.quant
        t.quant = replace(q, scale=renames.get(q.scale, q.scale) if isinstance(q.scale, str) else q.scale,
                          zero_point=renames.get(q.zero_point, q.zero_point) if isinstance(q.zero_point, str)
                          else q.zero_point)


def _unique(base: str, used: set[str], suffixes: dict[tuple[int, str], int] | None = None) -> str:
    """``base``, else ``base_1``, ``base_2``, ...: the first not in ``used`` (which it joins). ``suffixes``
    remembers the last suffix per base, so that many alike names do not rescan from 1."""
    key = (id(used), base)
    k = suffixes.get(key, 0) if suffixes is not None else 0
    name = base if k == 0 else f"{base}_{k}"
    while name in used:
        k += 1
        name = f"{base}_{k}"
    if suffixes is not None:
        suffixes[key] = k
    used.add(name)
    return name


def _merge_shape(got: list, declared: list, out: str) -> list:
    """ATen's shape with ONNX's symbols; a disagreement on a static size is a converter bug."""
    if len(declared) != len(got):
        raise UnsupportedNode(f"output {out!r}: the converter gives rank {len(got)}, ONNX infers {declared}")
    merged = []
    for g, d in zip(got, declared):
        if isinstance(d, int) and isinstance(g, int) and d != g:
            raise UnsupportedNode(f"output {out!r}: the converter gives shape {got}, ONNX infers {declared}")
        # a str from ONNX is a symbol; ATen's size there is the symbol's meta-device hint or derived from it
        merged.append(g if not isinstance(d, str) or (isinstance(g, int) and g < _HINT_BASE) else d)
    return merged


def _inline_scalar(value: np.ndarray, dtype: str) -> bool:
    """A one-element initializer (an epsilon, a scale, an exponent) is a constant, not a weight.

    Its value then stays in the IR, where the passes can read it (``pow(x, c)``, ``x * c``), just as
    torch.export's lifted scalars do.
    """
    return value.size == 1 and _inlinable(value, dtype)


def _inlinable(value: np.ndarray, dtype: str) -> bool:
    finite = value.dtype.kind not in "fc" or bool(np.isfinite(value).all())
    return finite and dtype in INLINE_DTYPES
