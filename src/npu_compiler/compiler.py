"""``compile``: IR -> normalized IR -> support check -> dispatches -> memory plan -> ``CompiledProgram``.

Every check that can fail runs before the program exists, so a failed compile writes nothing, and
every unsupported node is reported at once with its op and the reason.

``compile(..., fallback="cpu")`` does not refuse the nodes the target merely has no kernel for (or not in
their dtype): they become *host dispatches* of the same program (``Dispatch.host`` = the reason), run on
the host CPU by the op's reference implementation, with their tensors in the same arena. Nodes the
host cannot run either (no reference implementation, an op refused as unsafe, symbolic shapes, a kernel
deferred for a reason of its own) are still refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Any

import torch

from npu_compiler.passes import NormalizeOptions, normalize
from npu_program.dynamic import DynamicProgram
from npu_program.kernels import KERNELS
from torch_ir.ir import NPU_IR, OpNode, TensorMeta, check_integrity, load_ir
from torch_ir.ir.serialize import ir_from_dict
from torch_ir.limits import check_shape
from torch_ir.ops.registry import is_supported, resolve_overload, unsafe_reason
from torch_ir.ops.values import dtype_from_name
from torch_ir.quant.spec import stored
from torch_ir.weights import build_buffer

from .compiled_program import CompiledProgram, MemoryPlan, TensorSpec
from .cost import node_flops
from .dynamic import Buckets, compile_dynamic, specialized
from .errors import CompileError, UnsupportedOpsError
from .library import Target, get_target, unsupported_reason
from .lower import Lowered, lower, spec_of
from .memory import plan_arena
from .passes.kernel_fusion import fuse_kernels
from .passes.precision import cast_precision, precision_dtype
from .state import state_slots, state_specs
from .static_shapes import bind_shapes, check_static_inputs
from .upper_bound import UpperBound, compile_upper_bound

COMPILER_VERSION = "0.1.0"

#: The values of ``compile(fallback=...)`` besides None (strict): where nodes without a kernel run.
FALLBACKS = ("cpu",)


@dataclass
class CompileOptions:
    """How to compile. The defaults give the fastest program for the target."""

    # Run npu_compiler.passes.pipeline first (turn ATen graphs into NPU ops). Off only for an IR already normalized.
    normalize: bool = True
    normalize_options: NormalizeOptions | None = None
    # "greedy_by_size" reuses memory; "naive" gives every tensor its own bytes (for comparison).
    memory_strategy: str = "greedy_by_size"
    # Byte alignment of arena offsets; None takes the target's (``Target.alignment``).
    alignment: int | None = None
    # Fuse CONV + residual add (+ relu) into one dispatch.
    fuse: bool = True
    # Name the program's outputs "output" (one output) or "output_0", "output_1", ...; False keeps IR names.
    public_output_names: bool = True
    # Keep the normalized IR inside the program (for inspection and CPU fallback); False for a smaller file.
    embed_ir: bool = True
    # The compute dtype of a float model: "bf16", "fp16" or "fp32" casts its activations and weights (the program's
    # inputs and outputs keep their dtypes; passes.precision); None keeps the IR's own dtypes.
    precision: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON values only, sets sorted: the options go into the program, which must be deterministic."""
        return json.loads(json.dumps(asdict(self), default=sorted))


IRSource = NPU_IR | dict | str | os.PathLike


