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
root's outputs that are read, under the same names, so users need no renaming), or None when the rule
does not apply after all (not reported; a ``check`` gives the reasons that are). It may
instead return an existing tensor (a ``TensorMeta`` of the root's shape and dtype): the root is
then an identity (a reshape to the same shape, a permute that composes to nothing) and its users
read that tensor instead. A root whose output is a graph output keeps its name, so such a match
is rejected with that reason.

Interior nodes of the match are removed when nothing else reads them; a match whose interior node
is read elsewhere is rejected with that reason, since removing it would be wrong and keeping it
would compute it twice. A rule whose replacement never recomputes its interior (it composes views: a
reshape of a reshape reads the first reshape's input) sets ``shared_interior=True``: a shared
interior node then stays for its other readers, and is removed only once nothing reads it.

Beyond a tree pattern: ``Op("*")`` matches any op; ``m.constant(t)`` / ``m.scalar(t)`` give the value
of a constant the IR knows; ``m.users(t)`` lists a tensor's readers, and ``m.absorb(node)`` lets the
replacement also define a sibling's outputs (three projections of one input become one op). A
replacement may return ``Fold(values)``: the root's outputs become constants (constant folding).

State a rule needs beyond the match lives in ``m.ctx``, the ``RewriteContext`` of the ``rewrite`` call
(never in a module global the caller sets up): ``m.ctx.fresh("gemm")`` gives a name no node or tensor
of the graph has (names drawn by a replacement that is not applied are given back, so names do not
depend on how often a match was tried), and ``m.ctx.cached(key, compute)`` remembers what a check
worked out (an index trace) for the rest of the call. Each call has its own context, so two rewrites
(two models, two threads) never see each other's names or caches.

Cost: producers, users and readers are indexed once per call and updated by each rewrite (``RewriteGraph``), so
time grows with the nodes visited. ``with index_checks():`` compares the indices with a rebuild after each rewrite.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any

from .ir import NPU_IR, OpNode, TensorMeta, check_integrity, merged_provenance
from .ir.serialize import gc_paused
from .rewrite_state import RewriteContext, RewriteGraph, RulesByOp, Slot


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
        self.keep_interior = False  # set for shared_interior rules: _drop_unread removes what is unread
        self.absorbed: list[OpNode] = []  # nodes outside the pattern that the replacement also defines
        self.data: dict[str, Any] = {}  # what a rule's check parsed, for its replacement
        self._graph: RewriteGraph | None = None  # the graph being rewritten (set by the engine)
        self.ctx: RewriteContext | None = None  # the rewrite call's context (set by the engine)

    def producer(self, tensor: TensorMeta) -> OpNode | None:
        """The node that defines ``tensor`` (None for a graph input, weight or constant).

        For rules that must look further up than a fixed pattern can: a chain of views of any length.
        """
        return self._graph.producer.get(tensor.name) if self._graph is not None else None

    def users(self, tensor: TensorMeta) -> list[OpNode]:
        """The nodes that read ``tensor``, in graph order (for rules over siblings: Q, K and V of one input)."""
        return self._graph.readers(tensor.name) if self._graph is not None else []

    def constant(self, tensor: TensorMeta) -> Any:
        """The value of a constant known in the IR (a nested list, or a number for a 0-d one), else None."""
        return self._graph.constants.get(tensor.name) if self._graph is not None else None

    def scalar(self, tensor: TensorMeta) -> float | int | bool | None:
        """The value of a one-element constant (``pow(x, c)`` with ``c = 2``), else None."""
        value = self.constant(tensor)
        while isinstance(value, list) and len(value) == 1:
            value = value[0]
        return value if isinstance(value, (int, float, bool)) else None

    def is_param(self, tensor: TensorMeta) -> bool:
        """Whether ``tensor`` is a weight or constant of the IR (not computed, not a graph input)."""
        return self._graph is not None and tensor.name in self._graph.params

    def include(self, node: OpNode) -> None:
        """Make ``node`` part of the match's interior (for checks that walk further than the pattern).

        Call it from a rule's ``check``: the engine then rejects the match if ``node``'s outputs are
        read outside the match, and removes ``node`` with the rest of the interior.
        """
        if node is not self.nodes.get("root") and all(n is not node for n in self.interior):
            self.interior.append(node)

    def absorb(self, node: OpNode) -> None:
        """Let the replacement also define ``node``'s outputs (a sibling of the root), removing ``node``.

        The replacement is placed where the root was, so ``node``'s inputs must be defined before the
        root; the engine rejects the match otherwise.
        """
        if all(n is not node for n in self.absorbed):
            self.absorbed.append(node)

    def __getitem__(self, name: str) -> TensorMeta:
        return self.tensors[name]

    def node(self, name: str = "root") -> OpNode:
        return self.nodes[name]


@dataclass(frozen=True)
class Rule:
    name: str
    family: str
    pattern: Op
    replace: Callable[[Match], list[OpNode] | TensorMeta | Fold | None]
    check: Callable[[Match], str | None] | None = None  # returns why the match is rejected, or None
    doc: str = ""
    shared_interior: bool = False  # interior nodes read elsewhere stay (the replacement only composes views)


@dataclass(frozen=True)
class Fold:
    """A replacement that says the root's outputs are constants: their values by output name.

    The root is removed and its outputs become IR constants (with inline values), so later rules
    see them through ``Match.constant``.
    """

    values: dict[str, Any]


@dataclass
class RewriteResult:
    ir: NPU_IR
    applied: Counter = field(default_factory=Counter)  # rule name -> times applied
    rejected: list[tuple[str, str, str]] = field(default_factory=list)  # (rule, node, reason)
    log: list[tuple[str, str]] = field(default_factory=list)  # (rule, root node) of each application, in order

    @property
    def changed(self) -> bool:
        return sum(self.applied.values()) > 0


# -- matching ---------------------------------------------------------------------------------------

def _match(pattern: Any, tensor: TensorMeta, graph: RewriteGraph, m: Match) -> bool:
    if isinstance(pattern, Var):
        bound = m.tensors.setdefault(pattern.name, tensor)
        return bound.name == tensor.name
    node = graph.producer.get(tensor.name)
    if node is None or not _match_node(pattern, node, graph, m):
        return False
    m.interior.append(node)
    return True


def _match_node(pattern: Op, node: OpNode, graph: RewriteGraph, m: Match) -> bool:
    if node.op_type not in pattern.op_types and pattern.op_types != ("*",):
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


def match_at(pattern: Op, node: OpNode, graph: RewriteGraph) -> Match | None:
    m = Match()
    m._graph = graph
    m.ctx = graph.ctx
    m.nodes["root"] = node
    return m if _match_node(pattern, node, graph, m) else None


# -- rewriting --------------------------------------------------------------------------------------

# Set by ``index_checks()``: every rewrite then checks the engine's indices against a rebuild (for tests).
_CHECK_INDICES: ContextVar[bool] = ContextVar("torch_ir_rewrite_index_checks", default=False)


@contextlib.contextmanager
def index_checks() -> Iterator[None]:
    """Within the block, each ``rewrite`` checks its indices (producers, users, readers, order) against a rebuild
    after every change, raising ``AssertionError`` on a difference. Slow: for tests of the engine and the rules."""
    token = _CHECK_INDICES.set(True)
    try:
        yield
    finally:
        _CHECK_INDICES.reset(token)


def rewrite(ir: NPU_IR, rules: Sequence[Rule], *, max_rounds: int = 20, check: bool = True,
            limit: int | None = None) -> RewriteResult:
    """Apply ``rules`` until none matches (at most ``max_rounds`` sweeps); returns a new IR.

    Each sweep walks the nodes in order and tries the rules in order at each node; the first rule
    that matches, passes its check and returns a replacement is applied. ``check`` runs the
    structural checker on the result. The rules share one ``RewriteContext`` (``m.ctx``) for the call.

    ``limit`` stops after that many applications: the order is deterministic, so the IR after the first
    ``n`` applications can be rebuilt at will (``npu_tools.debug.bisect`` searches for the one that breaks a
    model). ``RewriteResult.log`` lists every application (rule, root node), and every node a rule makes
    carries the provenance of the nodes it replaces plus the rule's name (``OpNode.provenance``).

    The graph's indices (``RewriteGraph``) are built once per call and updated by each rewrite, so a call
    costs time in proportion to the nodes visited, not to the nodes times the rewrites.
    """
    result = RewriteResult(ir)
    params = {t.name for t in ir.weights} | {t.name for t in ir.constants}
    state = _State(result, set(), _protected(ir), dict(ir.constant_values), {}, params, RewriteContext(ir), limit,
                   _CHECK_INDICES.get())
    graph, by_op = RewriteGraph(ir.nodes, state.constants, state.params, state.ctx), RulesByOp(rules)
    with gc_paused():  # matches, slots and copies: many small objects (see gc_paused)
        for _ in range(max_rounds):
            if not _sweep(graph, by_op, state) or state.exhausted:
                break
    folded = [meta for meta in state.folded.values() if graph.is_read(meta.name)]
    result.ir = dc_replace(
        ir, nodes=graph.nodes(), constants=list(ir.constants) + folded,
        constant_values={**ir.constant_values, **{t.name: state.constants[t.name] for t in folded}},
    )
    if check:
        check_integrity(result.ir, source=f"IR {ir.model_name!r} after rewriting")
    return result


def _protected(ir: NPU_IR) -> set[str]:
    """Tensors read from outside the node list: graph outputs and buffer mutations."""
    return {t.name for t in ir.graph_outputs} | set(ir.mutations.values())


@dataclass
class _State:
    result: RewriteResult
    seen: set[tuple[str, str, str]]  # rejections reported once
    protected: set[str]
    constants: dict[str, Any]  # name -> value, growing as rules fold nodes
    folded: dict[str, TensorMeta]  # the constants folding added
    params: set[str]  # weight and constant names (grows with folding)
    ctx: RewriteContext  # what the rules of this call share (m.ctx)
    limit: int | None = None  # applications allowed in the call (None: no limit)
    check_indices: bool = False  # compare the graph's indices with a rebuild after each rewrite (index_checks)

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and len(self.result.log) >= self.limit


def _sweep(graph: RewriteGraph, rules: RulesByOp, state: _State) -> bool:
    """One pass over the nodes, in place; whether a rule applied. After a rewrite the pass goes on at the first
    new node (at the node after the root when the replacement adds none).

    Going on (rather than starting over) keeps a graph with many matches linear in sweeps: a
    1,000-node graph with 600 rewrites would otherwise be rescanned 600 times. A match the rewrite
    made possible before that point is found by the next sweep.
    """
    if state.check_indices:
        graph.check()
    changed = False
    slot, budget = graph.first(), 4 * len(graph) + 100  # rules that undo each other must not spin inside one sweep
    while slot is not graph.tail and budget > 0 and not state.exhausted:
        after = _rewrite_at(graph, slot, rules, state)
        if after is None:
            slot = slot.next
            continue
        budget -= 1
        changed = True
        while after.removed:  # a removed slot's ``next`` leads on to the first node still in the graph
            after = after.next
        slot = after
        if state.check_indices:
            graph.check()
    return changed


def _rewrite_at(graph: RewriteGraph, slot: Slot, rules: RulesByOp, state: _State) -> Slot | None:
    """Apply the first rule that applies at ``slot``'s node; the slot the sweep goes on at, or None if none applies."""
    node = slot.node
    for rule in rules(node.op_type):
        m = match_at(rule.pattern, node, graph)
        if m is None:
            continue
        m.keep_interior = rule.shared_interior
        reason = rule.check(m) if rule.check else None
        new = None if reason else rule.replace(m)
        if new is None and reason is None:
            state.ctx._release()
            continue  # the replacement declined: the rule does not apply here (nothing to report)
        if new is not None:
            reason = _problem(graph, node, m, new, rule, state.protected)
        if new is None or reason is not None:
            state.ctx._release()  # names the replacement drew are free again
            key = (rule.name, node.name, reason)
            if key not in state.seen:
                state.seen.add(key)
                state.result.rejected.append(key)
            continue
        after = _apply(graph, slot, m, new, rule, state)
        state.ctx._commit(new if isinstance(new, list) else [])
        state.result.applied[rule.name] += 1
        state.result.log.append((rule.name, node.name))
        return after
    return None


def _problem(graph: RewriteGraph, root: OpNode, m: Match, new: Any, rule: Rule, protected: set[str]) -> str | None:
    """Why the replacement cannot take the root's place, or None."""
    if not rule.shared_interior:
        reason = _interior_read_elsewhere(m, graph, protected)
        if reason is not None:
            return reason
    if isinstance(new, TensorMeta):
        return _alias_problem(root, new, protected)
    if isinstance(new, Fold):
        return _fold_problem(root, new, protected)
    return _absorb_problem(graph, root, m)


def _apply(graph: RewriteGraph, slot: Slot, m: Match, new: Any, rule: Rule, state: _State) -> Slot:
    """Put the replacement in place of the root at ``slot``; the slot the sweep goes on at."""
    if isinstance(new, TensorMeta):
        after = _splice_alias(graph, slot, m, new)
    elif isinstance(new, Fold):
        after = _splice_fold(graph, slot, m, new, state)
    else:
        after = _splice(graph, slot, m, _with_provenance(new, m, rule))
    _drop_unread(graph, m, state.protected)
    return after


def _with_provenance(new: list[OpNode], m: Match, rule: Rule) -> list[OpNode]:
    """Copies of the replacement's nodes that record what they replace (the input IR's nodes stay untouched)."""
    provenance = merged_provenance([m.node(), *m.interior, *m.absorbed], rule.name)
    return [dc_replace(n, provenance=provenance) for n in new]


def _fold_problem(root: OpNode, fold: Fold, protected: set[str]) -> str | None:
    for t in root.outputs:
        if t.name in protected:
            return f"{t.name!r} is a graph output (or a buffer's new value); it stays computed"
        if t.name not in fold.values:
            return f"the fold gives no value for output {t.name!r}"
    return None


def _splice_fold(graph: RewriteGraph, slot: Slot, m: Match, fold: Fold, state: _State) -> Slot:
    root = slot.node
    for t in root.outputs:
        state.constants[t.name] = fold.values[t.name]
        state.folded[t.name] = dc_replace(t, role="constant")
        state.params.add(t.name)
    _remove_matched(graph, m, root, absorbed=False)
    graph.remove(root)
    return slot.next


def _absorb_problem(graph: RewriteGraph, root: OpNode, m: Match) -> str | None:
    """An absorbed node may only read tensors defined before the root, where its replacement goes."""
    where = graph.position(root)
    for node in m.absorbed:
        late = [t.name for t in node.inputs
                if (p := graph.producer.get(t.name)) is not None and graph.position(p) >= where]
        if late:
            return f"absorbed node {node.name!r} reads {late}, defined after the root {root.name!r}"
    return None


def _interior_read_elsewhere(m: Match, graph: RewriteGraph, protected: set[str]) -> str | None:
    inside = Counter(t.name for n in [m.node("root"), *m.interior] for t in n.inputs)
    for node in m.interior:
        for t in node.outputs:
            if t.name in protected or graph.users[t.name] > inside[t.name]:
                return f"{t.name!r} (from {node.name}) is also read outside the pattern"
    return None


def _alias_problem(root: OpNode, target: TensorMeta, protected: set[str]) -> str | None:
    if len(root.outputs) != 1:
        return f"node {root.name!r} has {len(root.outputs)} outputs; only a single-output node can become an alias"
    out = root.outputs[0]
    if out.name in protected:
        return f"{out.name!r} is a graph output (or a buffer's new value) and must keep its name"
    if list(out.shape) != list(target.shape) or out.dtype != target.dtype:
        return (f"alias {target} does not have the shape and dtype of {out}; "
                "the replacement must return a tensor equal to the root's output")
    return None


def _remove_matched(graph: RewriteGraph, m: Match, root: OpNode, *, absorbed: bool) -> None:
    """Remove the match's interior (unless the rule keeps a shared interior) and, for a node list, the absorbed
    nodes; the root stays, as the replacement goes in its place."""
    doomed = ([] if m.keep_interior else m.interior) + (m.absorbed if absorbed else [])
    for node in doomed:
        if node is not root:
            graph.remove(node)


def _drop_unread(graph: RewriteGraph, m: Match, protected: set[str]) -> None:
    """Remove the match's interior nodes that nothing reads any more (last first, so chains go too).

    Only interior nodes still present matter: those of a ``shared_interior`` match that others read.
    """
    for node in reversed(m.interior):
        if graph.contains(node) and not any(graph.is_read(t.name) or t.name in protected for t in node.outputs):
            graph.remove(node)


def _splice_alias(graph: RewriteGraph, slot: Slot, m: Match, target: TensorMeta) -> Slot:
    """Drop the root (and its dead interior) and make every later reader use ``target`` instead."""
    root = slot.node
    old = root.outputs[0].name
    _remove_matched(graph, m, root, absorbed=False)
    for reader in list(graph.readers(old)):
        if graph.position(reader) > slot.key:  # a new node object: the input IR stays untouched
            graph.replace(reader, dc_replace(reader, inputs=[target if t.name == old else t for t in reader.inputs]))
    graph.remove(root)
    return slot.next


def _splice(graph: RewriteGraph, slot: Slot, m: Match, new: list[OpNode]) -> Slot:
    root = slot.node
    defined = {t.name for n in new for t in n.outputs}
    missing = [t.name for t in root.outputs if t.name not in defined and graph.is_read(t.name)]
    missing += [t.name for n in m.absorbed for t in n.outputs if t.name not in defined]
    if missing:
        raise ValueError(f"replacement for node {root.name!r} does not define {missing}")
    _remove_matched(graph, m, root, absorbed=True)
    made = graph.insert_before(slot, new)
    graph.remove(root)
    return made[0] if made else slot.next


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
