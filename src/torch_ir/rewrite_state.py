"""What one ``rewrite`` call keeps besides its rules: the names in use and the rules' caches (``RewriteContext``,
``m.ctx``), and the graph being rewritten with its indices, kept up to date (``RewriteGraph``).

The engine (``rewrite.py``) asks, at every node and for every rule, who produces a tensor, who reads it
and how often, and where a node stands in the graph. Rebuilding those maps after each rewrite made a
rewrite cost as much as the whole graph, and normalizing a model quadratic in its depth (issue 27: 40 s
for an 80-layer Llama). Here they are built once per ``rewrite`` call and updated by each change:

- the nodes form a doubly linked list of slots, so a replacement is spliced in where its root was and a
  removed node is unlinked, without copying the list;
- every slot has an integer order key that grows along the list, so "is A before B" (an absorbed node
  must read only what is defined before the root) and "the readers in graph order" need no walk. Keys are
  spaced widely; when an insertion finds no room between two neighbours, the list is renumbered (rare);
- ``producer`` (tensor name -> node), ``users`` (tensor name -> reads, counting a node that reads it
  twice twice) and the readers of each tensor (each node once, in graph order) change with each node
  added or removed.

``check()`` rebuilds all of it from the node list and compares: the engine calls it after every rewrite
under ``torch_ir.rewrite.index_checks()`` (tests), not otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from torch_ir.ir import NPU_IR, OpNode

if TYPE_CHECKING:  # the engine's module imports this one
    from .rewrite import Rule

T = TypeVar("T")


class RewriteContext:
    """What one ``rewrite`` call shares with the rules it runs: names in use, caches, the input IR.

    A rule reaches it as ``m.ctx`` from its check or replacement. It lives as long as the call, so
    nothing a rule remembers can outlive the graph it describes.
    """

    def __init__(self, ir: NPU_IR) -> None:
        self.ir = ir  #: the IR passed to ``rewrite`` (the current nodes are the engine's)
        self.cache: dict[Hashable, Any] = {}  #: free for rules; ``cached`` keys it by what it computes
        # names ever used in this call: a removed node's name stays taken (a name never changes meaning),
        # except to the replacement that removes it (``reusable``)
        self._nodes: set[str] = {n.name for n in ir.nodes}
        self._tensors: set[str] = {t.name for t in ir.tensors()}
        self._pending: set[str] = set()  # drawn by the replacement being tried; kept only if it is applied
        self._used: dict[tuple[str, bool], int] = {}  # (base, nodes_only) -> names below it are all taken

    def taken(self, name: str, *, nodes_only: bool = False) -> bool:
        """Whether a node (or, unless ``nodes_only``, a tensor) of the graph is named ``name``, or the
        replacement being built drew it. Node and tensor names are separate namespaces in the IR; a
        name meant for both (a node named after its output) asks for both."""
        return name in self._nodes or name in self._pending or (not nodes_only and name in self._tensors)

    def claim(self, name: str, *, nodes_only: bool = False, reusable: Iterable[str] = ()) -> str:
        """Reserve ``name`` for the replacement being built (for rules with a naming scheme of their own).

        ``reusable``: names of nodes the replacement removes, which it may give to a node of its own."""
        if name in self._pending or (name not in reusable and self.taken(name, nodes_only=nodes_only)):
            raise ValueError(f"name {name!r} is already used in the graph")
        self._pending.add(name)
        return name

    def fresh(self, base: str, *, nodes_only: bool = False, reusable: Iterable[str] = ()) -> str:
        """``base``, or ``base_1``, ``base_2``, ...: the first name not in use (see ``taken``), reserved."""
        reusable = set(reusable)
        n = self._skip_used(base, nodes_only)  # base.._{n-1} stay taken; one of them may be reusable
        n = min((k for k in _numbers(base, reusable) if k < n and _numbered(base, k) not in self._pending), default=n)
        name = _numbered(base, n)
        while name in self._pending or (name not in reusable and self.taken(name, nodes_only=nodes_only)):
            n += 1
            name = _numbered(base, n)
        return self.claim(name, nodes_only=nodes_only, reusable=reusable)

    def _skip_used(self, base: str, nodes_only: bool) -> int:
        """The first n whose name (``base``, ``base_1``, ...) no applied replacement or input node has taken.

        A name once used stays taken for the call, so the count only grows: numbering the 80th ``gemm`` of a
        model starts there instead of trying the 79 names before it (which made naming quadratic in depth)."""
        key = (base, nodes_only)
        n = self._used.get(key, 0)
        while _numbered(base, n) in self._nodes or (not nodes_only and _numbered(base, n) in self._tensors):
            n += 1
        self._used[key] = n
        return n

    def cached(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()`` once per rewrite call for ``key``. Rules keep tensor names and their meaning
        within a call, so a key of tensor names (plus the rule's own tag) stays valid for all of it."""
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    def _commit(self, nodes: Sequence[OpNode]) -> None:
        self._nodes |= self._pending
        self._nodes.update(n.name for n in nodes)
        self._tensors |= self._pending
        self._tensors.update(t.name for n in nodes for t in n.outputs)
        self._pending.clear()

    def _release(self) -> None:
        self._pending.clear()


