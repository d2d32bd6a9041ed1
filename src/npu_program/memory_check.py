"""The memory-plan checker: lifetimes of a dispatch list and an independent check of any arena plan.

Shared by the compiler (``npu_compiler.memory`` plans memory and re-checks its own plan with it) and the
program checker (``npu_program.check`` runs it again on a loaded, untrusted program), so it lives in the
package both import.

* :func:`lifetimes` turns the dispatch list into :class:`Lifetime` intervals (resolving views),
* :func:`check_plan` verifies any plan from scratch, so a planner bug cannot hide behind itself.

Views (``aliases``) get no storage of their own: a view lives at its base's offset, so callers look up
a view's offset as ``offsets[root_of(view)]``. :func:`alias_roots` gives the root of every view at once,
in time linear in the number of views; :func:`resolve_alias` gives one view's root (it walks the chain,
so calling it for every view of a long chain is quadratic: a file can hold such a chain).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from torch_ir.errors import TorchIRError

__all__ = ["Lifetime", "MemoryPlanError", "alias_roots", "align_up", "check_lifetimes", "check_plan", "lifetimes",
           "resolve_alias"]


class MemoryPlanError(TorchIRError, ValueError):
    """A memory plan (or its input) is invalid: two live tensors share bytes, or a tensor is misplaced."""


@dataclass(frozen=True)
class Lifetime:
    """The steps during which a tensor's bytes must stay intact.

    ``first`` is the index of the step that defines the tensor (-1 for values live on entry, such as
    graph inputs); ``last`` is the index of the last step that reads it (``len(steps)`` for values that
    must survive the program, such as graph outputs).  The interval ``[first, last]`` is inclusive on
    both ends because a step reads its inputs and writes its outputs at the same time: an input and an
    output of the same dispatch must not share bytes.
    """

    name: str
    nbytes: int
    first: int
    last: int

    def overlaps(self, other: Lifetime) -> bool:
        """Whether the two tensors are live at some common step (and so cannot share bytes)."""
        return self.first <= other.last and other.first <= self.last


def resolve_alias(name: str, aliases: Mapping[str, str] | None) -> str:
    """The root base of ``name``: follows view -> base links until a tensor that owns its storage.

    Chains (a view of a view) are common after reshape folding; a cycle is a malformed program. This walks
    the whole chain: to resolve many names, call :func:`alias_roots` once instead.
    """
    if not aliases:
        return name
    seen = {name}
    while name in aliases:
        name = aliases[name]
        if name in seen:
            raise MemoryPlanError(f"alias cycle through {name!r}")
        seen.add(name)
    return name


def alias_roots(aliases: Mapping[str, str] | None) -> dict[str, str]:
    """The root base of every view of ``aliases`` (view -> base), in time linear in its size.

    Each walk down a chain stops at the first view already resolved, and gives its root to every view it
    passed (path compression), so every link is followed once: a chain of n views costs n steps, where
    resolving each view on its own costs n^2 / 2 (a 100,000-long chain, an 8 MB file: over ten minutes).
    Names that are not views are absent: look a name up as ``roots.get(name, name)``.
    Raises :class:`MemoryPlanError` for a cycle.
    """
    roots: dict[str, str] = {}
    for start in aliases or ():
        if start not in roots:
            _resolve_chain(start, aliases, roots)
    return roots


def _resolve_chain(start: str, aliases: Mapping[str, str], roots: dict[str, str]) -> None:
    """Walk from ``start`` to its root (or to a view already in ``roots``); record the root of every view passed."""
    path: dict[str, None] = {}  # the views of this walk, in order (a dict: O(1) membership for the cycle check)
    name = start
    while name in aliases and name not in roots:
        if name in path:
            raise MemoryPlanError(f"alias cycle through {name!r}")
        path[name] = None
        name = aliases[name]
    root = roots.get(name, name)
    for view in path:
        roots[view] = root


def _touch(spans: dict[str, list[int]], name: str, step: int) -> None:
    """Widen ``name``'s [first, last] span to include ``step``."""
    span = spans.get(name)
    if span is None:
        spans[name] = [step, step]
    else:
        span[0] = min(span[0], step)
        span[1] = max(span[1], step)


