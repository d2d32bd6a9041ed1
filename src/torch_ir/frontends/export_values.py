"""Values an exported program computes from constants alone, which extraction can know without any weight.

A lifted constant or non-persistent buffer has a value where the program holds it on a real device, or where
the model was built under ``build_on_meta``; a node computed from such values only (a stride selected from a
constant) is run here on the CPU, so that an ``.item()`` of it can be written into the IR as a number.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node
from torch.utils import _pytree as pytree

from .constants import SHADOW_LIMIT, known_value


class KnownValues:
    """The values of ``ep``'s nodes that extraction can compute, cached per node."""

    def __init__(self, ep: ExportedProgram, model: torch.nn.Module | None):
        self.ep, self.model = ep, model
        self.specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        self.values: dict[Node, Any] = {}  # FX node -> its value computed from known constants (or None)
        self.order: dict[Node, int] = {}  # FX node -> its position in the graph (built on first use)

    def value_of(self, spec: Any) -> torch.Tensor | None:
        """The value of a lifted constant or non-persistent buffer, where extraction can know it: the program
        holds it on a real device, or it was made under ``build_on_meta`` (a meta tensor with a known value)."""
        value = self.ep.constants.get(spec.target)
        if value is None and self.model is not None:
            value = attribute(self.model, spec.target)
        if not isinstance(value, torch.Tensor):
            return None
        return value.detach() if value.device.type != "meta" else known_value(value)

    def evaluate(self, node: Node) -> torch.Tensor | None:
        """``node``'s value when it is computed from known constants only (a stride selected from a constant),
        run on the CPU; None when it depends on an input, a weight or an unknown constant."""
        if node in self.values:
            return self.values[node]
        needed, stack = set(), [node]
        while stack:  # the nodes it depends on, all of which must be computable here
            n = stack.pop()
            if n in needed or n in self.values:
                continue
            needed.add(n)
            if n.op == "placeholder":
                spec = self.specs.get(n.name)
                value_kind = spec is not None and (spec.kind == InputKind.CONSTANT_TENSOR or (
                    spec.kind == InputKind.BUFFER and spec.persistent is False))
                if not value_kind or self.value_of(spec) is None:
                    return None
                continue
            if n.op != "call_function" or not (isinstance(n.target, torch._ops.OpOverload)
                                                or n.target is operator.getitem):
                return None
            for t in pytree.tree_leaves(n.meta.get("val")):
                if not isinstance(t, torch.Tensor) or not all(isinstance(d, int) for d in t.shape) \
                        or t.numel() > SHADOW_LIMIT:
                    return None  # a symbolic size, a large tensor, a Python scalar: not a constant to compute here
            stack.extend(n.all_input_nodes)
        order = self.order or {n: i for i, n in enumerate(self.ep.graph.nodes)}
        self.order = order
        for n in sorted(needed, key=order.__getitem__):
            self.values[n] = self.value_of(self.specs[n.name]) if n.op == "placeholder" else self._run_on_known(n)
        return self.values[node]

    def _run_on_known(self, node: Node) -> Any:
        """Run one node on the CPU values of its inputs (all computed by ``evaluate``); None if it fails."""
        if any(self.values.get(a) is None for a in node.all_input_nodes):
            return None

        def arg(a: Any) -> Any:
            if isinstance(a, Node):
                return self.values[a]
            return torch.device("cpu") if a.type == "meta" else a

        args, kwargs = pytree.tree_map_only((Node, torch.device), arg, (node.args, dict(node.kwargs)))
        try:
            with torch.no_grad():
                return node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - a value that cannot be computed here is simply not known
            return None

    def unknown_leaf(self, node: Node) -> tuple[str, bool]:
        """What an unknown value is computed from, for a message, and whether that is a constant (or
        non-persistent buffer) whose value was merely not recorded, rather than data."""
        seen, stack, found = set(), [node], None
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n.op == "placeholder":
                spec = self.specs.get(n.name)
                if spec is None or spec.kind == InputKind.USER_INPUT:
                    return f"the input {n.name!r}", False
                if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.persistent is not False:
                    return f"the {'parameter' if spec.kind == InputKind.PARAMETER else 'buffer'} {spec.target!r}", False
                if self.value_of(spec) is None:
                    kind = "tensor constant" if spec.kind == InputKind.CONSTANT_TENSOR else "non-persistent buffer"
                    found = found or f"the {kind} {spec.target!r}"
            stack.extend(n.all_input_nodes)
        return (found, True) if found else ("values extraction cannot compute", False)


def attribute(model: torch.nn.Module, path: str) -> Any:
    """``model``'s attribute at a dotted state-dict path (``"head.anchors"``); None where a part is missing."""
    obj: Any = model
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj
