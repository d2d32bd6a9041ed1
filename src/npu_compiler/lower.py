"""Lowering: a normalized (and kernel-fused) IR becomes a list of kernel dispatches over named tensors.

Three steps, each small, each reading the kernel table (``npu_program.kernels``) for what a kernel is:

1. *layouts*: on a ``channels_last`` target the 4-D activations of *spatial* kernels (convolutions,
   pooling) are stored NHWC, and kernels that *keep* a layout carry it on, so that no conversion
   happens between two convolutions;
2. *one dispatch per node*: the kernel has the node's op type, and its parameters are the node's attributes
   decoded from the IR's encoding into the plain values the kernel record declares, every declared default
   filled in (``npu_program.params``); an attribute the kernel does not declare, or a value that does not
   fit its declaration, is a ``CompileError`` naming the node, the kernel and the param. A *view* kernel of
   a contiguous tensor is no dispatch at all, only an alias (a view of the same bytes);
3. *in place*: a kernel that adds a residual and can write over it (``inplace_residual`` among its parameters:
   a CONV with ``has_residual``, made by ``npu_compiler.passes.kernel_fusion``) writes its output over its
   residual when the residual dies there.

*Host dispatches* (``compile(fallback="cpu")``: nodes the target has no kernel for) are plain dispatches
with ``host`` set to the reason: the node's op type and attributes as the IR encodes them (a host dispatch
runs the op's reference, which reads that encoding; it has no kernel record to declare params), no view
aliasing, no in-place writing. What they write is row-major (a convolution reading it reads row-major);
what they read keeps the layout its producer wrote (an NHWC convolution output stays NHWC, rather than making the
convolution convert), and the runtime hands it to the op's reference in logical order (a strided view
on the CPU, a download elsewhere), so no conversion dispatch is needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from npu_program.kernels import KERNELS
from npu_program.params import ParamError, check_params, params_from_attrs
from torch_ir.ir import NPU_IR, OpNode, TensorMeta

from .compiled_program import Dispatch, Provenance, TensorSpec
from .errors import CompileError
from .library import Target
from .memory import resolve_alias

NHWC = "NHWC"


@dataclass
class Lowered:
    """The lowering's result: dispatches in program order, tensor specs, and views of other tensors."""

    dispatches: list[Dispatch]
    tensors: dict[str, TensorSpec]
    # view tensor -> the tensor whose bytes it shares
    aliases: dict[str, str] = field(default_factory=dict)


def spec_of(meta: TensorMeta, layout: str | None = None) -> TensorSpec:
    """The program's spec of an IR tensor (its quantization spec kept); the IR's descriptive layout labels are not
    storage layouts."""
    return TensorSpec(meta.name, [int(d) for d in meta.shape], meta.dtype, layout, quant=meta.quant)


def lower(ir: NPU_IR, target: Target, host: Mapping[str, str] | None = None,
          state: Mapping[str, str] | None = None) -> Lowered:
    """Dispatches for every node of ``ir``: a kernel of ``target`` for each node, except the nodes named in
    ``host`` (node name -> why), which become host dispatches (see ``compile(fallback=...)``).

    ``state`` maps the tensor holding a buffer's new value to the buffer's state slot (see
    ``npu_compiler.state``): the dispatch making it writes the slot in place, and its readers read the slot.
    """
    host, state = host or {}, state or {}
    layouts = assign_layouts(ir, host) if target.channels_last else {}
    tensors = {t.name: spec_of(t, layouts.get(t.name)) for t in _activations(ir) if t.name not in state}
    tensors.update({c.name: spec_of(c) for c in ir.constants})
    activations = {t.name for t in _activations(ir)}
    dispatches: list[Dispatch] = []
    aliases: dict[str, str] = {}
    for node in ir.nodes:
        ins = [state.get(t.name, t.name) for t in node.inputs]
        outs = [state.get(t.name, t.name) for t in node.outputs]
        if node.name in host:  # the op itself, on the host: its attributes as they are, no kernel params
            dispatches.append(Dispatch(node.op_type, node.name, ins, outs, dict(node.attrs), host=host[node.name],
                                       provenance=_provenance(node)))
            continue
        source, out = ins[0] if ins else None, outs[0]
        if KERNELS[node.op_type].view and source in activations and tensors[source].layout is None \
                and tensors[out].layout is None:
            aliases[out] = source
            continue
        dispatches.append(Dispatch(node.op_type, node.name, ins, outs, _params(node), provenance=_provenance(node)))
    lowered = Lowered(dispatches, tensors, aliases)
    mark_bind_time(lowered, ir, set(state.values()))
    write_in_place(lowered, ir)
    return lowered


def _activations(ir: NPU_IR) -> list[TensorMeta]:
    return [*ir.graph_inputs, *(t for n in ir.nodes for t in n.outputs)]


def _provenance(node: OpNode) -> Provenance | None:
    p = node.provenance
    return None if p is None else Provenance(list(p.nodes), p.module, p.origin, list(p.rules))


