"""The one pattern-rewrite engine: every graph transformation is a list of ``Rule``s for it.

A rule is data: a pattern over IR nodes, a replacement, an optional check that says *why* a match
is rejected, a family (for switching rules on and off) and a doc line (for generated docs)::

    x, w = Var("x"), Var("w")
    rule = Rule(
        name="relu_of_relu",
        family="cleanup",
        pattern=Op("aten.relu.default", Op("aten.relu.default", x, name="inner")),
        replace=lambda m: [dataclasses.replace(m.node(), inputs=[m["x"]])],
        doc="relu(relu(x)) -> relu(x)",
    )
    result = rewrite(ir, [rule])

Patterns: ``Op(op_types, *inputs, attrs=predicate, name=...)`` matches a node whose op type is one
of ``op_types`` and whose inputs match ``inputs`` position by position (a node input is matched
through its producer); ``Var(name)`` matches any tensor and binds it, and a name used twice must
bind the same tensor (shared inputs). The root of a match is named ``"root"`` unless given a name.

Replacement: ``replace(match)`` returns the nodes that take the root's place (they must define the
root's outputs, under the same names, so users need no renaming), or None to decline. Interior
nodes of the match are removed when nothing else reads them; a match whose interior node is read
elsewhere is rejected with that reason, since removing it would be wrong and keeping it would
compute it twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any

from ..ir import NPU_IR, OpNode, TensorMeta, check_integrity


@dataclass(frozen=True)
class Var:
    """Matches any tensor and binds it under ``name``."""

    name: str


@dataclass(frozen=True)
class Op:
    """Matches a node by op type(s), its inputs' patterns and an optional attribute predicate."""

    op_types: str | tuple[str, ...]
    inputs: tuple[Any, ...] = ()
    attrs: Callable[[dict[str, Any]], bool] | None = None
    name: str | None = None
    exact_arity: bool = True  # the node has exactly len(inputs) inputs

    def __init__(self, op_types: str | Iterable[str], *inputs: Any,
                 attrs: Callable[[dict[str, Any]], bool] | None = None, name: str | None = None,
                 exact_arity: bool = True):
        object.__setattr__(self, "op_types", (op_types,) if isinstance(op_types, str) else tuple(op_types))
        object.__setattr__(self, "inputs", tuple(inputs))
        object.__setattr__(self, "attrs", attrs)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "exact_arity", exact_arity)


class Match:
    """What a pattern bound: tensors by ``Var`` name (``m["x"]``) and nodes by ``Op`` name (``m.node("root")``)."""

    def __init__(self) -> None:
        self.tensors: dict[str, TensorMeta] = {}
        self.nodes: dict[str, OpNode] = {}
        self.interior: list[OpNode] = []  # matched nodes other than the root, to remove

    def __getitem__(self, name: str) -> TensorMeta:
        return self.tensors[name]

    def node(self, name: str = "root") -> OpNode:
        return self.nodes[name]


@dataclass(frozen=True)
class Rule:
    name: str
    family: str
    pattern: Op
    replace: Callable[[Match], list[OpNode] | None]
    check: Callable[[Match], str | None] | None = None  # returns why the match is rejected, or None
    doc: str = ""


@dataclass
class RewriteResult:
    ir: NPU_IR
    applied: Counter = field(default_factory=Counter)  # rule name -> times applied
    rejected: list[tuple[str, str, str]] = field(default_factory=list)  # (rule, node, reason)

    @property
    def changed(self) -> bool:
        return sum(self.applied.values()) > 0


# -- matching ---------------------------------------------------------------------------------------

class _Graph:
    """Producer and user maps over the current node list."""

    def __init__(self, nodes: Sequence[OpNode]):
        self.producer: dict[str, OpNode] = {t.name: n for n in nodes for t in n.outputs}
        self.users: Counter = Counter(t.name for n in nodes for t in n.inputs)


def _match(pattern: Any, tensor: TensorMeta, graph: _Graph, m: Match) -> bool:
    if isinstance(pattern, Var):
        bound = m.tensors.setdefault(pattern.name, tensor)
        return bound.name == tensor.name
    node = graph.producer.get(tensor.name)
    if node is None or not _match_node(pattern, node, graph, m):
        return False
    m.interior.append(node)
    return True