def compile(ir_or_path: IRSource, *, target: str | Target = "cpu",  # noqa: A001 - the seed's name
            options: CompileOptions | None = None, fallback: str | None = None,
            bind: Mapping[str, int] | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            dynamic: Buckets | UpperBound | Mapping[str, Sequence[int]] | None = None,
            progress: Callable[[str], None] | None = None) -> CompiledProgram | DynamicProgram:
    """Compile an IR (an ``NPU_IR``, its JSON dict, or a path to its JSON file) into a ``CompiledProgram``.

    ``fallback=None`` (strict) raises ``UnsupportedOpsError`` listing every node the target cannot run.
    ``fallback="cpu"`` makes the nodes the target has no kernel for (or not in their dtype) host
    dispatches, run on the host CPU by the op's reference implementation; the program's
    ``metadata["placement"]`` and ``summary()`` say what runs where. Nodes the host cannot run either
    (no reference implementation, unsafe ops, symbolic shapes) still raise ``UnsupportedOpsError``.
    Other problems raise ``CompileError``.

    ``bind`` (``{"batch": 1}``) and ``input_shapes`` (``{"x": [1, 16]}``) fix symbolic dimensions first
    (``npu_compiler.static_shapes``): a program is planned for static shapes.

    ``dynamic`` (``{"seq": [128, 256, 512]}`` or a ``Buckets``) compiles one static variant per bucket instead and
    returns an ``npu_program.DynamicProgram`` (``npu_compiler.dynamic``); ``UpperBound()`` one program planned for
    the largest sizes and sized at run time (``npu_compiler.upper_bound``); ``progress`` hears of each compile.
    """
    _check_fallback(fallback)
    options = options or CompileOptions()
    precision_dtype(options.precision)  # an unknown precision is refused before any work
    target = get_target(target)
    ir = bind_shapes(load_source(ir_or_path), bind, input_shapes)
    if dynamic is not None:
        return _compile_buckets(ir, dynamic, target, options, fallback, progress)
    check_static_inputs(ir)
    if options.normalize:
        ir = normalize(ir, options.normalize_options)
    if options.precision is not None:
        ir = cast_precision(ir, options.precision)
    if options.fuse:
        ir = fuse_kernels(ir)
    host = check_compilable(ir, target, fallback=fallback)
    if options.public_output_names:
        ir = with_public_output_names(ir)  # renames tensors, not nodes: ``host`` still names the nodes
    slots = state_slots(ir)  # raises for a buffer write a program cannot carry as state
    lowered = lower(ir, target, host, slots)
    memory = plan(lowered, ir, options, options.alignment or target.alignment)
    return _program(ir, target, lowered, memory, options, fallback, slots)


def _compile_buckets(ir: NPU_IR, dynamic: Buckets | UpperBound | Mapping[str, Sequence[int]], target: Target,
                     options: CompileOptions, fallback: str | None,
                     progress: Callable[[str], None] | None) -> DynamicProgram:
    """The variants compiled without the IR each (the symbolic IR goes into the program once)."""
    one = dc_replace(options, embed_ir=False)

    def compile_one(static: NPU_IR) -> CompiledProgram:
        return compile(static, target=target, options=one, fallback=fallback)

    if isinstance(dynamic, UpperBound):
        program = compile_upper_bound(ir, dynamic, lambda sizes: compile_one(specialized(ir, sizes,
                                                                                          dynamic.specialize)),
                                      progress=progress)
    else:
        buckets = dynamic if isinstance(dynamic, Buckets) else Buckets(dynamic)
        program = compile_dynamic(ir, buckets, compile_one, progress=progress)
    if options.embed_ir:
        program.ir = _deterministic_ir_dict(ir)
    return program


def _check_fallback(fallback: str | None) -> None:
    if fallback is not None and fallback not in FALLBACKS:
        raise CompileError(f"compile(fallback={fallback!r}): unknown fallback; use one of "
                           f"{', '.join(map(repr, FALLBACKS))} (nodes without a kernel run on the host CPU) or None "
                           "(strict: every node must have a kernel of the target)")


def load_source(source: IRSource) -> NPU_IR:
    if isinstance(source, NPU_IR):
        return source
    if isinstance(source, dict):
        return ir_from_dict(source)
    return load_ir(str(Path(source)))