def lifetimes(
    steps: Sequence[tuple[Sequence[str], Sequence[str]]],
    sizes: Mapping[str, int],
    *,
    live_in: Iterable[str] = (),
    live_out: Iterable[str] = (),
    aliases: Mapping[str, str] | None = None,
) -> list[Lifetime]:
    """Lifetime of every tensor that needs arena storage, in order of first use (ties by name).

    ``steps`` is the ordered list of ``(inputs, outputs)`` names of each dispatch.  Only tensors named in
    ``sizes`` get storage: weights and constants live elsewhere and are ignored.  A view in ``aliases``
    gets no lifetime of its own; every use of it extends its root base instead, because the view's
    bytes *are* the base's bytes.  A tensor written but never read still occupies its defining step.

    Raises :class:`MemoryPlanError` for a tensor read before any step defines it that is not
    ``live_in``: it would be read from uninitialised memory.
    """
    roots = alias_roots(aliases)  # once: resolving each use on its own is quadratic in a chain's length
    spans: dict[str, list[int]] = {}
    defined_at: dict[str, int] = {}
    for name in live_in:
        root = roots.get(name, name)
        if root in sizes:
            _touch(spans, root, -1)
            defined_at[root] = -1
    for i, (inputs, outputs) in enumerate(steps):
        for name in outputs:
            root = roots.get(name, name)
            if root in sizes:
                _touch(spans, root, i)
                defined_at.setdefault(root, i)
        for name in inputs:
            root = roots.get(name, name)
            if root in sizes:
                _check_defined(name, root, i, defined_at)
                _touch(spans, root, i)
    for name in live_out:
        root = roots.get(name, name)
        if root in sizes:
            _touch(spans, root, len(steps))
    lives = [Lifetime(name, int(sizes[name]), span[0], span[1]) for name, span in spans.items()]
    return sorted(lives, key=lambda lt: (lt.first, lt.name))


def _check_defined(name: str, root: str, step: int, defined_at: Mapping[str, int]) -> None:
    """Reject a read of a tensor that no earlier step (nor the caller, via live_in) has written."""
    if defined_at.get(root, step + 1) > step:
        via = f" (view of {root!r})" if root != name else ""
        raise MemoryPlanError(
            f"{name!r}{via} is read at step {step} before any step defines it; pass it in live_in if it is an input"
        )


