"""Rule sets (for the one rewrite engine, ``passes/rewrite.py``) that make an imported graph read like the model.

tinygrad has no matmul: ``x @ w`` is a MUL of two broadcast views followed by a REDUCE(ADD), with
reshapes and permutes around it, and every broadcast is an EXPAND that only prepends axes plus a
permute. These families undo that (``conv.py``, ``pool.py`` and ``idioms.py`` add the others):

- ``shape``: reshape of reshape, permute of permute, identities, permutes that only move unit
  axes, expands that a broadcasting operand does not need;
- ``contraction``: ``sum(permute(mul(a, b)))`` -> ``aten.matmul`` (seed 001's MULACC);
- ``linear``: ``matmul(x, w.T) (+ b)`` -> ``aten.linear``, the op the PyTorch frontend emits for
  ``nn.Linear``, so both frontends give the same IR for the same model.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from torch_ir.rewrite import Match, Op, RewriteContext, Rule, Var, eliminate_dead_code, rewrite

from ...ir import NPU_IR, OpNode, TensorMeta

RESHAPE, PERMUTE, EXPAND = "aten.reshape.default", "aten.permute.default", "aten.expand.default"
MUL, SUM, MATMUL, LINEAR = "aten.mul.Tensor", "aten.sum.dim_IntList", "aten.matmul.default", "aten.linear.default"
ADD = "aten.add.Tensor"
BROADCASTING = (ADD, "aten.sub.Tensor", MUL, "aten.div.Tensor", "aten.maximum.default", "aten.lt.Tensor",
                "aten.ne.Tensor", "aten.eq.Tensor", "aten.pow.Tensor_Tensor")


def _fresh(ctx: RewriteContext, base: str) -> str:
    """A fresh name for a node a rule adds: ``<base>_v0``, ``<base>_v1``, ... (``m.ctx`` knows the names in use)."""
    base = re.sub(r"(_v\d+)+$", "", base)  # names stay short when rules rewrite rewritten nodes
    i = 0
    while ctx.taken(f"{base}_v{i}"):
        i += 1
    return ctx.claim(f"{base}_v{i}")


def _node(ctx: RewriteContext, op_type: str, x: TensorMeta | list[TensorMeta], shape: Sequence[int],
          attrs: dict[str, Any], like: TensorMeta | None = None) -> OpNode:
    inputs = x if isinstance(x, list) else [x]
    dtype = (like or inputs[0]).dtype
    out = TensorMeta(_fresh(ctx, inputs[0].name), list(shape), dtype, role="activation")
    return OpNode(out.name, op_type, inputs, [out], attrs)


def _out(m: Match, name: str = "root") -> TensorMeta:
    return m.node(name).outputs[0]


def _non_unit(shape: Sequence[int]) -> list[int]:
    return [d for d in shape if d != 1]


def _finish(root: OpNode, steps: list[OpNode]) -> list[OpNode]:
    """Give the last step the root's name and output, so users need no renaming."""
    last = steps[-1]
    steps[-1] = OpNode(root.name, last.op_type, last.inputs, list(root.outputs), last.attrs)
    return steps


# -- shape family -------------------------------------------------------------------------------------

def _reshape_to(x: TensorMeta, root: OpNode) -> list[OpNode] | TensorMeta:
    shape = root.outputs[0].shape
    if list(x.shape) == list(shape):
        return x
    return [OpNode(root.name, RESHAPE, [x], list(root.outputs), {"shape": list(shape)})]


def _permute_to(x: TensorMeta, dims: list[int], root: OpNode) -> list[OpNode] | TensorMeta:
    if dims == sorted(dims):
        return x
    moved = [d for d in dims if x.shape[d] != 1]
    if moved == sorted(moved):  # only unit axes move: the data keeps its order, a reshape says it
        return [OpNode(root.name, RESHAPE, [x], list(root.outputs), {"shape": [x.shape[d] for d in dims]})]
    return [OpNode(root.name, PERMUTE, [x], list(root.outputs), {"dims": dims})]


