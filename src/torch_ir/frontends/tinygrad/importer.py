"""tinygrad frontend: call the model, walk the UOp graph of its outputs, build the IR.

The model's computation is never realized: the importer only reads the lazy graph. Example inputs
become graph inputs, tensors of ``get_state_dict(model)`` become weights named by their path,
``CONST``s become constants, and every other UOp is converted by the table in ``mapping.py``. The
literal translation is then cleaned by the rule sets of ``rules.py`` (contractions, shape chains).

State-dict tensors are data, not graph work: one still lazy (``nn.Linear``'s random
initialization) is realized once, in place, before the model is called, so the returned weights
are the values the model itself computes with from then on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tinygrad.dtype import _to_torch_dtype, strong_dtype
from tinygrad.nn.state import get_state_dict
from tinygrad.tensor import Tensor
from tinygrad.uop.ops import Ops, UOp

from ... import __version__
from ...errors import ExtractionError
from ...ir import NPU_IR, OpNode, Provenance, TensorMeta, check_integrity
from ...ops.values import dtype_name
from .mapping import REFUSED, TABLE
from .walk import data_sources, postorder

_TERMINALS = (Ops.BUFFER, Ops.PARAM, Ops.CONST)


def import_tinygrad(model: Any, example_inputs: Sequence[Any], *, input_names: Sequence[str] | None = None,
                    model_name: str | None = None, simplify: bool = True,
                    kwargs: Mapping[str, Any] | None = None) -> tuple[NPU_IR, dict[str, np.ndarray]]:
    """Import a tinygrad model: ``(ir, weights)``, weights as numpy arrays by state-dict key.

    Example::

        from tinygrad import Tensor, nn
        class MLP:
            def __init__(self): self.l1, self.l2 = nn.Linear(4, 8), nn.Linear(8, 2)
            def __call__(self, x): return self.l2(self.l1(x).relu())
        ir, weights = import_tinygrad(MLP(), [Tensor.empty(3, 4)])
        IRExecutor(ir, {k: torch.from_numpy(v) for k, v in weights.items()})

    ``model`` is any callable (an object with ``__call__`` or a function); it is called once on the
    example inputs and the outputs' graphs are walked, never realized. Every tensor of
    ``get_state_dict(model)`` is a weight: a lazy one (a layer's random initialization) is realized
    first, in place on the model, with tinygrad's own RNG, and returned with its data like the
    already realized ones; ``Tensor.empty`` weights are declared in the IR but have no data (a
    weight-free import). Randomness inside the model's forward is refused.
    ``simplify=False`` keeps the literal UOp-by-UOp translation. ``kwargs`` are keyword arguments of
    the call that are Python values, not tensors (tinygrad llama's ``start_pos``): the graph is the one
    they give, and they are not inputs of the IR.
    """
    ir, weights, _ = import_tinygrad_traced(model, example_inputs, input_names=input_names, model_name=model_name,
                                            kwargs=kwargs)
    if simplify:
        from .rules import simplify_ir

        ir = simplify_ir(ir)
        check_integrity(ir, source=f"tinygrad import of {ir.model_name!r}")
    return ir, weights


def import_tinygrad_traced(model: Any, example_inputs: Sequence[Any], *, input_names: Sequence[str] | None = None,
                           model_name: str | None = None, kwargs: Mapping[str, Any] | None = None,
                           ) -> tuple[NPU_IR, dict[str, np.ndarray], dict[str, UOp]]:
    """The literal translation (``import_tinygrad(..., simplify=False)``) and, for each IR tensor a node
    defines, the UOp it stands for: ``Tensor(uop)`` gives tinygrad's own value of that tensor, so a debugger
    can compare the IR with tinygrad node by node (``npu_tools.debug``). Each node's provenance names the
    mapping (``tinygrad:<UOp kind>``) that made it."""
    name = model_name or getattr(model, "__name__", None) or type(model).__name__
    inputs = [_as_input(x) for x in example_inputs]
    names = list(input_names) if input_names is not None else [f"input_{i}" for i in range(len(inputs))]
    if len(names) != len(inputs):
        raise ExtractionError(f"model {name!r}: {len(inputs)} example inputs but {len(names)} input_names")
    if len({x.uop for x in inputs}) != len(inputs):
        raise ExtractionError(f"model {name!r}: the same tensor is passed as two example inputs; "
                              "the graph could not tell them apart: pass distinct tensors")
    call_kwargs = dict(kwargs or {})
    tensors = sorted(k for k, v in call_kwargs.items() if isinstance(v, Tensor))
    if tensors:
        raise ExtractionError(f"model {name!r}: kwargs {tensors} are tensors; kwargs hold Python values that "
                              "shape the graph: pass tensors as example_inputs")
    realize_state(model, name)  # before the call, so the forward's graph reads the weights' buffers
    out = model(*inputs, **call_kwargs)
    outputs = list(out) if isinstance(out, (tuple, list)) else [out]
    bad = [type(o).__name__ for o in outputs if not isinstance(o, Tensor)]
    if bad:
        raise ExtractionError(f"model {name!r} returned {bad}; return a tinygrad Tensor or a tuple of them")
    builder = Builder(name, dict(zip((x.uop for x in inputs), names)), _named_weights(model))
    ir = builder.build([o.uop for o in outputs])
    check_integrity(ir, source=f"tinygrad import of {name!r}")
    produced = {t.name for n in ir.nodes for t in n.outputs}
    uops = {meta.name: u for u, meta in builder.env.items() if meta.name in produced}
    return ir, builder.weight_values, uops


def _as_input(x: Any) -> Tensor:
    """An example input as a buffer, so the walk can tell it from the model's own computation.

    numpy data becomes a realized Tensor; a lazy Tensor (``Tensor.ones(2, 3)``) is realized, which
    computes only that input. ``Tensor.empty`` inputs stay unrealized.
    """
    x = x if isinstance(x, Tensor) else Tensor(np.asarray(x))
    return x if x.uop.has_buffer_identity() else x.contiguous().realize()


def realize_state(model: Any, name: str = "model") -> list[str]:
    """Realize, in place, every state-dict tensor that is still a lazy graph; return their keys.

    A layer written the ordinary way (``nn.Linear(4, 8)``) holds its initialization as an
    unrealized graph (THREEFRY and the RNG counter's STORE): weights, not computation of the model,
    so they are computed here once, with tinygrad's own RNG. The realization replaces each Tensor's
    graph by its buffer, so the model's later forwards use exactly these values. ``Tensor.empty``
    tensors already are buffers: they stay weight-free declarations.
    """
    lazy: dict[int, tuple[str, Tensor]] = {}
    for key, t in get_state_dict(model).items():
        if not t.uop.has_buffer_identity():
            lazy.setdefault(id(t), (key, t))  # a tensor reachable by two paths is realized once
    if not lazy:
        return []
    keys = [key for key, _ in lazy.values()]
    try:
        Tensor.realize(*(t for _, t in lazy.values()))  # one schedule for all: one compile, not one per tensor
    except Exception as e:  # tinygrad raises plain RuntimeError/AssertionError from its scheduler and devices
        raise ExtractionError(f"tinygrad model {name!r}: realizing its lazy weights {keys} failed: "
                              f"{type(e).__name__}: {e}; realize or load them before importing") from e
    return keys


def _named_weights(model: Any) -> dict[UOp, str]:
    """UOp -> state-dict path, for tensors that are a buffer (possibly reshaped): the weights."""
    named: dict[UOp, str] = {}
    for key, t in get_state_dict(model).items():
        if t.uop.has_buffer_identity():
            named.setdefault(t.uop, key)  # tied tensors: the first path names them
    return named


def torch_dtype_name(dtype: Any) -> str:
    """A tinygrad dtype's torch name (weak types resolve to tinygrad's defaults)."""
    torch_dtype = _to_torch_dtype(strong_dtype(dtype))
    if torch_dtype is None:
        raise ExtractionError(f"tinygrad dtype {dtype} has no torch equivalent; cast the model to a standard dtype")
    return dtype_name(torch_dtype)


class Builder:
    """Converts UOps in post-order; ``env`` maps each converted UOp to the IR tensor it defines."""

    def __init__(self, model_name: str, inputs: dict[UOp, str], weights: dict[UOp, str]):
        self.inputs, self.weights = inputs, weights
        self.env: dict[UOp, TensorMeta] = {}
        self.taken: set[str] = set(inputs.values())  # every name in the graph, so fresh() never collides
        self.consts: dict[tuple[Any, str], TensorMeta] = {}
        self.weight_values: dict[str, np.ndarray] = {}
        self.position: dict[UOp, int] = {}
        self.converting: UOp | None = None  # the UOp whose mapping is emitting nodes (their provenance)
        self.ir = NPU_IR(model_name=model_name, graph_inputs=[], graph_outputs=[], weights=[], nodes=[])

    # -- the walk ------------------------------------------------------------------------------------
    def build(self, roots: list[UOp]) -> NPU_IR:
        order = postorder(roots, lambda u: u in self.inputs or u in self.weights or self._anonymous_view(u))
        self.position = {u: i for i, u in enumerate(order)}
        self._refuse_unmapped(order)
        for u in order:
            if u.op is Ops.CONST:
                continue  # materialized where it is used, in the dtype its user needs
            self.converting = u
            self.env[u] = self._convert(u)
        # in call order; an input the outputs do not depend on is still an input of the graph
        self.ir.graph_inputs = [self.env[u] if u in self.env else self._input(u, n) for u, n in self.inputs.items()]
        self.ir.graph_outputs = [self._output(u) for u in roots]
        self.ir.producer = {"name": "torch_ir", "version": __version__, "frontend": "tinygrad",
                            "tinygrad": _tinygrad_version()}
        return self.ir

    def _refuse_unmapped(self, order: list[UOp]) -> None:
        """Name every kind of UOp that cannot be imported, at once: its first position and the fix."""
        bad: dict[Ops, list[UOp]] = {}
        for u in order:
            if u not in self.inputs and u not in self.weights and u.op not in TABLE and u.op not in _TERMINALS:
                bad.setdefault(u.op, []).append(u)
        if not bad:
            return
        refused = list(REFUSED)  # the likeliest causes first: THREEFRY explains the STOREs it comes with
        rank = lambda op: refused.index(op) if op in refused else len(refused)  # noqa: E731
        kinds = sorted(bad, key=lambda op: (rank(op), self.position[bad[op][0]]))
        lines = [f"tinygrad model {self.ir.model_name!r}: {sum(map(len, bad.values()))} UOp(s) of "
                 f"{len(bad)} kind(s) cannot be imported:"]
        for op in kinds:
            first = bad[op][0]
            fix = REFUSED.get(op, f"{op.name} has no IR mapping; add one to TABLE in "
                                  "torch_ir/frontends/tinygrad/mapping.py (an ATen op, or an op of its own "
                                  "namespace registered with torch_ir.register_op)")
            lines.append(f"  {op.name} x{len(bad[op])}, first at {self.describe(first)}: {fix}")
        raise ExtractionError("\n".join(lines))

    def describe(self, u: UOp) -> str:
        srcs = ", ".join(s.op.name for s in data_sources(u))
        shape = getattr(u, "shape", None)
        return f"UOp #{self.position.get(u, '?')} {u.op.name}({srcs}) dtype={u.dtype} shape={shape}"

    def unsupported(self, u: UOp, why: str) -> ExtractionError:
        return ExtractionError(f"tinygrad model {self.ir.model_name!r}: {self.describe(u)}: {why}")

    def _convert(self, u: UOp) -> TensorMeta:
        if u in self.inputs:
            return self._input(u, self.inputs[u])
        if u in self.weights:
            return self._weight(u, self.weights[u])
        if u.op in (Ops.BUFFER, Ops.PARAM) or self._anonymous_view(u):
            return self._buffer(u)
        return TABLE[u.op].convert(self, u)

    # -- leaves ----------------------------------------------------------------------------------------
    def _input(self, u: UOp, name: str) -> TensorMeta:
        meta = TensorMeta(name, self.shape_of(u), self.dtype_of(u), role="input")
        self.env[u] = meta
        return meta

    def _weight(self, u: UOp, key: str) -> TensorMeta:
        meta = TensorMeta(self.fresh("w_" + key.replace(".", "_")), self.shape_of(u), self.dtype_of(u), role="weight")
        self.ir.weights.append(meta)
        self.ir.weight_name_mapping[meta.name] = key
        if u.is_realized:
            self.weight_values[key] = Tensor(u).numpy()  # a copy of an existing buffer; computes nothing
        return meta

    def _anonymous_view(self, u: UOp) -> bool:
        """``RESHAPE(BUFFER)`` of a buffer no input or weight is: a tensor's own view of its flat storage,
        imported as one weight of that shape. (A reshape of a 1-d input's BUFFER stays a reshape.)"""
        base = u.src[0] if u.op is Ops.RESHAPE else None
        return base is not None and base.op is Ops.BUFFER and base not in self.inputs and base not in self.weights

    def _buffer(self, u: UOp) -> TensorMeta:
        """A buffer that is neither an input nor in the state dict (a Tensor the model keeps elsewhere).

        It is a weight all the same, named ``buffer``, ``buffer_1``, ...: with its data when realized.
        """
        return self._weight(u, self.fresh("buffer"))

    def operand(self, u: UOp, i: int) -> TensorMeta:
        """The IR tensor for ``u.src[i]``; a CONST becomes a 0-d constant of the dtype ``u`` needs there."""
        src = u.src[i]
        if src.op is not Ops.CONST or src in self.env:
            return self.env[src]
        return self.constant(src.arg, self._operand_dtype(u, i))

    def _operand_dtype(self, u: UOp, i: int) -> str:
        if u.op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):  # compare in the dtype of the other side
            other = u.src[1 - i]
            return self.dtype_of(other) if other.op is not Ops.CONST else self.dtype_of(u.src[i])
        if u.op is Ops.WHERE and i == 0:
            return "bool"
        if u.op in (Ops.CAST, Ops.BITCAST):
            return self.dtype_of(u.src[i])
        return self.dtype_of(u)  # arithmetic and movement ops: operands have the result's dtype

    def constant(self, value: Any, dtype: str) -> TensorMeta:
        is_float = dtype.startswith(("float", "bfloat"))
        value = float(value) if is_float else bool(value) if dtype == "bool" else int(value)
        key = (value, dtype)
        if key in self.consts:
            return self.consts[key]
        if isinstance(value, float) and not math.isfinite(value):  # JSON has no inf/nan: made by a node
            meta = self.emit("aten.scalar_tensor.default", [], {"s": {"float": repr(value)},
                             "dtype": {"dtype": dtype}, "device": {"device": "cpu"}}, None, shape=[], dtype=dtype)
        else:
            meta = TensorMeta(self.fresh("c"), [], dtype, role="constant")
            self.ir.constants.append(meta)
            self.ir.constant_values[meta.name] = value
        self.consts[key] = meta
        return meta

    # -- nodes -----------------------------------------------------------------------------------------
    def emit(self, op_type: str, inputs: list[TensorMeta], attrs: dict[str, Any], u: UOp | None, *,
             shape: list[int] | None = None, dtype: str | None = None) -> TensorMeta:
        """Append one node; its output has ``u``'s shape and dtype unless given (or the input's dtype)."""
        base = op_type.split(".")[1].lstrip("_")
        if dtype is None:
            dtype = self.dtype_of(u) if u is not None else inputs[0].dtype
        out = TensorMeta(self.fresh(base), shape if shape is not None else self.shape_of(u), dtype,
                         role="activation")
        mapped = self.converting
        origin = f"tinygrad:{mapped.op.name}" if mapped is not None else None
        self.ir.nodes.append(OpNode(out.name, op_type, list(inputs), [out], attrs,
                                    provenance=Provenance(nodes=[out.name], origin=origin)))
        return out

    def fresh(self, base: str) -> str:
        """``base``, or ``base_1``, ``base_2``, ... : the first name not yet used in the graph."""
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def shape_of(self, u: UOp) -> list[int]:
        shape = list(u.shape)
        if not all(isinstance(d, int) for d in shape):
            raise self.unsupported(u, f"symbolic shape {shape}; import with concrete example shapes")
        return shape

    def dtype_of(self, u: UOp) -> str:
        return torch_dtype_name(u.dtype)

    def _output(self, u: UOp) -> TensorMeta:
        meta = self.env[u] if u.op is not Ops.CONST else self.constant(u.arg, self.dtype_of(u))
        if meta.role != "activation":  # an input, weight or constant returned as is: copy it to a node
            meta = self.emit("aten.clone.default", [meta], {}, None, shape=list(meta.shape), dtype=meta.dtype)
        meta.role = "output"
        return meta


def _tinygrad_version() -> str:
    from importlib.metadata import version

    return version("tinygrad")