def align_up(n: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` that is >= ``n``."""
    return -(-n // alignment) * alignment


def check_lifetimes(lives: Sequence[Lifetime], alignment: int) -> None:
    """Reject inputs that no plan could be correct for (duplicate names, negative sizes, bad alignment)."""
    if not isinstance(alignment, int) or alignment <= 0:
        raise MemoryPlanError(f"alignment must be a positive int, got {alignment!r}")
    seen: set[str] = set()
    for lt in lives:
        if lt.name in seen:
            raise MemoryPlanError(f"tensor {lt.name!r} has more than one lifetime")
        if lt.nbytes < 0:
            raise MemoryPlanError(f"tensor {lt.name!r} has negative size {lt.nbytes}")
        if lt.first > lt.last:
            raise MemoryPlanError(f"tensor {lt.name!r} has an empty lifetime [{lt.first}, {lt.last}]")
        seen.add(lt.name)


def _describe(lt: Lifetime, offset: int) -> str:
    return f"{lt.name!r} (steps [{lt.first}, {lt.last}], bytes [{offset}, {offset + lt.nbytes}))"


def _check_placement(lt: Lifetime, offsets: Mapping[str, int], arena_bytes: int, alignment: int) -> None:
    """One tensor on its own: it has an offset, aligned, and lies inside the arena."""
    if lt.name not in offsets:
        raise MemoryPlanError(f"tensor {lt.name!r} has no offset")
    off = offsets[lt.name]
    if not isinstance(off, int) or off < 0:
        raise MemoryPlanError(f"tensor {lt.name!r} has invalid offset {off!r}")
    if off % alignment:
        raise MemoryPlanError(f"tensor {_describe(lt, off)} is not aligned to {alignment}")
    if off + lt.nbytes > arena_bytes:
        raise MemoryPlanError(f"tensor {_describe(lt, off)} lies outside the arena of {arena_bytes} bytes")


def check_plan(lives: Sequence[Lifetime], offsets: Mapping[str, int], arena_bytes: int, *, alignment: int = 64) -> None:
    """Verify a plan from scratch; raises :class:`MemoryPlanError` naming the first fault.

    Independent of :func:`plan_memory` on purpose: a sweep over steps keeps the tensors live at the
    current step sorted by offset.  Because that set is already known to be disjoint, a newly live
    tensor only needs comparing with its two neighbours in offset order, so the check is O(n log n)
    (with :class:`_SortedKeys`, also when a file makes 10^5 tensors live at once).
    Zero-byte tensors occupy nothing and never collide.
    """
    check_lifetimes(lives, alignment)
    for lt in lives:
        _check_placement(lt, offsets, arena_bytes, alignment)
    sized = [lt for lt in lives if lt.nbytes > 0]
    # Inclusive intervals: at equal steps, births (0) are processed before deaths (1).
    events = sorted([(lt.first, 0, lt.name) for lt in sized] + [(lt.last, 1, lt.name) for lt in sized])
    by_name = {lt.name: lt for lt in sized}
    live = _SortedKeys()  # (offset, name) of live tensors
    for _, kind, name in events:
        key = (offsets[name], name)
        if kind == 1:
            live.remove(key)
            continue
        below, above = live.neighbours(key)
        _check_neighbours(by_name[name], below, above, by_name, offsets)
        live.add(key)


_Key = tuple[int, str]


class _SortedKeys:
    """A sorted set of keys in buckets of at most ``2 * BUCKET``: add, remove and neighbours in O(log n + BUCKET).

    A plain sorted list moves every key after the one it inserts or deletes, which is quadratic when a file
    makes 10^5 tensors live at once (3 s; 3 * 10^5: 17 s); a bucket's moves are bounded.
    """

    BUCKET = 512

    def __init__(self) -> None:
        self.buckets: list[list[_Key]] = []
        self.firsts: list[_Key] = []  # the first key of each bucket, to find a key's bucket by bisection

    def _bucket_of(self, key: _Key) -> int:
        """Index of the bucket ``key`` belongs in (-1: before every bucket)."""
        return bisect.bisect_right(self.firsts, key) - 1

    def neighbours(self, key: _Key) -> tuple[_Key | None, _Key | None]:
        """The greatest key below ``key`` and the least key above it (``key`` itself absent), None where none."""
        i = self._bucket_of(key)
        if i < 0:
            return None, (self.firsts[0] if self.firsts else None)
        bucket = self.buckets[i]
        j = bisect.bisect_left(bucket, key)  # >= 1: bucket[0] <= key, and key is absent
        if j < len(bucket):
            return bucket[j - 1], bucket[j]
        return bucket[j - 1], (self.firsts[i + 1] if i + 1 < len(self.firsts) else None)

    def add(self, key: _Key) -> None:
        if not self.buckets:
            self.buckets, self.firsts = [[key]], [key]
            return
        i = max(self._bucket_of(key), 0)
        bucket = self.buckets[i]
        bisect.insort(bucket, key)
        self.firsts[i] = bucket[0]
        if len(bucket) > 2 * self.BUCKET:  # split, so that a bucket's inserts stay cheap
            half = bucket[self.BUCKET:]
            del bucket[self.BUCKET:]
            self.buckets.insert(i + 1, half)
            self.firsts.insert(i + 1, half[0])

    def remove(self, key: _Key) -> None:
        i = self._bucket_of(key)
        bucket = self.buckets[i]
        del bucket[bisect.bisect_left(bucket, key)]
        if bucket:
            self.firsts[i] = bucket[0]
        else:
            del self.buckets[i], self.firsts[i]


def _check_neighbours(lt: Lifetime, below: _Key | None, above: _Key | None, by_name: Mapping[str, Lifetime],
                      offsets: Mapping[str, int]) -> None:
    """``lt`` (about to become live) must not share bytes with the live tensor on either side of it."""
    off = offsets[lt.name]
    if below is not None and below[0] + by_name[below[1]].nbytes > off:
        _collision(by_name[below[1]], lt, offsets)
    if above is not None and above[0] < off + lt.nbytes:
        _collision(lt, by_name[above[1]], offsets)


def _collision(a: Lifetime, b: Lifetime, offsets: Mapping[str, int]) -> None:
    raise MemoryPlanError(
        f"tensors {_describe(a, offsets[a.name])} and {_describe(b, offsets[b.name])} are live at the same "
        "step and share bytes"
    )