def _unit_only(a: Sequence[int], b: Sequence[int]) -> bool:
    return _non_unit(a) == _non_unit(b)


def _permute_through_reshape(m: Match) -> list[OpNode] | TensorMeta:
    """permute(reshape(x)) where the reshape only adds/drops unit axes -> reshape(permute(x))."""
    x, y, root = m["x"], _out(m, "inner"), m.node()
    y_axes = [i for i, d in enumerate(y.shape) if d != 1]  # non-unit axes of y, in order = those of x
    x_axes = [i for i, d in enumerate(x.shape) if d != 1]
    order = [x_axes[y_axes.index(a)] for a in root.attrs["dims"] if y.shape[a] != 1]
    dims = order + [i for i, d in enumerate(x.shape) if d == 1]
    if dims == list(range(len(dims))):
        return _reshape_to(x, root)
    permuted = _node(m.ctx, PERMUTE, x, [x.shape[d] for d in dims], {"dims": dims})
    return [permuted, *_as_nodes(_reshape_to(permuted.outputs[0], root), root)]


def _as_nodes(result: list[OpNode] | TensorMeta, root: OpNode) -> list[OpNode]:
    if isinstance(result, TensorMeta):  # an identity at the end of a chain: keep the root's name
        return [OpNode(root.name, RESHAPE, [result], list(root.outputs), {"shape": list(result.shape)})]
    return result


def _expand_as_broadcast(m: Match) -> list[OpNode] | None:
    """permute(expand(y)) that keeps y's axes in order -> expand(reshape(y)): a plain broadcast."""
    y, root = m["y"], m.node()
    lead = len(_out(m, "inner").shape) - len(y.shape)  # EXPAND prepended this many axes
    dims = root.attrs["dims"]
    from_y = [d - lead for d in dims if d >= lead]
    if from_y != sorted(from_y):
        return None
    target = root.outputs[0].shape
    unsqueezed = [y.shape[d - lead] if d >= lead else 1 for d in dims]
    steps = [] if unsqueezed == list(y.shape) else [_node(m.ctx, RESHAPE, y, unsqueezed, {"shape": unsqueezed})]
    src = steps[-1].outputs[0] if steps else y
    return steps + [OpNode(root.name, EXPAND, [src], list(root.outputs), {"size": list(target)})]


def _drop_broadcast(position: int):
    def replace(m: Match) -> list[OpNode] | None:
        root, x = m.node(), m["x"]
        others = [t.shape for i, t in enumerate(root.inputs) if i != position]
        if _broadcast([x.shape, *others]) != list(root.outputs[0].shape):
            return None
        inputs = list(root.inputs)
        inputs[position] = x
        return [OpNode(root.name, root.op_type, inputs, list(root.outputs), dict(root.attrs))]
    return replace


def _broadcast(shapes: list[Sequence[int]]) -> list[int] | None:
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return out