def _numbered(base: str, n: int) -> str:
    return base if n == 0 else f"{base}_{n}"


def _numbers(base: str, names: Iterable[str]) -> Iterator[int]:
    """The n of each of ``names`` that is ``_numbered(base, n)``."""
    for name in names:
        if name == base:
            yield 0
        elif name.startswith(base + "_") and name[len(base) + 1:].isascii() and name[len(base) + 1:].isdigit():
            n = int(name[len(base) + 1:])
            if n > 0 and _numbered(base, n) == name:
                yield n


_GAP = 1 << 32  # room between neighbouring keys: 32 nested insertions at one place before a renumbering


class Slot:
    """One place in the node list. A removed slot keeps its ``next``, so a cursor on it can move on."""

    __slots__ = ("key", "next", "node", "prev", "removed")

    def __init__(self, node: OpNode | None, key: int) -> None:
        self.node = node
        self.key = key
        self.prev: Slot | None = None
        self.next: Slot | None = None
        self.removed = False


class RewriteGraph:
    """The current nodes of a ``rewrite`` call, with producer, user and reader indices and the known constants."""

    def __init__(self, nodes: Sequence[OpNode], constants: dict[str, Any], params: set[str],
                 ctx: Any = None) -> None:
        self.head, self.tail = Slot(None, -1), Slot(None, (len(nodes) + 1) * _GAP)
        self.head.next, self.tail.prev = self.tail, self.head
        self.slots: dict[int, Slot] = {}  # id(node) -> its slot (the graph holds the node, so the id is its own)
        self.producer: dict[str, OpNode] = {}
        self.users: Counter = Counter()
        self._readers: dict[str, dict[int, OpNode]] = {}
        self._ordered: dict[str, list[OpNode]] = {}  # readers in graph order, computed when asked
        self.constants = constants  # shared with the engine's state: folding adds to them
        self.params = params
        self.ctx = ctx
        for i, node in enumerate(nodes):
            self._link(Slot(node, (i + 1) * _GAP), self.tail)
            self._index(node)

    # -- queries -------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.slots)

    def __iter__(self) -> Iterator[OpNode]:
        slot = self.head.next
        while slot is not self.tail:
            yield slot.node
            slot = slot.next

    def nodes(self) -> list[OpNode]:
        return list(self)

    def first(self) -> Slot:
        return self.head.next

    def contains(self, node: OpNode) -> bool:
        return id(node) in self.slots

    def position(self, node: OpNode) -> int:
        """An order key: a node before another in the graph has a smaller one."""
        return self.slots[id(node)].key

    def readers(self, name: str) -> list[OpNode]:
        """The nodes that read tensor ``name``, each once, in graph order (the list is shared: do not change it)."""
        ordered = self._ordered.get(name)
        if ordered is None:
            readers = self._readers.get(name)
            if not readers:
                return []
            ordered = sorted(readers.values(), key=self.position)
            self._ordered[name] = ordered
        return ordered

    def is_read(self, name: str) -> bool:
        return bool(self._readers.get(name))

    # -- changes -------------------------------------------------------------------------------------------
    def remove(self, node: OpNode) -> None:
        """Take ``node`` out of the list and the indices (nothing happens when it is not in the graph)."""
        slot = self.slots.pop(id(node), None)
        if slot is None:
            return
        self._unindex(node)
        slot.prev.next, slot.next.prev = slot.next, slot.prev
        slot.removed = True

    def insert_before(self, slot: Slot, nodes: Sequence[OpNode]) -> list[Slot]:
        """Put ``nodes`` (new to the graph) in order just before ``slot``; their slots."""
        if slot.key - slot.prev.key <= len(nodes):
            self._renumber()
        lo, step = slot.prev.key, (slot.key - slot.prev.key) // (len(nodes) + 1)
        made = []
        for i, node in enumerate(nodes):
            new = Slot(node, lo + (i + 1) * step)
            self._link(new, slot)
            self._index(node)
            made.append(new)
        return made

    def replace(self, old: OpNode, new: OpNode) -> None:
        """Put ``new`` in ``old``'s place (same position), updating the indices."""
        slot = self.slots.pop(id(old))
        self._unindex(old)
        slot.node = new
        self.slots[id(new)] = slot
        self._index(new)

    # -- internals -----------------------------------------------------------------------------------------
    def _link(self, slot: Slot, before: Slot) -> None:
        slot.prev, slot.next = before.prev, before
        before.prev.next = slot
        before.prev = slot
        self.slots[id(slot.node)] = slot

    def _renumber(self) -> None:
        slot, key = self.head.next, _GAP
        while slot is not self.tail:
            slot.key, slot, key = key, slot.next, key + _GAP
        self.tail.key = key

    def _index(self, node: OpNode) -> None:
        for t in node.outputs:
            self.producer[t.name] = node
        for t in node.inputs:
            self.users[t.name] += 1
            readers = self._readers.setdefault(t.name, {})
            if id(node) not in readers:
                readers[id(node)] = node
                self._ordered.pop(t.name, None)

    def _unindex(self, node: OpNode) -> None:
        for t in node.outputs:
            if self.producer.get(t.name) is node:  # a replacement may already define the name anew
                del self.producer[t.name]
        for t in node.inputs:
            self.users[t.name] -= 1
            if not self.users[t.name]:
                del self.users[t.name]
            readers = self._readers.get(t.name)
            if readers is not None and readers.pop(id(node), None) is not None:
                self._ordered.pop(t.name, None)
                if not readers:
                    del self._readers[t.name]

    # -- debugging -----------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ``AssertionError`` unless the list's links, keys and every index agree with a rebuild from scratch."""
        nodes = self.nodes()
        backwards, slot = [], self.tail.prev
        while slot is not self.head:
            backwards.append(slot.node)
            slot = slot.prev
        _agree(backwards[::-1] == nodes, "the list read backwards differs from the list read forwards")
        keys = [self.slots[id(n)].key for n in nodes]
        _agree(all(a < b for a, b in zip([self.head.key, *keys], [*keys, self.tail.key])), "order keys do not grow")
        _agree(set(self.slots) == {id(n) for n in nodes}, "the slot map holds other nodes than the list")
        fresh = RewriteGraph(nodes, self.constants, self.params)
        _agree(self.producer == fresh.producer and all(self.producer[k] is v for k, v in fresh.producer.items()),
               "producers differ from a rebuild")
        _agree(self.users == fresh.users, "use counts differ from a rebuild")
        for name in set(self._readers) | set(fresh._readers):
            mine, theirs = self.readers(name), fresh.readers(name)
            _agree(len(mine) == len(theirs) and all(a is b for a, b in zip(mine, theirs)),
                   f"the readers of {name!r} differ from a rebuild")


class RulesByOp:
    """The rules whose pattern's root can match a node of an op type, in their order: a node is tried against
    those only (a rule for another op cannot match it), without building a ``Match`` for each of the others."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self._by_op: dict[str, list[Rule]] = {}

    def __call__(self, op_type: str) -> list[Rule]:
        chosen = self._by_op.get(op_type)
        if chosen is None:
            chosen = [r for r in self.rules if op_type in r.pattern.op_types or r.pattern.op_types == ("*",)]
            self._by_op[op_type] = chosen
        return chosen


def _agree(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"rewrite engine's graph index: {what}")
