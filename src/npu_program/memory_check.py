"""The memory-plan checker: lifetimes of a dispatch list and an independent check of any arena plan.

Shared by the compiler (``npu_compiler.memory`` plans memory and re-checks its own plan with it) and the
program checker (``npu_program.check`` runs it again on a loaded, untrusted program), so it lives in the
package both import.

* :func:`lifetimes` turns the dispatch list into :class:`Lifetime` intervals (resolving views),
* :func:`check_plan` verifies any plan from scratch, so a planner bug cannot hide behind itself.

Views (``aliases``) get no storage of their own: a view lives at its base's offset, so callers look up
a view's offset as ``offsets[root_of(view)]``, with :func:`resolve_alias` giving the root.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from torch_ir.errors import TorchIRError

__all__ = ["Lifetime", "MemoryPlanError", "align_up", "check_lifetimes", "check_plan", "lifetimes", "resolve_alias"]


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

    Chains (a view of a view) are common after reshape folding; a cycle is a malformed program.
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
    spans: dict[str, list[int]] = {}
    defined_at: dict[str, int] = {}
    for name in live_in:
        root = resolve_alias(name, aliases)
        if root in sizes:
            _touch(spans, root, -1)
            defined_at[root] = -1
    for i, (inputs, outputs) in enumerate(steps):
        for name in outputs:
            root = resolve_alias(name, aliases)
            if root in sizes:
                _touch(spans, root, i)
                defined_at.setdefault(root, i)
        for name in inputs:
            root = resolve_alias(name, aliases)
            if root in sizes:
                _check_defined(name, root, i, defined_at)
                _touch(spans, root, i)
    for name in live_out:
        root = resolve_alias(name, aliases)
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
    tensor only needs comparing with its two neighbours in offset order, so the check is O(n log n).
    Zero-byte tensors occupy nothing and never collide.
    """
    check_lifetimes(lives, alignment)
    for lt in lives:
        _check_placement(lt, offsets, arena_bytes, alignment)
    sized = [lt for lt in lives if lt.nbytes > 0]
    # Inclusive intervals: at equal steps, births (0) are processed before deaths (1).
    events = sorted([(lt.first, 0, lt.name) for lt in sized] + [(lt.last, 1, lt.name) for lt in sized])
    by_name = {lt.name: lt for lt in sized}
    live: list[tuple[int, str]] = []  # (offset, name) of live tensors, sorted
    for _, kind, name in events:
        key = (offsets[name], name)
        if kind == 1:
            del live[bisect.bisect_left(live, key)]
            continue
        pos = bisect.bisect_left(live, key)
        _check_neighbours(by_name[name], live, pos, by_name, offsets)
        live.insert(pos, key)


def _check_neighbours(
    lt: Lifetime, live: list[tuple[int, str]], pos: int, by_name: Mapping[str, Lifetime], offsets: Mapping[str, int]
) -> None:
    """``lt`` (about to be inserted at ``pos``) must not share bytes with the live tensor on either side."""
    off = offsets[lt.name]
    if pos > 0:
        below = by_name[live[pos - 1][1]]
        if live[pos - 1][0] + below.nbytes > off:
            _collision(below, lt, offsets)
    if pos < len(live):
        above = by_name[live[pos][1]]
        if live[pos][0] < off + lt.nbytes:
            _collision(lt, above, offsets)


def _collision(a: Lifetime, b: Lifetime, offsets: Mapping[str, int]) -> None:
    raise MemoryPlanError(
        f"tensors {_describe(a, offsets[a.name])} and {_describe(b, offsets[b.name])} are live at the same "
        "step and share bytes"
    )