def shape_rules() -> list[Rule]:
    x = Var("x")
    return [
        Rule("reshape_of_reshape", "shape", Op(RESHAPE, Op(RESHAPE, x)),
             lambda m: _reshape_to(m["x"], m.node()), doc="reshape(reshape(x)) -> reshape(x)", shared_interior=True),
        Rule("reshape_identity", "shape", Op(RESHAPE, x),
             lambda m: m["x"] if m["x"].shape == _out(m).shape else None, doc="reshape to the same shape -> x"),
        Rule("permute_of_permute", "shape", Op(PERMUTE, Op(PERMUTE, x, name="inner")),
             lambda m: _permute_to(m["x"], [m.node("inner").attrs["dims"][d] for d in m.node().attrs["dims"]],
                                   m.node()), doc="permute(permute(x)) -> one permute", shared_interior=True),
        Rule("trivial_permute", "shape", Op(PERMUTE, x),
             lambda m: _trivial_permute(m), doc="identity permute -> x; a permute of unit axes -> reshape"),
        Rule("permute_through_unit_reshape", "shape", Op(PERMUTE, Op(RESHAPE, x, name="inner")),
             _permute_through_reshape, check=lambda m: None if _unit_only(m["x"].shape, _out(m, "inner").shape)
             else "the reshape merges or splits axes", doc="permute(unsqueeze(x)) -> unsqueeze(permute(x))",
             shared_interior=True),
        Rule("expand_is_broadcast", "shape", Op(PERMUTE, Op(EXPAND, Var("y"), name="inner")),
             _expand_as_broadcast, doc="permute(expand(y)) keeping y's axis order -> expand(reshape(y))",
             shared_interior=True),
        Rule("broadcast_operand_lhs", "shape", Op(BROADCASTING, Op(EXPAND, x), Var("other")), _drop_broadcast(0),
             doc="f(expand(x), y) -> f(x, y) when x broadcasts to the same result", shared_interior=True),
        Rule("broadcast_operand_rhs", "shape", Op(BROADCASTING, Var("other"), Op(EXPAND, x)), _drop_broadcast(1),
             doc="f(y, expand(x)) -> f(y, x) when x broadcasts to the same result", shared_interior=True),
    ]


def _trivial_permute(m: Match) -> list[OpNode] | TensorMeta | None:
    dims = m.node().attrs["dims"]
    result = _permute_to(m["x"], list(dims), m.node())
    return None if isinstance(result, list) and result[0].op_type == PERMUTE else result


# -- contraction family --------------------------------------------------------------------------------

def _contract(m: Match) -> list[OpNode] | None:
    """sum(permute(mul(a, b))) over the axes it reduces -> reshape/permute, matmul, reshape/permute.

    Axes of the product are labelled by which operand has them (size > 1): both and reduced = K,
    both and kept = batch, only a = M, only b = N. The operands are laid out (batch, M, K) and
    (batch, K, N), multiplied, and the result is laid out as the reduce's output.
    """
    root, mul = m.node(), m.node("mul")
    full = mul.outputs[0].shape
    order = reduced_first(m)
    k = len(root.attrs["dim"])
    reduced, kept = order[:k], order[k:]
    a, b = m["a"], m["b"]
    sa = [1] * (len(full) - len(a.shape)) + list(a.shape)
    sb = [1] * (len(full) - len(b.shape)) + list(b.shape)
    in_a = {d for d in range(len(full)) if sa[d] == full[d] != 1}
    in_b = {d for d in range(len(full)) if sb[d] == full[d] != 1}
    if any(d not in in_a or d not in in_b for d in reduced if full[d] != 1):
        return None  # a reduced axis only one side has: a sum, not a contraction
    batch = [d for d in kept if d in in_a and d in in_b]
    ms = [d for d in kept if d in in_a and d not in in_b]
    ns = [d for d in kept if d in in_b and d not in in_a]
    ks = [d for d in reduced if full[d] != 1]
    if not ks or not (ms or ns):
        return None  # an elementwise product summed (x*x).sum(): no free axis on either side
    size = lambda axes: math.prod(full[d] for d in axes)  # noqa: E731
    batch = _with_unit_batch_axes(batch, kept, full)
    bs = [full[d] for d in batch]
    steps: list[OpNode] = []
    lhs = _layout(m.ctx, a, sa, batch + ms + ks, bs + [size(ms), size(ks)], steps)
    rhs = _layout(m.ctx, b, sb, batch + ks + ns, bs + [size(ks), size(ns)], steps)
    mm = _node(m.ctx, MATMUL, [lhs, rhs], bs + [size(ms), size(ns)], {})
    steps.append(mm)
    y = _view(m.ctx, mm.outputs[0], bs + [full[d] for d in ms] + [full[d] for d in ns], RESHAPE, steps)
    labels = batch + ms + ns
    dims = [labels.index(d) for d in kept if full[d] != 1]
    y = _view(m.ctx, y, dims, PERMUTE, steps)
    _view(m.ctx, y, list(root.outputs[0].shape), RESHAPE, steps)
    return _finish(root, steps)  # the last step (at least the matmul) defines the root's output