def check_compilable(ir: NPU_IR, target: Target, *, fallback: str | None = None) -> dict[str, str]:
    """Raise if any node is unsupported (all of them listed) or the graph needs what programs lack.

    With ``fallback="cpu"``, returns the nodes that become host dispatches (node name -> why); only the
    nodes the host cannot run either are refused. Strict (None): returns ``{}`` or raises.
    """
    written_inputs = sorted(set(ir.mutations) & {t.name for t in ir.graph_inputs})
    if written_inputs:
        raise CompileError(
            f"IR {ir.model_name!r} writes its inputs in place ({', '.join(written_inputs)}); compiled programs "
            "do not write back into their inputs. Run it with torch_ir.IRExecutor, or return the new value "
            "from forward() instead of updating the input.")
    unsupported = [(n, reason) for n in ir.nodes if (reason := unsupported_reason(n, target))]
    refused = {n.name: why for n, _ in unsupported if (why := host_refusal(n))}
    host = {n.name: reason for n, reason in unsupported if n.name not in refused}
    if fallback is None and unsupported:
        _raise_unsupported(ir, target, [(n.name, n.op_type, reason) for n, reason in unsupported],
                           hostable=not refused)
    if refused:
        _raise_unsupported(ir, target, [(n.name, n.op_type, _both_reasons(reason, refused[n.name]))
                                        for n, reason in unsupported if n.name in refused],
                           hostable=False, fallback=fallback)
    _check_sizes(ir)
    dynamic = [t for t in ir.graph_inputs if not t.is_static]
    if dynamic:
        raise CompileError(f"IR {ir.model_name!r}: inputs {[str(t) for t in dynamic]} have symbolic shapes; "
                           "programs are planned for static shapes: export with fixed shapes")
    produced = {t.name for n in ir.nodes for t in n.outputs}
    passthrough = [t.name for t in ir.graph_outputs if t.name not in produced]
    if passthrough:
        raise CompileError(f"IR {ir.model_name!r}: outputs {passthrough} are not computed by any node (an input or "
                           "weight returned as it is); return a computed value instead")
    return host


def _both_reasons(target_reason: str, host_reason: str) -> str:
    """Why neither the target nor the host runs a node, without saying one thing twice (a symbolic shape is
    usually both reasons)."""
    if host_reason in target_reason or target_reason.startswith(host_reason.split(";")[0]):
        return target_reason
    return f"{target_reason}; and the host cannot run it: {host_reason}"


def host_refusal(node: OpNode) -> str | None:
    """Why ``node`` cannot be a host dispatch either (None: it can): symbolic shapes (a program is planned
    for static shapes), a kernel deferred for a reason of its own, or an op the registry cannot run."""
    dynamic = [t for t in [*node.inputs, *node.outputs] if not t.is_static]
    if dynamic:
        return f"tensor {dynamic[0].name!r} has the symbolic shape {dynamic[0].shape}; export with fixed shapes"
    record = KERNELS.get(node.op_type)
    if record is not None and record.deferred is not None:
        return record.deferred
    if is_supported(node.op_type):
        return None
    overload = resolve_overload(node.op_type)
    reason = unsafe_reason(node.op_type, overload) if overload is not None else None
    if reason is not None:
        return f"the op registry refuses {node.op_type} ({reason})"
    return (f"the torch_ir op registry has no reference implementation of {node.op_type}; register one with "
            "@torch_ir.register_op")


def _raise_unsupported(ir: NPU_IR, target: Target, bad: list[tuple[str, str, str]], *, hostable: bool,
                       fallback: str | None = None) -> None:
    where = f"target {target.name!r}" + (f" nor on the host (fallback={fallback!r})" if fallback else "")
    lines = [f"IR {ir.model_name!r}: {len(bad)} of {len(ir.nodes)} nodes cannot run on {where}:"]
    lines += [f"  {name} ({op}): {reason}" for name, op, reason in bad]
    if hostable:
        lines.append('Fix: compile(..., fallback="cpu") (torch-ir compile --fallback cpu) runs these nodes on the '
                     "host CPU inside the program; or run the graph through npu_compiler.partition(ir, "
                     "is_op_supported) and npu_runtime.DAGExecutor; or register a kernel for them.")
    else:
        lines.append("Fix: export with fixed shapes, register a reference implementation (@torch_ir.register_op) "
                     "or a kernel for these ops, or run the graph with torch_ir.IRExecutor.")
    raise UnsupportedOpsError("\n".join(lines), bad)


def _check_sizes(ir: NPU_IR) -> None:
    """Every static tensor within ``torch_ir.limits`` (an IR shape of [1e12, 1e12] must not become an arena)."""
    for t in ir.tensors():
        if t.is_static:
            dtype, shape = stored(t.dtype, t.shape)  # 4-bit codes are held packed, two per byte, as uint8
            itemsize = dtype_from_name(dtype).itemsize
            check_shape([int(d) for d in shape], itemsize, f"IR {ir.model_name!r}: tensor {t.name!r}")


