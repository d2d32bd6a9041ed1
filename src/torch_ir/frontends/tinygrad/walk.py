"""Walk the UOp graph an output tensor carries: iterative, memoized, never realizing anything.

tinygrad's tensor graph is a DAG of hash-consed ``UOp``s. Only some sources of a UOp carry data:
a movement op's shape arguments arrive as ``STACK``s of ``CONST``s in ``src[1:]`` and a
``BUFFER``'s size as a ``CONST`` source, so the walk follows ``data_sources`` only. Large graphs
(a many-block model) would overflow Python's recursion limit, so the post-order is computed with
an explicit stack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tinygrad.uop.ops import GroupOp, Ops, UOp

#: UOps whose sources are not data: leaves of the walk.
LEAVES = frozenset({Ops.CONST, Ops.BUFFER, Ops.PARAM})


def data_sources(u: UOp) -> tuple[UOp, ...]:
    """The sources of ``u`` that carry tensor data (shape arguments excluded).

    Example: for ``RESHAPE(x, STACK(2, 3))`` this is ``(x,)``.
    """
    if u.op in LEAVES:
        return ()
    if u.op in GroupOp.Movement:
        return (u.src[0],)
    return u.src


def postorder(roots: Iterable[UOp], is_leaf: Callable[[UOp], bool]) -> list[UOp]:
    """Every UOp reachable from ``roots`` through data sources, each once, sources first.

    ``is_leaf(u)`` stops the walk at ``u`` (a graph input or a named weight): its sources are not
    visited. Example::

        order = postorder([out.uop], lambda u: u in inputs)
    """
    order: list[UOp] = []
    done: set[UOp] = set()
    for root in roots:
        stack: list[tuple[UOp, bool]] = [(root, False)]
        while stack:
            u, expanded = stack.pop()
            if u in done:
                continue
            if expanded or is_leaf(u):
                done.add(u)
                order.append(u)
                continue
            stack.append((u, True))
            stack.extend((s, False) for s in reversed(data_sources(u)) if s not in done)
    return order
