"""The op registry: one table keyed by op type, consulted by the executor and the docs.

Lookup order for an op type such as ``"aten.conv2d.default"``:

1. an implementation registered with :func:`register_op` (custom ops, overrides, NPU ops);
2. the generic path: the overload ``torch.ops.<ns>.<name>.<overload>``, called with the node's
   inputs and attributes bound by the op's schema. Every ATen op that torch.export emits, and every
   ``torch.library`` custom op that is loaded, runs this way.

An op found by neither is reported with the node and a ready-to-paste registration.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import UnsupportedOpError
from ..ir import OpNode
from .values import decode_value, has_symbols

Kernel = Callable[[Sequence[torch.Tensor], Mapping[str, int]], list[torch.Tensor]]
"""A node bound to its implementation: (input tensors, bound symbols) -> output tensors."""


@dataclass(frozen=True)
class OpDef:
    """A registered implementation: ``impl(*inputs, **attrs)`` returns a tensor or a tuple of them."""

    op_type: str
    impl: Callable[..., Any]
    doc: str


_REGISTRY: dict[str, OpDef] = {}

# Namespaces whose ops a module registers on first use, so that an IR loaded from a file runs without
# its frontend having been imported first. The module's ``provide(op_type) -> bool`` registers the op.
_PROVIDERS = {
    ns: "torch_ir.frontends.onnx.custom_ops"
    for ns in ("onnx", "onnx_ml", "onnx_preview", "onnx_preview_training")
}


def register_op(op_type: str, *, doc: str | None = None, override: bool = False) -> Callable:
    """Register the reference implementation of ``op_type``.

    Example::

        @register_op("my_ns.scaled_add.default")
        def scaled_add(x, y, *, alpha=1.0):
            return x + alpha * y

    The function receives the node's input tensors positionally and its attributes as keyword
    arguments, and returns a tensor or a tuple of tensors in the order of the node's outputs.
    Registering over an existing registration needs ``override=True``.
    """
    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        if op_type in _REGISTRY and not override:
            raise ValueError(f"op {op_type!r} is already registered; pass override=True to replace it")
        text = doc if doc is not None else (fn.__doc__ or "").strip().split("\n")[0]
        _REGISTRY[op_type] = OpDef(op_type, fn, text)
        return fn

    return decorator


def unregister_op(op_type: str) -> None:
    _REGISTRY.pop(op_type, None)


def registered_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)


def resolve_overload(op_type: str) -> torch._ops.OpOverload | None:
    """``"aten.add.Tensor"`` -> ``torch.ops.aten.add.Tensor``, or None when torch has no such op."""
    parts = op_type.split(".")
    if len(parts) != 3:
        return None
    ns, name, overload = parts
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return None


def _provided(op_type: str) -> OpDef | None:
    module = _PROVIDERS.get(op_type.split(".", 1)[0])
    if module is None:
        return None
    try:
        provide = importlib.import_module(module).provide
    except ImportError:  # the frontend's optional dependency is not installed
        return None
    return _REGISTRY.get(op_type) if provide(op_type) else None


def is_supported(op_type: str) -> bool:
    return op_type in _REGISTRY or resolve_overload(op_type) is not None or _provided(op_type) is not None


def bind_kernel(node: OpNode, device: torch.device) -> Kernel:
    """Bind ``node`` to its implementation once, so the executor's loop only calls it."""
    opdef = _REGISTRY.get(node.op_type)
    if opdef is not None:
        return _bind_registered(node, opdef, device)
    overload = resolve_overload(node.op_type)
    if overload is not None:
        return _bind_schema(node, overload, device)
    opdef = _provided(node.op_type)
    if opdef is not None:
        return _bind_registered(node, opdef, device)
    raise UnsupportedOpError(unsupported_message([node]))


def unsupported_message(nodes: Sequence[OpNode]) -> str:
    ops = sorted({n.op_type for n in nodes})
    lines = [f"{len(nodes)} node(s) use op(s) with no implementation: {', '.join(ops)}"]
    lines += [f"  node {n.name!r}: {n}" for n in nodes[:20]]
    if len(nodes) > 20:
        lines.append(f"  ... and {len(nodes) - 20} more")
    example = ops[0]
    lines.append(
        "Fix: load the library that defines the op (a torch.library custom op runs as it is), or register "
        f"a reference implementation:\n    @torch_ir.register_op({example!r})\n"
        "    def impl(*inputs, **attrs):\n        ...  # return a tensor or a tuple of tensors"
    )
    return "\n".join(lines)


def _as_list(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    return [r for r in result if isinstance(r, torch.Tensor)]


def _bind_registered(node: OpNode, opdef: OpDef, device: torch.device) -> Kernel:
    impl, attrs = opdef.impl, node.attrs
    if has_symbols(attrs):
        return lambda inputs, syms: _as_list(impl(*inputs, **decode_value(attrs, syms, device)))
    static = {k: decode_value(v, None, device) for k, v in attrs.items()}
    return lambda inputs, syms: _as_list(impl(*inputs, **static))


def _bind_schema(node: OpNode, overload: torch._ops.OpOverload, device: torch.device) -> Kernel:
    """Plan how each schema argument is filled: from an input, a list of inputs, or an attribute."""
    plan: list[tuple[str, str, Any]] = []  # (arg name, kind, payload)
    cursor = 0
    for arg in overload._schema.arguments:
        is_list = isinstance(arg.type, torch.ListType) and _holds_tensors(arg.type.getElementType())
        if arg.name in node.attrs:
            value = node.attrs[arg.name]
            if is_list and value is not None:
                plan.append((arg.name, "list", value))
                cursor = max([cursor] + [i + 1 for i in value if i is not None])
            elif has_symbols(value):
                plan.append((arg.name, "sym", value))
            else:
                plan.append((arg.name, "const", decode_value(value, None, device)))
        elif _holds_tensors(arg.type):
            plan.append((arg.name, "input", cursor))
            cursor += 1
    if cursor != len(node.inputs):
        raise UnsupportedOpError(
            f"node {node.name!r} ({node.op_type}) has {len(node.inputs)} inputs but its schema "
            f"{overload._schema} places {cursor}; the IR was not written for this op's schema"
        )

    def kernel(inputs: Sequence[torch.Tensor], syms: Mapping[str, int]) -> list[torch.Tensor]:
        kwargs = {}
        for name, kind, payload in plan:
            if kind == "input":
                kwargs[name] = inputs[payload]
            elif kind == "list":
                kwargs[name] = [None if i is None else inputs[i] for i in payload]
            elif kind == "sym":
                kwargs[name] = decode_value(payload, syms, device)
            else:
                kwargs[name] = payload
        return _as_list(overload(**kwargs))

    return kernel


def _holds_tensors(t: Any) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)
