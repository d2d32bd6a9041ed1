"""The tensor table (seed 003 §4.2): a role, a layout and a quantization bit-width for every tensor.

The annotator only records: roles from where a tensor comes from and who reads it, layouts from
the NPU ops that imply one (propagated through elementwise ops), bit-widths from the tensor's quantization spec
(``TensorMeta.quant``) where it has one, else the width a ``QConfig`` plans. Quantizing is ``torch_ir.quant``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any

from npu_program.kernels import KERNELS
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.ops.npu import NPU_OPS


@dataclass
class QConfig:
    """Bit-widths by precedence: tensor name, then op type, then role, then the default.

    ``by_op_type`` applies to the weights a node of that type reads and the tensors it produces
    (``{"GEMM": 4}``: 4-bit GEMM weights and outputs). Only floating-point tensors get a width;
    indices and masks keep theirs. ``None`` as a width means "leave unquantized".
    """

    default: int | None = 8
    by_role: dict[str, int | None] = field(default_factory=dict)
    by_op_type: dict[str, int | None] = field(default_factory=dict)
    by_name: dict[str, int | None] = field(default_factory=dict)

    def bits(self, name: str, role: str | None, op_types: set[str]) -> tuple[int | None, str]:
        if name in self.by_name:
            return self.by_name[name], "name"
        for op in sorted(op_types):
            if op in self.by_op_type:
                return self.by_op_type[op], f"op:{op}"
        if role in self.by_role:
            return self.by_role[role], f"role:{role}"
        return self.default, "default"


def annotate(ir: NPU_IR, qconfig: QConfig | None = None) -> NPU_IR:
    """A copy of ``ir`` whose every tensor carries its role, its layout (when known) and its bit-width."""
    roles = _roles(ir)
    layouts = _layouts(ir)
    op_types = _op_types(ir)
    table: dict[str, dict[str, Any]] = {}
    for t in ir.tensors():
        entry: dict[str, Any] = {"role": roles.get(t.name, "activation"), "layout": layouts.get(t.name)}
        if t.quant is not None:  # a quantized tensor's width is its spec's
            entry["bits"] = t.quant.bits
        elif qconfig is not None and "float" in t.dtype:
            entry["bits"] = qconfig.bits(t.name, entry["role"], op_types.get(t.name, set()))[0]
        table[t.name] = entry
    return _apply(ir, table)


def _roles(ir: NPU_IR) -> dict[str, str]:
    roles: dict[str, str] = {}
    kv = set(ir.mutations) | set(ir.mutations.values())
    for n in ir.nodes:
        if n.op_type == "EMBEDDING":
            roles.setdefault(n.inputs[0].name, "embedding")
        record = KERNELS.get(n.op_type)
        if record is not None and record.writes_state:  # a KV cache written in place: its record says so
            kv.update((n.inputs[0].name, n.outputs[0].name))
    for t in ir.weights:
        roles.setdefault(t.name, "kv" if t.name in kv else "weight")
    roles.update({t.name: "constant" for t in ir.constants})
    roles.update({t.name: "input" for t in ir.graph_inputs})
    roles.update({name: "kv" for name in kv if name not in roles})
    roles.update({t.name: "output" for t in ir.graph_outputs})
    return roles


def _tokens(layout: str) -> int:
    return len(layout.strip("[]").split(",")) if layout.startswith("[") else len(layout)


def _keeps_label(op_type: str) -> bool:
    """Whether a same-rank output carries its input's layout label: the kernel table's layout-keeping and
    spatial kernels, and reductions with keepdim."""
    record = KERNELS.get(op_type)
    return record is not None and (record.layout in ("keeps", "spatial") or record.kind == "reduction")


def _layouts(ir: NPU_IR) -> dict[str, str]:
    layouts: dict[str, str] = {}
    for n in ir.nodes:
        op = NPU_OPS.get(n.op_type)
        if op is not None:
            _from_table(n, op.inputs, op.outputs, op.layouts, layouts)
        if n.op_type == "GEMM" and len(n.inputs[0].shape) == 3:
            layouts.setdefault(n.inputs[0].name, "[B,T,H]")
            layouts.setdefault(n.outputs[0].name, "[B,T,H]")
    for n in ir.nodes:  # propagate through ops that keep the layout of their (same-rank) input
        if _keeps_label(n.op_type):
            known = next((layouts[t.name] for t in n.inputs if t.name in layouts
                          and len(t.shape) == len(n.outputs[0].shape)), None)
            if known is not None:
                layouts.setdefault(n.outputs[0].name, known)
    return layouts


def _from_table(n: OpNode, in_names: tuple[str, ...], out_names: tuple[str, ...], table: dict[str, str],
                layouts: dict[str, str]) -> None:
    pairs = list(zip((s.rstrip("?") for s in in_names), n.inputs)) + list(zip(out_names, n.outputs))
    for name, t in pairs:
        layout = table.get(name)
        if layout is not None and _tokens(layout) == len(t.shape):
            layouts.setdefault(t.name, layout)


def _op_types(ir: NPU_IR) -> dict[str, set[str]]:
    """For each tensor, the op types that produce it or read it as a weight."""
    params = {t.name for t in ir.weights}
    seen: dict[str, set[str]] = {}
    for n in ir.nodes:
        for t in n.outputs:
            seen.setdefault(t.name, set()).add(n.op_type)
        for t in n.inputs:
            if t.name in params:
                seen.setdefault(t.name, set()).add(n.op_type)
    return seen


def _apply(ir: NPU_IR, table: dict[str, dict[str, Any]]) -> NPU_IR:
    """A copy of the IR with every tensor annotated from ``table``. A tensor object shared by its definition and
    its uses stays one object, annotated once: one value, one ``TensorMeta``, rather than a copy per use."""
    fixed: dict[int, TensorMeta] = {}  # id of a tensor of ``ir`` (alive as long as ``ir``) -> its annotated copy
    first: dict[str, TensorMeta] = {}  # name -> the first annotated copy, which equal copies become

    def fix(t: TensorMeta) -> TensorMeta:
        done = fixed.get(id(t))
        if done is None:
            e = table.get(t.name)
            done = t if e is None else dc_replace(t, role=e["role"], layout=e["layout"], bits=e.get("bits", t.bits))
            same = first.setdefault(done.name, done)
            done = fixed[id(t)] = same if same == done else done  # copies a pass made of one value become one
        return done

    def fix_all(ts: list[TensorMeta]) -> list[TensorMeta]:
        return [fix(t) for t in ts]

    nodes = [dc_replace(n, inputs=fix_all(n.inputs), outputs=fix_all(n.outputs)) for n in ir.nodes]
    return dc_replace(ir, graph_inputs=fix_all(ir.graph_inputs), graph_outputs=fix_all(ir.graph_outputs),
                      weights=fix_all(ir.weights), constants=fix_all(ir.constants), nodes=nodes)


def tensor_table(ir: NPU_IR) -> list[dict[str, Any]]:
    """The table as rows (name, shape, dtype, role, layout, bits), one per tensor."""
    return [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "role": t.role, "layout": t.layout,
             "bits": t.bits} for t in ir.tensors()]