def _with_unit_batch_axes(batch: list[int], kept: list[int], full: Sequence[int]) -> list[int]:
    """The batch axes, with the unit axes among the leading kept ones when there is a batch at all.

    ``q @ kᵀ`` of (1, H, T, D) tensors has batch (H) and a unit axis before it: the matmul stays
    4-D, (1, H, T, D) @ (1, H, D, T), as the model wrote it (and as the attention patterns of the
    normalization passes read it), rather than a flattened (H, T, D) @ (H, D, T) between reshapes.
    """
    if not batch:
        return batch  # x @ w of a Linear: a 2-D weight, whatever unit axes x has
    lead = []
    for d in kept:
        if d not in batch and full[d] != 1:
            break
        lead.append(d)
    return lead if set(batch) <= set(lead) else batch


def reduced_first(m: Match) -> list[int]:
    """Axes of the product ``m.node("mul")``: the ones the sum reduces first, then the kept ones in order."""
    full = m.node("mul").outputs[0].shape
    perm = m.node("perm").attrs["dims"] if "perm" in m.nodes else list(range(len(full)))
    dims = m.node().attrs["dim"]
    return [perm[d] for d in dims] + [perm[d] for d in range(len(full)) if d not in dims]


def _layout(ctx: RewriteContext, x: TensorMeta, padded: list[int], axes: list[int], shape: list[int],
            steps: list[OpNode]) -> TensorMeta:
    """Bring ``x`` (left-padded to ``padded``) into ``axes`` order, flattened to ``shape``.

    The axes not in ``axes`` have size 1 in ``x``: the first reshape drops them, so the permute
    (``kᵀ``) moves only the axes the operand has.
    """
    kept = sorted(axes)
    x = _view(ctx, x, [padded[d] for d in kept], RESHAPE, steps)
    x = _view(ctx, x, [kept.index(d) for d in axes], PERMUTE, steps)
    return _view(ctx, x, shape, RESHAPE, steps)


def _view(ctx: RewriteContext, x: TensorMeta, arg: list[int], op_type: str, steps: list[OpNode]) -> TensorMeta:
    if op_type == RESHAPE:
        if list(arg) == list(x.shape):
            return x
        steps.append(_node(ctx, RESHAPE, x, arg, {"shape": list(arg)}))
    else:
        if arg == sorted(arg):
            return x
        steps.append(_node(ctx, PERMUTE, x, [x.shape[d] for d in arg], {"dims": list(arg)}))
    return steps[-1].outputs[0]


def contraction_rules() -> list[Rule]:
    mul = Op(MUL, Var("a"), Var("b"), name="mul")
    float_sum = lambda attrs: "dtype" not in attrs  # noqa: E731 - integer sums keep their dtype; not a GEMM
    return [
        Rule("contraction", "contraction", Op(SUM, Op(PERMUTE, mul, name="perm"), attrs=float_sum), _contract,
             doc="sum(permute(mul(a, b))) over axes both have -> matmul (seed 001's MULACC)"),
        Rule("contraction_unpermuted", "contraction", Op(SUM, mul, attrs=float_sum), _contract,
             doc="sum(mul(a, b)) over axes both have -> matmul"),
    ]


# -- linear family -----------------------------------------------------------------------------------------

def _is_transpose(attrs: dict[str, Any]) -> bool:
    return attrs.get("dims") == [1, 0]


