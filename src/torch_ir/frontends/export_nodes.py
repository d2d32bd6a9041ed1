"""What extraction reads from one FX node of an exported program: its op, arguments, module and outputs."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.fx import Node
from torch.utils import _pytree as pytree

# Nodes that only assert facts the exporter already checked; they compute nothing.
DROPPED_TARGETS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten._assert_async.msg,
}
# Ops that read a tensor's value into a Python scalar.
SCALAR_READS = {torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default}
# Ops that return their first input unchanged in an inference graph (dropout with train=False).
IDENTITY_TARGETS = {torch.ops.aten.dropout.default, torch.ops.aten.detach.default, torch.ops.aten.alias.default}


def is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def innermost_module(node: Node) -> tuple[str, Any] | None:
    """(module path, module class) of the innermost module ``node`` was traced in; the path is "" for the model
    itself; None when torch.export recorded no module stack."""
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1] if stack else None


def module_path(node: Node) -> str | None:
    """``"layers.3.mlp"``: the provenance's module path (None for the model itself)."""
    path = (innermost_module(node) or ("", None))[0]
    return path if isinstance(path, str) and path else None


TENSOR = object()  # marker: the argument went to OpNode.inputs


def is_tensor_node(value: Any) -> bool:
    return isinstance(value, Node) and is_tensor(value.meta.get("val"))


def is_tensor_type(t: Any) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)


def bind_args(target: torch._ops.OpOverload, node: Node) -> dict[str, Any]:
    given = dict(zip((a.name for a in target._schema.arguments), node.args))
    given.update(node.kwargs)
    return given


def op_type(target: torch._ops.OpOverload) -> str:
    return str(target)  # "aten.conv2d.default": namespace.name.overload, as torch.ops spells it


def shapes_on_cpu(node: Node, val: Any) -> Any:
    """A multi-output op's outputs as the CPU kernel makes them, where that differs from the meta kernel.

    Extraction traces on the meta device, and a few meta kernels declare outputs other than what real kernels
    return: ``_native_batch_norm_legit_no_training`` declares its saved mean and invstd as ``[C]``, while the
    CPU (and the decomposition) return ``[0]``, the op having nothing to save in inference. The IR declares
    what the op returns, so the outputs of multi-output ops are propagated again with CPU fake tensors (shapes
    only: nothing is computed or allocated) and the CPU shapes are kept; ``val`` stays when that cannot be done.
    """
    leaves = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, Node)]
    mode = next((getattr(a.meta.get("val"), "fake_mode", None) for a in leaves
                 if getattr(a.meta.get("val"), "fake_mode", None) is not None), None)
    if mode is None or not isinstance(node.target, torch._ops.OpOverload):
        return val

    def cpu_arg(a: Any) -> Any:
        if isinstance(a, Node):
            v = a.meta.get("val")
            return v.to("cpu") if is_tensor(v) and v.device.type == "meta" else v
        if isinstance(a, torch.device) and a.type == "meta":
            return torch.device("cpu")
        return a

    try:
        with mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args, kwargs = pytree.tree_map_only((Node, torch.device), cpu_arg, (node.args, dict(node.kwargs)))
            cpu = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the meta shapes stand when the CPU ones cannot be had
        return val
    if not isinstance(cpu, (tuple, list)) or len(cpu) != len(val):
        return val
    return [c if is_tensor(c) and is_tensor(v) and c.dtype == v.dtype and c.dim() == v.dim() else v
            for c, v in zip(cpu, val)]
