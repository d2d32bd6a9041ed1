"""One table: tinygrad UOp kind -> IR op. It drives the importer and generates docs/tinygrad.md.

Each UOp becomes the ATen op that computes the same thing, so the reference executor runs it on
the generic ``torch.ops`` path. The translation is literal (a tinygrad matmul arrives as
RESHAPE/PERMUTE/MUL/REDUCE); the rule sets in ``rules.py`` then recognize contractions and
simplify shape chains, so the IR reads like the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tinygrad.uop.ops import Ops, UOp

from ...ir import TensorMeta

if TYPE_CHECKING:
    from .importer import Builder

Convert = Callable[["Builder", UOp], TensorMeta]


@dataclass(frozen=True)
class UOpMapping:
    """How one UOp kind is imported: the IR op it becomes, the converter, a note for the docs."""

    op: Ops
    ir_op: str
    convert: Convert
    note: str = ""


TABLE: dict[Ops, UOpMapping] = {}

# -- elementwise ----------------------------------------------------------------------------------

#: UOp -> (ATen op, fixed attributes). Operands broadcast as in numpy, as ATen's do.
ELEMENTWISE: dict[Ops, tuple[str, dict[str, Any]]] = {
    Ops.ADD: ("aten.add.Tensor", {}),
    Ops.SUB: ("aten.sub.Tensor", {}),
    Ops.MUL: ("aten.mul.Tensor", {}),
    Ops.FDIV: ("aten.div.Tensor", {}),
    Ops.CDIV: ("aten.div.Tensor_mode", {"rounding_mode": "trunc"}),
    Ops.FLOORDIV: ("aten.div.Tensor_mode", {"rounding_mode": "floor"}),
    Ops.CMOD: ("aten.fmod.Tensor", {}),
    Ops.FLOORMOD: ("aten.remainder.Tensor", {}),
    Ops.MAX: ("aten.maximum.default", {}),
    Ops.POW: ("aten.pow.Tensor_Tensor", {}),
    Ops.CMPLT: ("aten.lt.Tensor", {}),
    Ops.CMPNE: ("aten.ne.Tensor", {}),
    Ops.CMPEQ: ("aten.eq.Tensor", {}),
    Ops.AND: ("aten.bitwise_and.Tensor", {}),
    Ops.OR: ("aten.bitwise_or.Tensor", {}),
    Ops.XOR: ("aten.bitwise_xor.Tensor", {}),
    Ops.SHL: ("aten.bitwise_left_shift.Tensor", {}),
    Ops.SHR: ("aten.bitwise_right_shift.Tensor", {}),
    Ops.WHERE: ("aten.where.self", {}),
    Ops.RECIPROCAL: ("aten.reciprocal.default", {}),
    Ops.SQRT: ("aten.sqrt.default", {}),
    Ops.EXP2: ("aten.exp2.default", {}),
    Ops.LOG2: ("aten.log2.default", {}),
    Ops.SIN: ("aten.sin.default", {}),
    Ops.NEG: ("aten.neg.default", {}),
    Ops.TRUNC: ("aten.trunc.default", {}),
}


def _elementwise(b: Builder, u: UOp) -> TensorMeta:
    op_type, attrs = ELEMENTWISE[u.op]
    inputs = [b.operand(u, i) for i in range(len(u.src))]
    return b.emit(op_type, inputs, dict(attrs), u)


def _cast(b: Builder, u: UOp) -> TensorMeta:
    return b.emit("aten._to_copy.default", [b.operand(u, 0)], {"dtype": {"dtype": b.dtype_of(u)}}, u)


def _bitcast(b: Builder, u: UOp) -> TensorMeta:
    return b.emit("aten.view.dtype", [b.operand(u, 0)], {"dtype": {"dtype": b.dtype_of(u)}}, u)


def _identity(b: Builder, u: UOp) -> TensorMeta:
    return b.operand(u, 0)


# -- movement: the arguments come from ``u.marg`` (decoded from the STACK sources) -----------------

def _reshape(b: Builder, u: UOp) -> TensorMeta:
    return b.emit("aten.reshape.default", [b.operand(u, 0)], {"shape": list(u.marg)}, u)


def _permute(b: Builder, u: UOp) -> TensorMeta:
    return b.emit("aten.permute.default", [b.operand(u, 0)], {"dims": list(u.marg)}, u)


def _expand(b: Builder, u: UOp) -> TensorMeta:
    # In tinygrad >= 0.12 EXPAND only prepends dimensions: shape = marg + src.shape. ATen's expand
    # does the same when given the full new size.
    return b.emit("aten.expand.default", [b.operand(u, 0)], {"size": list(b.shape_of(u))}, u)


def _pad(b: Builder, u: UOp) -> TensorMeta:
    # marg is ((offset, new_size), ...) per axis; ATen wants (before, after) pairs, last axis first.
    old = b.shape_of(u.src[0])
    pairs = [(off, new - off - s) for (off, new), s in zip(u.marg, old)]
    pad = [p for before, after in reversed(pairs) for p in (before, after)]
    return b.emit("aten.constant_pad_nd.default", [b.operand(u, 0)], {"pad": pad}, u)


def _shrink(b: Builder, u: UOp) -> TensorMeta:
    # marg is ((offset, size), ...) per axis: one aten.slice per axis that changes.
    x = b.operand(u, 0)
    old = b.shape_of(u.src[0])
    cut = [(axis, off, size) for axis, ((off, size), s) in enumerate(zip(u.marg, old)) if (off, size) != (0, s)]
    for n, (axis, off, size) in enumerate(cut):
        shape = [size if a == axis else d for a, d in enumerate(x.shape)]
        attrs = {"dim": axis, "start": off, "end": off + size}
        x = b.emit("aten.slice.Tensor", [x], attrs, u if n == len(cut) - 1 else None, shape=shape)
    return x


def _flip(b: Builder, u: UOp) -> TensorMeta:
    dims = [i for i, f in enumerate(u.marg) if f]
    return b.emit("aten.flip.default", [b.operand(u, 0)], {"dims": dims}, u)


def _stack(b: Builder, u: UOp) -> TensorMeta:
    # STACK with data sources stacks them along a new leading axis (Tensor.cat and Tensor.stack use it)
    inputs = [b.operand(u, i) for i in range(len(u.src))]
    return b.emit("aten.stack.default", inputs, {"tensors": list(range(len(inputs)))}, u)


# -- reduce: REDUCE(op, n) reduces the first n axes (a PERMUTE before it brings them to the front) --

def _reduce(b: Builder, u: UOp) -> TensorMeta:
    op, n = u.arg
    x = b.operand(u, 0)
    axes = list(range(n))
    if op is Ops.ADD:
        attrs: dict[str, Any] = {"dim": axes}
        if b.dtype_of(u) not in ("float32", "float16", "bfloat16", "float64"):
            attrs["dtype"] = {"dtype": b.dtype_of(u)}  # ATen sums integers into int64; tinygrad keeps the dtype
        return b.emit("aten.sum.dim_IntList", [x], attrs, u)
    if op is Ops.MAX:
        return b.emit("aten.amax.default", [x], {"dim": axes}, u)
    if op is Ops.MUL:
        for i in range(n):  # aten.prod reduces one axis at a time; axis 0 is always next
            x = b.emit("aten.prod.dim_int", [x], {"dim": 0}, u if i == n - 1 else None, shape=x.shape[1:])
        return x
    raise b.unsupported(u, f"REDUCE with {op} has no ATen equivalent")


def _register(ops: Ops | tuple[Ops, ...], ir_op: str, convert: Convert, note: str = "") -> None:
    for op in ops if isinstance(ops, tuple) else (ops,):
        TABLE[op] = UOpMapping(op, ir_op, convert, note)


_UNARY = (Ops.RECIPROCAL, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.NEG, Ops.TRUNC)
for _op, (_ir_op, _attrs) in ELEMENTWISE.items():
    _register(_op, _ir_op + (f" ({', '.join(f'{k}={v!r}' for k, v in _attrs.items())})" if _attrs else ""),
              _elementwise, "" if _op in _UNARY else "operands broadcast as in numpy; a CONST operand is a 0-d "
              "constant in the dtype the op computes in")
_register(Ops.CAST, "aten._to_copy.default (dtype)", _cast)
_register(Ops.BITCAST, "aten.view.dtype", _bitcast)
_register((Ops.DETACH, Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD), "(identity)", _identity,
          "scheduling hints; no node")
_register(Ops.COPY, "(identity)", _identity, "a copy between devices (numpy data made in forward): same values")
_register(Ops.RESHAPE, "aten.reshape.default", _reshape, "shape from the STACK source")
_register(Ops.PERMUTE, "aten.permute.default", _permute)
_register(Ops.EXPAND, "aten.expand.default", _expand, "EXPAND prepends axes; the full size is recorded")
_register(Ops.PAD, "aten.constant_pad_nd.default", _pad, "(offset, new size) per axis -> (before, after)")
_register(Ops.SHRINK, "aten.slice.Tensor", _shrink, "one slice per axis that changes")
_register(Ops.FLIP, "aten.flip.default", _flip)
_register(Ops.STACK, "aten.stack.default (dim=0)", _stack, "a STACK of data (not of shape CONSTs): a new leading axis")
_register(Ops.REDUCE, "aten.sum.dim_IntList / aten.amax.default / aten.prod.dim_int", _reduce,
          "ADD / MAX / MUL over the leading arg[1] axes")

#: UOps handled by the importer itself rather than a converter (leaves of the walk).
LEAF_NOTES: dict[Ops, tuple[str, str]] = {
    Ops.BUFFER: ("graph input / weight",
                 "an example input -> graph input; a state-dict tensor -> weight named by its path; "
                 "any other buffer -> weight `buffer`, `buffer_1`, ... (with its data when realized)"),
    Ops.CONST: ("constant (0-d)", "one IR constant per (value, dtype); non-finite -> aten.scalar_tensor"),
}

#: UOps that are refused with advice, not mapped.
REFUSED: dict[Ops, str] = {
    Ops.THREEFRY: "random numbers generated in the model's forward (Tensor.rand, dropout with "
                  "Tensor.training set, a lazy random tensor held outside the model's attributes): the IR has no "
                  "random ops from tinygrad; keep randomness out of forward (state-dict tensors are weights, "
                  "realized once at import, so a random tensor the model keeps as an attribute is fine)",
    Ops.STORE: "an assignment inside the graph (Tensor.assign, tinygrad's random-number counter): realize the "
               "tensors it writes before importing; the IR has no in-place writes from tinygrad",
    Ops.AFTER: "the value of a buffer after an assignment (see STORE): realize the assigned tensors first",
}
