"""Lowering: a normalized IR becomes a list of kernel dispatches over named tensors.

Three steps, each small:

1. *layouts*: on a ``channels_last`` target the 4-D activations around convolutions and pooling are
   stored NHWC (and the elementwise ops between them keep it), so that no conversion happens between
   two convolutions;
2. *one dispatch per node*: the kernel has the node's op type and its attributes as parameters; a
   reshape of a contiguous tensor is no dispatch at all, only an alias (a view of the same bytes);
3. *fusion*: a convolution whose only reader is a residual add (and a relu after it) becomes one
   ``CONV_ADD`` dispatch; when the residual dies there, the output is written over it in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch_ir.ir import NPU_IR, OpNode, TensorMeta

from .compiled_program import Dispatch, TensorSpec
from .library import VIEW_OPS, Target
from .memory import resolve_alias

NHWC = "NHWC"
# ops whose 4-D activations are stored NHWC on a channels_last target
_SPATIAL = frozenset({"CONV", "aten.max_pool2d.default", "aten.avg_pool2d.default"})
# ops that keep the layout of a same-shaped input (elementwise on 4-D tensors)
_KEEPS_LAYOUT = frozenset({
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.relu.default", "aten.hardtanh.default",
    "aten.clamp.default", "aten.silu.default", "aten.sigmoid.default", "aten.hardswish.default",
    "aten.mul.Scalar", "aten.add.Scalar", "aten.div.Scalar",
})


@dataclass
class Lowered:
    """The lowering's result: dispatches in program order, tensor specs, and views of other tensors."""

    dispatches: list[Dispatch]
    tensors: dict[str, TensorSpec]
    # view tensor -> the tensor whose bytes it shares
    aliases: dict[str, str] = field(default_factory=dict)


def spec_of(meta: TensorMeta, layout: str | None = None) -> TensorSpec:
    """The program's spec of an IR tensor; the IR's descriptive layout labels are not storage layouts."""
    return TensorSpec(meta.name, [int(d) for d in meta.shape], meta.dtype, layout)


def lower(ir: NPU_IR, target: Target, *, fuse: bool = True) -> Lowered:
    """Dispatches for every node of ``ir`` (every node must be supported by ``target``; see ``compile``)."""
    layouts = assign_layouts(ir) if target.channels_last else {}
    tensors = {t.name: spec_of(t, layouts.get(t.name)) for t in _activations(ir)}
    tensors.update({c.name: spec_of(c) for c in ir.constants})
    activations = {t.name for t in _activations(ir)}
    dispatches: list[Dispatch] = []
    aliases: dict[str, str] = {}
    for node in ir.nodes:
        source, out = node.inputs[0].name if node.inputs else None, node.outputs[0].name
        if node.op_type in VIEW_OPS and source in activations and tensors[source].layout is None \
                and tensors[out].layout is None:
            aliases[out] = source
            continue
        dispatches.append(Dispatch(node.op_type, node.name, [t.name for t in node.inputs],
                                   [t.name for t in node.outputs], _params(node)))
    lowered = Lowered(dispatches, tensors, aliases)
    if fuse:
        fuse_conv_add(lowered, ir)
    return lowered


def _activations(ir: NPU_IR) -> list[TensorMeta]:
    return [*ir.graph_inputs, *(t for n in ir.nodes for t in n.outputs)]


def _params(node: OpNode) -> dict[str, Any]:
    params = dict(node.attrs)
    if node.op_type == "GEMM":
        params["has_bias"] = len(node.inputs) == 3
    return params


# -- layouts ---------------------------------------------------------------------------------------

def assign_layouts(ir: NPU_IR) -> dict[str, str]:
    """Tensor name -> ``"NHWC"`` for the 4-D float activations that convolutions and pooling read or write.

    Graph inputs read by a convolution are NHWC too: the runtime converts them when they are copied in,
    which is the one conversion such a model needs.
    """
    nhwc: dict[str, str] = {}
    activations = {t.name for t in _activations(ir)}

    def mark(t: TensorMeta) -> None:
        if t.name in activations and t.rank == 4 and t.dtype.startswith(("float", "bfloat")):
            nhwc[t.name] = NHWC

    for node in ir.nodes:
        if node.op_type in _SPATIAL:
            mark(node.inputs[0])
            for t in node.outputs:
                mark(t)
        elif node.op_type in _KEEPS_LAYOUT and any(t.name in nhwc and t.shape == node.outputs[0].shape
                                                   for t in node.inputs):
            mark(node.outputs[0])
    return nhwc