def with_public_output_names(ir: NPU_IR) -> NPU_IR:
    """Rename graph outputs to ``output`` (or ``output_i``) so callers need not know internal tensor names."""
    outs = ir.graph_outputs
    public = ["output"] if len(outs) == 1 else [f"output_{i}" for i in range(len(outs))]
    taken = {t.name for t in ir.tensors()} - {t.name for t in outs}
    if len({t.name for t in outs}) != len(outs) or taken & set(public):
        return ir  # an output listed twice, or the names are taken: keep the IR's names
    renames = {t.name: new for t, new in zip(outs, public)}
    renamed: dict[int, TensorMeta] = {}  # one copy per tensor object (a value shared by its uses stays shared)

    def re(t: TensorMeta) -> TensorMeta:
        if t.name not in renames:
            return t
        if id(t) not in renamed:
            renamed[id(t)] = dc_replace(t, name=renames[t.name])
        return renamed[id(t)]

    # copies of the nodes that touch an output; the rest, and the inputs and weights, keep their objects
    nodes = [n if not any(t.name in renames for t in (*n.inputs, *n.outputs))
             else dc_replace(n, inputs=[re(t) for t in n.inputs], outputs=[re(t) for t in n.outputs])
             for n in ir.nodes]
    public_ir = dc_replace(ir, nodes=nodes, graph_outputs=[re(t) for t in outs],
                           mutations={k: renames.get(v, v) for k, v in ir.mutations.items()})
    check_integrity(public_ir, source=f"IR {ir.model_name!r} with its outputs renamed {public}")
    return public_ir


def plan(lowered: Lowered, ir: NPU_IR, options: CompileOptions, alignment: int) -> MemoryPlan:
    """Lifetimes -> offsets -> an independent overlap check. Activations only: weights live elsewhere."""
    constants = {c.name for c in ir.constants}
    sizes = {name: spec.nbytes for name, spec in lowered.tensors.items()
             if name not in lowered.aliases and name not in constants}
    return plan_arena(lowered.dispatches, sizes, [t.name for t in ir.graph_inputs], [t.name for t in ir.graph_outputs],
                      lowered.aliases, alignment=alignment, strategy=options.memory_strategy,
                      where=f"IR {ir.model_name!r}")


def placement_metadata(ir: NPU_IR, lowered: Lowered, fallback: str | None) -> dict[str, Any]:
    """What runs where, compactly (the program's ``metadata["placement"]``): nodes, dispatches and FLOPs on
    the target and on the host, and every host dispatch with its op and reason."""
    host_nodes = {d.node for d in lowered.dispatches if d.host is not None}
    sides = {side: {"nodes": 0, "dispatches": 0, "flops": 0} for side in ("target", "host")}
    for node in ir.nodes:
        side = sides["host" if node.name in host_nodes else "target"]
        side["nodes"] += 1
        side["flops"] += node_flops(node)
    for d in lowered.dispatches:
        sides["host" if d.host is not None else "target"]["dispatches"] += 1
    return {"fallback": fallback, **sides,
            "host_dispatches": [{"index": i, "node": d.node, "op": d.kernel, "reason": d.host}
                                for i, d in enumerate(lowered.dispatches) if d.host is not None]}