def _params(node: OpNode) -> dict[str, Any]:
    """The kernel's params: the node's attributes as plain values with the declared defaults filled in
    (``npu_program.params.params_from_attrs``), checked against the kernel's declarations, plus ``has_bias``
    where the kernel requires it and the IR tells it by input count: more inputs than the kernel's others (those
    before the bias, its record's ``bias_index``; a folded batch norm; a residual) account for."""
    record = KERNELS[node.op_type]
    declared = record.params
    where = f"node {node.name!r} (kernel {node.op_type})"
    try:
        params = params_from_attrs(declared, node.attrs, where)
        if "has_bias" in declared and declared["has_bias"].required and "has_bias" not in node.attrs:
            # a kernel whose has_bias has a default (the quantized ones: the op's own default) takes that; a
            # packed QKV_PROJ has one weight where the record counts three
            others = 2 if params.get("packed") else record.bias_index or 2
            others += 4 * (params.get("bn_eps") is not None) + bool(params.get("has_residual"))
            params["has_bias"] = len(node.inputs) > others
        check_params(declared, params, len(node.inputs), where)
    except ParamError as e:
        raise CompileError(f"{e}; the kernel record (npu_program.kernels) declares what a dispatch may carry: "
                           "fix the pass that made the node, or declare the param") from None
    return params


# -- layouts ---------------------------------------------------------------------------------------

def assign_layouts(ir: NPU_IR, host: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tensor name -> ``"NHWC"`` for the 4-D float activations that convolutions and pooling read or write.

    Graph inputs read by a convolution are NHWC too: the runtime converts them when they are copied in,
    which is the one conversion such a model needs. Nodes in ``host`` (host dispatches) mark nothing, and
    what they write is never NHWC: they run the op's reference, which gives row-major tensors.
    """
    host = host or {}
    nhwc: dict[str, str] = {}
    activations = {t.name for t in _activations(ir)}
    host_written = {t.name for n in ir.nodes if n.name in host for t in n.outputs}

    def mark(t: TensorMeta) -> None:
        if t.name in activations and t.name not in host_written and t.rank == 4 \
                and t.dtype.startswith(("float", "bfloat")):
            nhwc[t.name] = NHWC

    for node in ir.nodes:
        if node.name in host:
            continue
        layout = KERNELS[node.op_type].layout  # every other node has a kernel: compile checked it
        if layout == "spatial":
            residual = node.inputs[-1:] if node.attrs.get("has_residual") else []
            for t in [node.inputs[0], *node.outputs, *residual]:
                mark(t)  # a residual is added to the NHWC output element by element: NHWC too
        elif layout == "keeps" and any(t.name in nhwc and t.shape == node.outputs[0].shape
                                                   for t in node.inputs):
            mark(node.outputs[0])
    return nhwc


# -- bind time ------------------------------------------------------------------------------------

def mark_bind_time(lowered: Lowered, ir: NPU_IR, state: Set[str] = frozenset()) -> None:
    """Mark the dispatches that read only weights and constants (and what earlier such dispatches wrote) to
    run once, when the weights are bound: a weight-norm, a weight transposed or filled with a constant is
    then computed once rather than on every run (the ONNX "light" models make their weights with
    ConstantOfShape). What they write keeps its bytes for the program's life; graph outputs are left alone
    (every run copies them out)."""
    known = {t.name for t in [*ir.weights, *ir.constants]} - state  # state slots change from run to run
    outputs = {t.name for t in ir.graph_outputs}
    for d in lowered.dispatches:
        if all(resolve_alias(n, lowered.aliases) in known or n in known for n in d.inputs) \
                and not set(d.outputs) & outputs:
            d.at_bind = True
            known.update(d.outputs)


# -- in place --------------------------------------------------------------------------------------

def write_in_place(lowered: Lowered, ir: NPU_IR) -> None:
    """Let a kernel that adds a residual (and declares ``inplace_residual``) write its output over the residual
    when the residual is not read afterwards."""
    keep = {t.name for t in [*ir.graph_inputs, *ir.graph_outputs]}
    aliases = lowered.aliases
    last_read: dict[str, int] = {}
    for k, d in enumerate(lowered.dispatches):
        for name in d.inputs:
            last_read[resolve_alias(name, aliases)] = k
    for name in keep:
        last_read[resolve_alias(name, aliases)] = len(lowered.dispatches)
    pinned = {resolve_alias(n, aliases) for d in lowered.dispatches if d.at_bind for n in d.outputs}
    for k, d in enumerate(lowered.dispatches):
        if not _may_write_over_residual(d):
            continue
        root, out = resolve_alias(d.inputs[-1], aliases), d.outputs[0]
        # the convolution must not read the residual's bytes itself (``conv(h) + h``): it would read
        # values the in-place accumulation is overwriting
        conv_reads = {resolve_alias(name, aliases) for name in d.inputs[:-1]}
        # the output is a view of the residual's bytes: only when both are stored alike (a residual written
        # by a host dispatch is row-major while the convolution's output is NHWC)
        same_layout = root in lowered.tensors and lowered.tensors[root].layout == lowered.tensors[out].layout
        if same_layout and last_read.get(root) == k and root not in keep and root not in conv_reads \
                and root not in pinned:  # bytes computed once at bind time are read again by the next run
            d.params["inplace_residual"] = True
            aliases[out] = d.inputs[-1]
            # the residual's bytes now also hold the output: they live until the output's last read
            last_read[root] = max(k, last_read.pop(out, k))


def _may_write_over_residual(d: Dispatch) -> bool:
    """Whether ``d``'s kernel adds a residual and can write its output over it: its record declares
    ``inplace_residual``. A host dispatch runs the op's reference, which writes a fresh tensor."""
    return d.host is None and not d.at_bind and bool(d.params.get("has_residual")) \
        and "inplace_residual" in KERNELS[d.kernel].params