def linear_rules() -> list[Rule]:
    x, w, bias = Var("x"), Var("w"), Var("bias")

    def to_linear(m: Match) -> list[OpNode]:
        return [OpNode(m.node().name, LINEAR, [m["x"], m["w"]], list(m.node().outputs), {"bias": None})]

    def with_bias(m: Match) -> list[OpNode] | None:
        lin, out = m.node("lin"), _out(m)
        if lin.attrs.get("bias", 0) is not None or list(m["bias"].shape) != [out.shape[-1]] \
                or out.shape != _out(m, "lin").shape:
            return None
        return [OpNode(m.node().name, LINEAR, [*lin.inputs, m["bias"]], list(m.node().outputs), {})]

    def keep_leading(m: Match) -> list[OpNode] | None:
        """The linear keeps the leading axes of its result; x is viewed as [*those axes, K] first when
        the reshape into it also merged trailing axes (heads merged into the hidden dim, ``[B, T, H, D]``)."""
        lin, root, x = m.node("lin"), m.node(), m["x"]
        n, k = lin.outputs[0].shape[-1], lin.inputs[0].shape[-1]
        out = list(root.outputs[0].shape)
        if not out or out[-1] != n:
            return None
        if x.shape and x.shape[-1] == k and out == [*x.shape[:-1], n]:
            return [OpNode(root.name, LINEAR, [x, *lin.inputs[1:]], list(root.outputs), dict(lin.attrs))]
        if len(out) < 2 or not isinstance(k, int) or math.prod(out[:-1]) * k != math.prod(x.shape):
            return None
        view = _node(m.ctx, RESHAPE, x, [*out[:-1], k], {"shape": [*out[:-1], k]})
        return [view, OpNode(root.name, LINEAR, [view.outputs[0], *lin.inputs[1:]], list(root.outputs),
                             dict(lin.attrs))]

    return [
        Rule("matmul_transposed_weight", "linear", Op(MATMUL, x, Op(PERMUTE, w, attrs=_is_transpose)), to_linear,
             doc="matmul(x, w.T) -> linear(x, w)", shared_interior=True),
        Rule("linear_leading_axes", "linear",
             Op(RESHAPE, Op(LINEAR, Op(RESHAPE, x), w, exact_arity=False, name="lin")), keep_leading,
             doc="reshape(linear(reshape(x), w)) -> linear(x, w) keeping the result's leading axes",
             shared_interior=True),
        Rule("linear_bias", "linear", Op(ADD, Op(LINEAR, x, w, name="lin"), bias), with_bias,
             doc="linear(x, w) + b -> linear(x, w, b)"),
        Rule("linear_bias_first", "linear", Op(ADD, bias, Op(LINEAR, x, w, name="lin")), with_bias,
             doc="b + linear(x, w) -> linear(x, w, b)"),
    ]


def all_rules(constant_values: Mapping[str, Any] | None = None) -> list[Rule]:
    """Every rule, in the order they are tried; idioms need the IR's constant values."""
    from .conv import conv_rules
    from .idioms import idiom_rules
    from .pool import pool_rules

    values = dict(constant_values or {})
    return shape_rules() + conv_rules() + contraction_rules() + linear_rules() + idiom_rules(values) + \
        pool_rules()


def simplify_ir(ir: NPU_IR, rules: list[Rule] | None = None) -> NPU_IR:
    """Run the rule sets to a fixed point, then drop dead nodes. Example: ``simplify_ir(ir)``."""
    result = rewrite(ir, all_rules(ir.constant_values) if rules is None else rules, max_rounds=1000)
    return _drop_unused_constants(eliminate_dead_code(result.ir))


def _drop_unused_constants(ir: NPU_IR) -> NPU_IR:
    """Constants only the rewritten nodes read (log2(e) of an exp that became aten.exp) are dropped."""
    read = {t.name for n in ir.nodes for t in n.inputs} | {t.name for t in ir.graph_outputs}
    constants = [c for c in ir.constants if c.name in read]
    values = {k: v for k, v in ir.constant_values.items() if k in read}
    return dataclasses.replace(ir, constants=constants, constant_values=values)