def _program(ir: NPU_IR, target: Target, lowered: Lowered, memory: MemoryPlan,
             options: CompileOptions, fallback: str | None = None,
             slots: dict[str, str] | None = None) -> CompiledProgram:
    slots = slots or {}
    read = {name for d in lowered.dispatches for name in d.inputs} | set(lowered.aliases.values())
    inline = ir.constant_values
    state = set(slots.values())
    weights = [w for w in [*ir.weights, *(c for c in ir.constants if c.name not in inline)]
               if w.name in read and w.name not in state]
    tensors = dict(lowered.tensors)
    constants = _rebuilt_buffers(ir, weights)
    tensors.update({w.name: spec_of(w) for w in weights if w.name in constants})
    weights = [w for w in weights if w.name not in constants]
    for c in ir.constants:
        if c.name in inline and c.name in read:
            constants[c.name] = _constant_bytes(inline[c.name], c.dtype)
        elif c.name not in inline:
            tensors.pop(c.name, None)  # a constant stored in the weights file is a weight slot
    slot_keys = {ir.weight_name_mapping.get(w.name, w.name) for w in weights}
    metadata = {
        "compiler": COMPILER_VERSION,
        "options": options.to_dict(),
        "source_nodes": ir.metadata.get("normalize", {}).get("nodes_before", len(ir.nodes)),
        "normalized_nodes": len(ir.nodes),
        # state-dict key -> tied keys, so a weights file that stored a tied weight once still loads
        "weight_aliases": {k: v for k, v in ir.weight_aliases.items() if {k, *v} & slot_keys},
        # the slots no checkpoint holds (non-persistent buffers): how load_weights rebuilds them, or null when the
        # IR had no recipe (then its error names them as buffers, not as weights of another model)
        "non_persistent_buffers": {k: ir.non_persistent_buffers[k] for k in sorted(slot_keys)
                                   if k in ir.non_persistent_buffers},
        "placement": placement_metadata(ir, lowered, fallback),
    }
    if "precision" in ir.metadata:  # the compute dtype, and the weight slots load_weights rounds into it
        cast = ir.metadata["precision"]
        metadata["precision"] = {**cast, "weights": {w.name: cast["weights"][w.name] for w in weights
                                                     if w.name in cast["weights"]}}
    return CompiledProgram(
        model_name=ir.model_name, target=target.name,
        input_specs=[lowered.tensors[t.name] for t in ir.graph_inputs],
        output_specs=[lowered.tensors[t.name] for t in ir.graph_outputs],
        weight_specs=[spec_of(w) for w in weights],
        weight_keys={w.name: ir.weight_name_mapping.get(w.name, w.name) for w in weights},
        tensors=tensors, dispatches=lowered.dispatches, memory=memory, constants=constants,
        state_specs=state_specs(ir, slots),
        ir=_deterministic_ir_dict(ir) if options.embed_ir else None, metadata=metadata,
    )


#: Non-persistent buffers up to this size are embedded in the program as constants; larger ones stay weight slots,
#: which ``npu_runtime.load_weights`` rebuilds from ``metadata["non_persistent_buffers"]`` when the weights lack them.
REBUILT_BUFFER_BYTES = 1 << 20


def _rebuilt_buffers(ir: NPU_IR, weights: list) -> dict[str, bytes]:
    """Bytes of the small non-persistent buffers the IR has a recipe for (a rotary ``inv_freq``): they are
    made from the model's config, not stored in its checkpoint, so the program carries them rather than
    asking the weights file for them."""
    rebuilt = {}
    for w in weights:
        recipe = ir.non_persistent_buffers.get(ir.weight_name_mapping.get(w.name, w.name))
        if recipe is not None and w.is_static and spec_of(w).nbytes <= REBUILT_BUFFER_BYTES:
            value = build_buffer(recipe, w, f"IR {ir.model_name!r}: buffer {w.name!r}").contiguous()
            rebuilt[w.name] = value.reshape(-1).view(torch.uint8).numpy().tobytes()
    return rebuilt


def _deterministic_ir_dict(ir: NPU_IR) -> dict[str, Any]:
    """The IR as a dict without normalize's wall-clock timings, so the same model gives the same file."""
    data = ir.to_dict()
    stages = data.get("metadata", {}).get("normalize", {}).get("stages", [])
    for stage in stages:
        if isinstance(stage, dict):
            stage.pop("seconds", None)
    return data


def _constant_bytes(value: Any, dtype: str) -> bytes:
    """Little-endian bytes of an inline IR constant (via torch, which knows bfloat16)."""
    t = torch.tensor(value, dtype=dtype_from_name(dtype)).contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


__all__ = ["COMPILER_VERSION", "FALLBACKS", "Buckets", "CompileError", "UpperBound", "CompileOptions", "TensorSpec",
           "UnsupportedOpsError", "compile", "host_refusal"]