# -- fusion ----------------------------------------------------------------------------------------

def fuse_conv_add(lowered: Lowered, ir: NPU_IR) -> None:
    """CONV -> add(residual) [-> relu] becomes one ``CONV_ADD`` dispatch, in place over the residual if it can.

    Fused only when each intermediate has one reader and is not a graph output, so no value the graph
    still needs disappears. The fused dispatch takes the place of the last one it replaces, where all its
    inputs are defined.
    """
    outputs = {t.name for t in ir.graph_outputs}
    dispatches = lowered.dispatches
    readers = _readers(dispatches)
    fused: dict[int, Dispatch] = {}
    removed: set[int] = set()
    for i, conv in enumerate(dispatches):
        if conv.kernel != "CONV" or conv.params.get("activation") is not None or i in removed:
            continue
        chain = _residual_chain(i, dispatches, readers, outputs, lowered.tensors)
        if chain is None:
            continue
        add_at, relu_at, residual = chain
        if add_at in removed:
            continue  # both operands of the add are convolutions, and the other one took it
        last = relu_at if relu_at is not None else add_at
        params = dict(conv.params, activation="relu" if relu_at is not None else None)
        fused[last] = Dispatch("CONV_ADD", dispatches[add_at].node, [*conv.inputs, residual],
                               list(dispatches[last].outputs), params)
        removed |= {i, add_at} | ({relu_at} if relu_at is not None else set())
    lowered.dispatches = [fused.get(k, d) for k, d in enumerate(dispatches) if k not in removed or k in fused]
    _write_in_place(lowered, ir)


def _readers(dispatches: list[Dispatch]) -> dict[str, list[int]]:
    readers: dict[str, list[int]] = {}
    for k, d in enumerate(dispatches):
        for name in d.inputs:
            readers.setdefault(name, []).append(k)
    return readers


def _residual_chain(i: int, dispatches: list[Dispatch], readers: dict[str, list[int]], outputs: set[str],
                    tensors: dict[str, TensorSpec]) -> tuple[int, int | None, str] | None:
    """(add index, relu index or None, residual name) when dispatch ``i``'s output feeds a fusable add."""
    y = dispatches[i].outputs[0]
    if y in outputs or len(readers.get(y, [])) != 1:
        return None
    add_at = readers[y][0]
    add = dispatches[add_at]
    if add.kernel != "aten.add.Tensor" or add.params.get("alpha", 1) != 1 or len(set(add.inputs)) != 2:
        return None
    residual = next(name for name in add.inputs if name != y)
    same = tensors.get(residual)
    if same is None or (same.shape, same.dtype, same.layout) != tuple(
            getattr(tensors[y], a) for a in ("shape", "dtype", "layout")):
        return None  # a broadcast, a weight or a layout change: not a plain residual
    z = add.outputs[0]
    relu = readers.get(z, [])
    if z not in outputs and len(relu) == 1 and dispatches[relu[0]].kernel == "aten.relu.default":
        return add_at, relu[0], residual
    return add_at, None, residual


def _write_in_place(lowered: Lowered, ir: NPU_IR) -> None:
    """Let a CONV_ADD write its output over its residual when the residual is not read afterwards."""
    keep = {t.name for t in [*ir.graph_inputs, *ir.graph_outputs]}
    aliases = lowered.aliases
    last_read: dict[str, int] = {}
    for k, d in enumerate(lowered.dispatches):
        for name in d.inputs:
            last_read[resolve_alias(name, aliases)] = k
    for name in keep:
        last_read[resolve_alias(name, aliases)] = len(lowered.dispatches)
    for k, d in enumerate(lowered.dispatches):
        if d.kernel != "CONV_ADD":
            continue
        root, out = resolve_alias(d.inputs[-1], aliases), d.outputs[0]
        # the convolution must not read the residual's bytes itself (``conv(h) + h``): it would read
        # values the in-place accumulation is overwriting
        conv_reads = {resolve_alias(name, aliases) for name in d.inputs[:-1]}
        if root in lowered.tensors and last_read.get(root) == k and root not in keep and root not in conv_reads:
            d.params["inplace_residual"] = True
            aliases[out] = d.inputs[-1]
            # the residual's bytes now also hold the output: they live until the output's last read
            last_read[root] = max(k, last_read.pop(out, k))