def _match_node(pattern: Op, node: OpNode, graph: _Graph, m: Match) -> bool:
    if node.op_type not in pattern.op_types:
        return False
    if pattern.exact_arity and len(node.inputs) != len(pattern.inputs):
        return False
    if len(node.inputs) < len(pattern.inputs):
        return False
    if pattern.attrs is not None and not pattern.attrs(node.attrs):
        return False
    if pattern.name is not None:
        m.nodes[pattern.name] = node
    return all(_match(p, t, graph, m) for p, t in zip(pattern.inputs, node.inputs))


def match_at(pattern: Op, node: OpNode, graph: _Graph) -> Match | None:
    m = Match()
    m.nodes["root"] = node
    return m if _match_node(pattern, node, graph, m) else None


# -- rewriting --------------------------------------------------------------------------------------

def rewrite(ir: NPU_IR, rules: Sequence[Rule], *, max_rounds: int = 20, check: bool = True) -> RewriteResult:
    """Apply ``rules`` until none matches (at most ``max_rounds`` sweeps); returns a new IR.

    Each sweep walks the nodes in order and tries the rules in order at each node; the first rule
    that matches, passes its check and returns a replacement is applied. ``check`` runs the
    structural checker on the result.
    """
    nodes = list(ir.nodes)
    result = RewriteResult(ir)
    seen_rejections: set[tuple[str, str, str]] = set()
    for _ in range(max_rounds):
        nodes, applied = _sweep(nodes, rules, result, seen_rejections, _protected(ir))
        if not applied:
            break
    result.ir = dc_replace(ir, nodes=nodes)
    if check:
        check_integrity(result.ir, source=f"IR {ir.model_name!r} after rewriting")
    return result


def _protected(ir: NPU_IR) -> set[str]:
    """Tensors read from outside the node list: graph outputs and buffer mutations."""
    return {t.name for t in ir.graph_outputs} | set(ir.mutations.values())


def _sweep(nodes: list[OpNode], rules: Sequence[Rule], result: RewriteResult,
           seen: set[tuple[str, str, str]], protected: set[str]) -> tuple[list[OpNode], bool]:
    graph = _Graph(nodes)
    for i, node in enumerate(nodes):
        for rule in rules:
            m = match_at(rule.pattern, node, graph)
            if m is None:
                continue
            reason = _interior_read_elsewhere(m, graph, protected) or (rule.check(m) if rule.check else None)
            new = None if reason else rule.replace(m)
            if new is None:
                key = (rule.name, node.name, reason or "the replacement declined")
                if key not in seen:
                    seen.add(key)
                    result.rejected.append(key)
                continue
            result.applied[rule.name] += 1
            return _splice(nodes, i, m, new), True
    return nodes, False


def _interior_read_elsewhere(m: Match, graph: _Graph, protected: set[str]) -> str | None:
    inside = Counter(t.name for n in [m.node("root"), *m.interior] for t in n.inputs)
    for node in m.interior:
        for t in node.outputs:
            if t.name in protected or graph.users[t.name] > inside[t.name]:
                return f"{t.name!r} (from {node.name}) is also read outside the pattern"
    return None


def _splice(nodes: list[OpNode], index: int, m: Match, new: list[OpNode]) -> list[OpNode]:
    root = nodes[index]
    defined = {t.name for n in new for t in n.outputs}
    missing = [t.name for t in root.outputs if t.name not in defined]
    if missing:
        raise ValueError(f"replacement for node {root.name!r} does not define {missing}")
    removed = {id(n) for n in m.interior}
    before = [n for n in nodes[:index] if id(n) not in removed]
    return before + new + [n for n in nodes[index + 1:] if id(n) not in removed]


def select(rules: Iterable[Rule], families: Iterable[str] | None = None,
           disabled: Iterable[str] = ()) -> list[Rule]:
    """The rules of the given families (all when None), less those named in ``disabled``."""
    wanted = None if families is None else set(families)
    off = set(disabled)
    return [r for r in rules if (wanted is None or r.family in wanted) and r.name not in off]


def eliminate_dead_code(ir: NPU_IR) -> NPU_IR:
    """Drop nodes none of whose outputs is read (by a node, a graph output or a buffer mutation)."""
    live = _protected(ir)
    kept: list[OpNode] = []
    for node in reversed(ir.nodes):
        if any(t.name in live for t in node.outputs):
            kept.append(node)
            live.update(t.name for t in node.inputs)
    return dc_replace(ir, nodes=kept[::-1])
