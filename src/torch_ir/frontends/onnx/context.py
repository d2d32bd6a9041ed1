"""What a converter works with: emit IR nodes, materialize constants, read values known at import.

Converters call ``ctx.aten("conv2d", x, w, b, stride=[2, 2])``: positional and keyword arguments
are bound by the ATen schema, tensors go to ``inputs`` and the rest to ``attrs`` by schema name,
as the PyTorch frontend records them. The output's shape and dtype come from running the op on
the meta device, so every converter gets exact ATen shapes without writing shape rules.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import numpy as np
import torch

from torch_ir import dtypes

from ...ir import OpNode, TensorMeta
from ...limits import fold_allowed, get_limits
from ...ops.registry import bind_kernel, resolve_overload
from ...ops.values import dtype_from_name, encode_value

Value = TensorMeta | np.ndarray | None
_META = torch.device("meta")
#: The device of a factory op (``aten.full``, ``aten.arange``): stored as ``{"device": "cpu"}``, which the
#: executor replaces with its own and the import's meta run with the meta device. Without one, that run
#: would allocate the tensor for real.
_CPU = torch.device("cpu")
#: Most values of a shape-like input (a reshape target, axes, pads, split sizes) a converter reads.
_MAX_INTS = 1 << 16


class Sym(str):
    """A symbolic size in an ATen size argument; stored as ``{"sym": name}``."""


class UnsupportedNode(Exception):  # noqa: N818 - a signal, collected into one UnsupportedOpError
    """A converter cannot translate this node (an attribute value or input it does not handle)."""


class FoldLimitExceeded(UnsupportedNode):  # noqa: N818 - a signal, like UnsupportedNode
    """A value the converter would compute at import time is over ``max_fold_bytes``: the node stays an ONNX
    op (run at execution time), or, where it cannot, the import fails with a ``LimitExceededError``."""


def np_dtype_name(array: np.ndarray) -> str:
    """The IR dtype name of a numpy array's dtype; numpy's own name ("object", ...) for one the IR lacks."""
    return dtypes.name_of(array.dtype)


class Ctx:
    """The conversion of one ONNX node; ``graph`` is the importer that owns the IR being built."""

    def __init__(self, graph: Any, node_name: str, opset: int, n_outputs: int = 1):
        self.graph, self.name, self.opset, self.n_outputs = graph, node_name, opset, n_outputs
        self.emitted: list[OpNode] = []
        self.names_before_bind: dict[int, str] = {}  # id(output) -> its name before the importer gave it ONNX's

    # -- values ---------------------------------------------------------------------------------
    @staticmethod
    def const(value: Value) -> np.ndarray | None:
        """The value of ``value`` when it is known at import time, else None."""
        return value if isinstance(value, np.ndarray) else None

    def ints(self, value: Value, what: str) -> list[int | str]:
        """A constant integer input as a list (symbolic sizes as expressions); unsupported at run time."""
        if not isinstance(value, np.ndarray):
            raise UnsupportedNode(f"{what} must be known at import time (a constant or a static shape)")
        if value.size > _MAX_INTS:  # a shape, axes, pads: a few values, never millions (from a hostile file)
            raise UnsupportedNode(f"{what} has {value.size} values, more than the {_MAX_INTS} a converter takes")
        return [v if isinstance(v, str) else int(v) for v in value.reshape(-1)]

    def tensor(self, value: Value) -> TensorMeta:
        """``value`` as an IR tensor, adding a constant to the IR when it is a numpy array."""
        if isinstance(value, TensorMeta):
            return value
        if value is None:
            raise UnsupportedNode("a required input is absent")
        if value.dtype == object:  # a shape value with symbols: built at run time from the bound symbols
            return self._shape_tensor(value)
        return self.graph.add_constant(np.asarray(value), f"{self.name}_const")

    def _shape_tensor(self, value: np.ndarray) -> TensorMeta:
        parts = [self.aten("scalar_tensor", Sym(v) if isinstance(v, str) else int(v), dtype=torch.int64)
                 for v in value.reshape(-1)]
        flat = self.aten("stack", parts) if parts else self.tensor(np.zeros(0, np.int64))
        return self.aten("reshape", flat, list(value.shape))

    # -- constants under the fold limit --------------------------------------------------------------
    @staticmethod
    def fits(shape: Any, itemsize: int) -> bool:
        """Whether a constant of ``shape`` may be made at import time (``torch_ir.limits.fold_allowed``).

        Checked before allocating: a shape from a file can ask for any amount of memory.
        """
        dims = list(shape)
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
            return False
        return fold_allowed(math.prod(int(d) for d in dims) * itemsize)

    def refuse_fold(self, shape: Any, itemsize: int, what: str) -> NoReturn:
        """Raise :class:`FoldLimitExceeded` for a constant of ``shape`` that :meth:`fits` refused."""
        dims = list(shape)
        size = (f"{math.prod(int(d) for d in dims) * itemsize} bytes"
                if all(isinstance(d, (int, np.integer)) for d in dims) else "a size unknown at import time")
        raise FoldLimitExceeded(f"{what} of shape {dims} would be a constant of {size}, over the "
                                f"max_fold_bytes limit of {get_limits().max_fold_bytes} bytes (torch_ir.limits)")

    def full(self, shape: list, fill: np.ndarray) -> Value:
        """A tensor of ``shape`` filled with ``fill`` (one element; its dtype is the result's): a constant when it
        fits the fold limit, else an ``aten.full`` node."""
        fill = np.asarray(fill).reshape(-1)[:1]
        if self.fits(shape, fill.dtype.itemsize):
            return np.full([int(d) for d in shape], fill[0], dtype=fill.dtype)
        sizes = [Sym(d) if isinstance(d, str) else int(d) for d in shape]
        return self.aten("full", sizes, fill[0].item(), dtype=dtype_from_name(np_dtype_name(fill)), device=_CPU)

    def arange(self, n: int | str, shape: list | None = None) -> Value:
        """``0, 1, ..., n-1`` (int64) reshaped to ``shape``: a constant under the fold limit, else ``aten.arange``."""
        if self.fits([n], 8):
            values = np.arange(int(n), dtype=np.int64)
            return values.reshape(shape) if shape is not None else values
        out = self.aten("arange", Sym(n) if isinstance(n, str) else int(n), dtype=torch.int64, device=_CPU)
        if shape is not None:
            out = self.aten("reshape", out, [Sym(d) if isinstance(d, str) else int(d) for d in shape])
        return out

    @staticmethod
    def dtype(value: Value) -> str:
        return value.dtype if isinstance(value, TensorMeta) else np_dtype_name(value)

    @staticmethod
    def shape(value: Value) -> list:
        return list(value.shape)

    def rank(self, value: Value) -> int:
        return len(value.shape)

    # -- emitting ---------------------------------------------------------------------------------
    def aten(self, name: str, *args: Any, **kwargs: Any) -> TensorMeta | list[TensorMeta]:
        """Emit ``aten.<name>`` (``"add.Tensor"``; ``.default`` when no overload is given)."""
        op_type = "aten." + (name if "." in name else f"{name}.default")
        overload = resolve_overload(op_type)
        if overload is None:
            raise KeyError(f"converter bug: {op_type} is not an ATen op")
        inputs: list[TensorMeta] = []
        attrs: dict[str, Any] = {}
        schema_args = overload._schema.arguments
        given = dict(zip((a.name for a in schema_args), args))
        given.update(kwargs)
        for arg in schema_args:
            if arg.name not in given:
                if _holds_tensor(arg.type):
                    attrs[arg.name] = None
                continue
            value = given[arg.name]
            if _holds_tensor(arg.type):
                if value is None:
                    attrs[arg.name] = None
                else:
                    inputs.append(self.tensor(value))
            elif isinstance(arg.type, torch.ListType) and _holds_tensor(arg.type.getElementType()):
                refs = []
                for v in value:
                    refs.append(None if v is None else len(inputs))
                    if v is not None:
                        inputs.append(self.tensor(v))
                attrs[arg.name] = refs
            else:
                attrs[arg.name] = _encode(_symbolic_sizes(arg.type, value))
        outs = self._emit(op_type, inputs, attrs)
        return outs[0] if len(outs) == 1 else outs

    def cast(self, value: Value, dtype: str) -> Value:
        """``value`` converted to ``dtype`` (a no-op when it already has it)."""
        if self.dtype(value) == dtype:
            return value
        if isinstance(value, np.ndarray) and dtype in _NUMPY_DTYPES:
            return value.astype(dtype)
        return self.aten("_to_copy", value, dtype=dtype_from_name(dtype))

    def custom(self, op_type: str, inputs: list[TensorMeta], attrs: dict[str, Any],
               outputs: list[TensorMeta]) -> list[TensorMeta]:
        """Emit an op of another namespace whose output types come from ONNX shape inference."""
        node = OpNode(self.graph.node_name(self.name), op_type, inputs,
                      [self.graph.fresh(o, self.name) for o in outputs], attrs)
        self.emitted.append(node)
        return node.outputs

    def _emit(self, op_type: str, inputs: list[TensorMeta], attrs: dict[str, Any]) -> list[TensorMeta]:
        node = OpNode(self.graph.node_name(self.name), op_type, inputs, [], attrs)
        kernel = bind_kernel(node, _META)
        symbols = self.graph.hints
        metas = [torch.empty([self.graph.hint(d) for d in t.shape], dtype=dtype_from_name(t.dtype), device=_META)
                 for t in inputs]
        try:
            results = kernel(metas, symbols)
        except Exception as e:  # noqa: BLE001 - the op rejected its arguments: a converter limitation
            raise UnsupportedNode(f"{op_type} rejects the arguments ({type(e).__name__}: {str(e)[:200]})") from e
        node.outputs = [
            self.graph.fresh(TensorMeta("", [self.graph.unhint(d) for d in r.shape], dtypes.name_of(r.dtype)),
                             self.name)
            for r in results
        ]
        self.emitted.append(node)
        return node.outputs


#: Dtypes numpy has of its own, so that a value known at import time is cast with numpy.
_NUMPY_DTYPES = frozenset(d.name for d in dtypes.DTYPES.values() if d.numpy_native)


def _symbolic_sizes(arg_type: Any, value: Any) -> Any:
    """In a size argument (``SymInt[]``, ``SymInt``) a str is a symbolic dimension, stored as ``{"sym": name}``."""
    if isinstance(arg_type, torch.ListType) and str(arg_type.getElementType()) in ("int", "SymInt"):
        return [Sym(v) if isinstance(v, str) else v for v in value] if isinstance(value, (list, tuple)) else value
    if str(arg_type) in ("int", "SymInt") and isinstance(value, str):
        return Sym(value)
    return value


def _encode(value: Any) -> Any:
    if isinstance(value, Sym):
        return {"sym": str(value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return encode_value(value)


def _holds_tensor(t: Any) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)
