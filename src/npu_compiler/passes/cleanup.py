"""Clean-up rules: identities, no-op casts and views, dropout, and constant folding.

What a frontend leaves that computes nothing (``contiguous``, a cast to the dtype a tensor already
has, a reshape to its own shape, ``x + 0``) becomes an alias of its input; a node whose inputs are
all constants known by value (``arange``, index arithmetic on shapes) is evaluated once and becomes
a constant; an index or mask node that computes what an earlier one computes (each decoder layer's copy
of the cache positions) becomes an alias of the earlier one's output. Dead code goes with
``eliminate_dead_code`` after each stage.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_ir.ir import OpNode, TensorMeta
from torch_ir.ops.registry import bind_kernel, is_supported
from torch_ir.ops.values import INLINE_DTYPES, dtype_from_name, has_symbols
from torch_ir.rewrite import Fold, Match, Op, Rule, Var

from .build import VIEWS, same_input, static

x = Var("x")

_IDENTITY_OPS = (
    "aten.contiguous.default", "aten.clone.default", "aten.alias.default", "aten.detach.default",
    "aten.lift_fresh_copy.default", "aten.dropout.default", "aten.native_dropout.default",
    "aten.feature_dropout.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.to.other",
    "aten._to_copy.default", "aten.type_as.default", "aten.expand.default", "aten.expand_as.default",
    *VIEWS, "aten.permute.default", "aten.transpose.int", "aten.slice.Tensor",
)


def _same_value(m: Match) -> TensorMeta | None:
    """The input itself when the node returns it unchanged: same shape and dtype, nothing reordered."""
    node, src = m.node(), m["x"]
    result = node.outputs[0]
    if list(result.shape) != list(src.shape) or result.dtype != src.dtype:
        return None
    attrs = node.attrs
    if node.op_type in ("aten.dropout.default", "aten.native_dropout.default", "aten.feature_dropout.default"):
        return src if attrs.get("train") is False or attrs.get("p") == 0 else None
    if node.op_type == "aten.permute.default":
        dims = [d % len(src.shape) for d in attrs.get("dims", [])]
        return src if dims == sorted(dims) else None
    if node.op_type == "aten.transpose.int":
        rank = len(src.shape)
        return src if attrs["dim0"] % rank == attrs["dim1"] % rank else None
    if node.op_type == "aten.slice.Tensor":
        return src if attrs.get("step", 1) == 1 else None  # same shape and step 1: the whole range
    return src


def _arith_identity(m: Match) -> TensorMeta | None:
    """``x + 0``, ``x - 0``, ``x * 1``, ``x / 1`` with a scalar operand: x (when shape and dtype agree)."""
    node, src = m.node(), m["x"]
    neutral = 1 if node.op_type in ("aten.mul.Tensor", "aten.div.Tensor") else 0
    other = node.attrs.get("other")
    if isinstance(other, bool) or other != neutral or node.attrs.get("alpha", 1) != 1:
        return None
    result = node.outputs[0]
    return src if list(result.shape) == list(src.shape) and result.dtype == src.dtype else None


# -- constant folding --------------------------------------------------------------------------------

_FOLD_LIMIT = 16384  # elements: index and mask arithmetic on static shapes, never a weight-sized tensor
_NO_FOLD = ("rand", "empty", "bernoulli", "normal", "dropout", "uniform", "multinomial", "poisson")


def _fold_reason(m: Match) -> str | None:
    node = m.node()
    if any(m.constant(t) is None for t in node.inputs):
        return None  # the usual case, not a rejection: _fold declines
    if any(word in node.op_type for word in _NO_FOLD) or not is_supported(node.op_type):
        return "not a deterministic op with an implementation"
    if has_symbols(node.attrs) or any(not t.is_static for t in node.outputs):
        return "depends on a symbolic size"
    if any((t.numel() or 0) > _FOLD_LIMIT or t.dtype not in INLINE_DTYPES for t in node.outputs):
        return f"result larger than {_FOLD_LIMIT} elements, or of a dtype JSON cannot hold"
    return None


def _fold(m: Match) -> Fold | None:
    node = m.node()
    if any(m.constant(t) is None for t in node.inputs):
        return None
    inputs = [torch.tensor(m.constant(t), dtype=dtype_from_name(t.dtype)) for t in node.inputs]
    try:
        outs = bind_kernel(node, torch.device("cpu"))(inputs, {})
    except Exception:  # noqa: BLE001 - an op that cannot run on constants simply stays
        return None
    values: dict[str, Any] = {}
    for meta, value in zip(node.outputs, outs):
        if value.dtype.is_floating_point and not bool(torch.isfinite(value).all()):
            return None  # JSON holds no inf/nan: the node stays
        values[meta.name] = value.tolist()
    return Fold(values)


_FILL_VALUE = {"aten.zeros_like.default": 0, "aten.empty_like.default": 0, "aten.ones_like.default": 1,
               "aten.new_zeros.default": 0, "aten.new_empty.default": 0, "aten.new_ones.default": 1}


def _non_finite(value: Any) -> bool:
    """An attribute holding inf or nan, in the IR's encoding (``{"float": "-inf"}``): folding gives up on
    those (JSON constants hold no inf), a fill kernel takes them."""
    return isinstance(value, dict) and set(value) == {"float"}


def _like_to_full(m: Match):
    """zeros_like/ones_like/empty_like/full_like(x), fill(x, v) -> full(x's shape, v): x is not read (its values
    never matter), so the constant folds or becomes one fill kernel; empty_like is filled with zeros (its values
    are unspecified, zeros are as good as any and deterministic)."""
    root, result = m.node(), m.node().outputs[0]
    if not static(list(result.shape)):
        return None
    value = _FILL_VALUE.get(root.op_type, root.attrs.get("fill_value", root.attrs.get("value", root.attrs.get("s"))))
    if not isinstance(value, (int, float)) and not _non_finite(value):
        return None  # a fill value from a tensor: leave it
    return [OpNode(root.name, "aten.full.default", [], list(root.outputs),
                   {"size": list(result.shape), "fill_value": value, "dtype": {"dtype": result.dtype}})]


IDENTITY_RULES = [
    Rule("identity", "cleanup", Op(_IDENTITY_OPS, x, exact_arity=False), _same_value,
         doc="a copy, cast, view, expand, permute or slice that leaves its input as it is -> the input"),
    Rule("arith_identity", "cleanup",
         Op(("aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor"), x), _arith_identity,
         doc="x + 0, x - 0, x * 1, x / 1 -> x"),
]

FOLD_RULES = [
    Rule("like_to_full", "fold", Op((*_FILL_VALUE, "aten.full_like.default", "aten.fill.Scalar",
                                     "aten.new_full.default"), x, exact_arity=False), _like_to_full,
         doc="zeros_like, ones_like, empty_like, full_like, fill, new_zeros/ones/empty/full of a static shape "
             "-> full (x is not read)"),
    Rule("scalar_tensor_to_full", "fold", Op("aten.scalar_tensor.default"), _like_to_full,
         doc="scalar_tensor(s) -> full([], s): folded like any constant, or one fill kernel for inf and nan"),
    Rule("fold_constants", "fold", Op("*", exact_arity=False), _fold, check=_fold_reason,
         doc="a node whose inputs are all constants known by value (arange, shape arithmetic) -> a constant"),
]

# -- common subexpressions -------------------------------------------------------------------------------

def _pure(op_type: str) -> bool:
    """Deterministic and free of side effects: not random, not an in-place variant (``add_``, ``index_copy_``)."""
    name = op_type.split(".")[1] if op_type.count(".") >= 2 else op_type
    in_place = name.endswith("_") and not name.endswith("__")
    return not in_place and not any(word in op_type for word in _NO_FOLD)


def _same_node(m: Match, a: OpNode, b: OpNode) -> bool:
    return (a.op_type == b.op_type and len(a.inputs) == len(b.inputs)
            and all(same_input(m, x, y) for x, y in zip(a.inputs, b.inputs))
            and a.attrs == b.attrs and len(a.outputs) == len(b.outputs) == 1
            and list(a.outputs[0].shape) == list(b.outputs[0].shape) and a.outputs[0].dtype == b.outputs[0].dtype)


def _earlier_twin(m: Match) -> TensorMeta | None:
    """The output of an earlier node computing the same index or mask (same op, inputs and attributes), if any.

    Only integer and boolean results (positions, masks, shape arithmetic): float work computed twice is left
    as it is, since each copy may fuse into a different kernel (``x·sigmoid(x)`` twice becomes two silu) where
    one shared node, read twice, would fuse into neither. Candidates of a node with inputs are the earlier
    readers of its least read computed input (``users`` lists them in graph order); those of a node with no input
    (``arange`` of a symbolic length) the earlier input-free nodes of the IR the rewrite started from, whose
    order no rewrite changes."""
    node = m.node()
    if len(node.outputs) != 1 or not _pure(node.op_type) or node.outputs[0].dtype.startswith(("float", "bfloat")) \
            or node.outputs[0].dtype.startswith("complex"):
        return None
    if node.inputs:
        computed = [t for t in node.inputs if m.constant(t) is None]
        if not computed:
            return None  # constants only: folding's business
        pivot = min(computed, key=lambda t: len(m.users(t)))
        for other in m.users(pivot):
            if other is node:
                return None
            if _same_node(m, other, node):
                return other.outputs[0]
        return None
    if m.ctx is None:
        return None
    sources = m.ctx.cached(("cse", "input-free"), lambda: [n for n in m.ctx.ir.nodes if not n.inputs])
    for other in sources:
        if other is node:
            return None
        if m.producer(other.outputs[0]) is other and _same_node(m, other, node):
            return other.outputs[0]
    return None


CSE_RULES = [
    Rule("common_subexpression", "cleanup", Op("*", exact_arity=False), _earlier_twin,
         doc="a deterministic integer or boolean node computing what an earlier node computes (same op, inputs, "
             "attributes) -> the earlier node's output (each layer's copy of the cache positions: one per model)"),
]

RULES = IDENTITY_RULES + FOLD_RULES + CSE_RULES
