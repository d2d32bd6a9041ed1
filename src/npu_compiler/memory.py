"""Static memory planning: give every intermediate tensor of a compiled program an offset in one arena.

A compiled program is a fixed sequence of kernel dispatches, so the step at which each tensor is
produced and last read is known ahead of time.  Two tensors that are never live at the same step can
share bytes; the planner packs them into one arena, which the runtime allocates once.  This keeps the
device footprint close to the true peak instead of the sum of all activations.

The module has three independent parts:

* :func:`lifetimes` turns the dispatch list into :class:`Lifetime` intervals (resolving views),
* :func:`plan_memory` assigns offsets ("greedy_by_size", as in TFLite, or "naive" for comparison),
* :func:`check_plan` verifies any plan from scratch, so a planner bug cannot hide behind itself.

:func:`lifetimes` and :func:`check_plan` (with :func:`resolve_alias`) live in ``npu_program.memory_check``,
shared with the program checker that the runtime runs; they are re-exported here.

Views (``aliases``) get no storage of their own: a view lives at its base's offset, so callers look up
a view's offset as ``offsets[root_of(view)]``, with :func:`resolve_alias` giving the root.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from npu_program.memory_check import (
    Lifetime,
    MemoryPlanError,
    align_up,
    check_lifetimes,
    check_plan,
    lifetimes,
    resolve_alias,
)
from npu_program.program import Dispatch, MemoryPlan, bind_outputs
from torch_ir.limits import check_alloc

__all__ = [
    "Lifetime",
    "MemoryPlanError",
    "MemoryReport",
    "STRATEGIES",
    "check_plan",
    "lifetimes",
    "memory_report",
    "no_reuse_bytes",
    "plan_arena",
    "plan_memory",
    "resolve_alias",
]

STRATEGIES = ("greedy_by_size", "naive")


# ---------------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------------


def plan_arena(dispatches: Sequence[Dispatch], sizes: dict[str, int], inputs: Sequence[str], outputs: Sequence[str],
               aliases: dict[str, str], *, alignment: int, strategy: str, where: str) -> MemoryPlan:
    """The activation arena of a program: lifetimes, offsets, the independent overlap check, the allocation limit.
    The bind-time dispatches' outputs are computed once and read by every run, so they are live throughout."""
    pinned = bind_outputs(list(dispatches))
    lives = lifetimes([(d.inputs, d.outputs) for d in dispatches], sizes, live_in=[*inputs, *pinned],
                      live_out=[*outputs, *pinned], aliases=aliases)
    offsets, arena = plan_memory(lives, alignment=alignment, strategy=strategy)
    check_plan(lives, offsets, arena, alignment=alignment)
    check_alloc(arena, f"{where}: the activation arena")
    return MemoryPlan(arena, offsets, no_reuse_bytes(lives, alignment), alignment, dict(aliases))


def no_reuse_bytes(lives: Sequence[Lifetime], alignment: int = 64) -> int:
    """Arena size if no two tensors shared bytes: the baseline the planner's savings are measured against."""
    return sum(align_up(lt.nbytes, alignment) for lt in lives)


def plan_memory(
    lives: Sequence[Lifetime], *, alignment: int = 64, strategy: str = "greedy_by_size"
) -> tuple[dict[str, int], int]:
    """Assign each tensor an aligned byte offset in one arena; returns ``(offset by name, arena_bytes)``.

    ``"greedy_by_size"`` places the largest tensors first (ties by first use, then name, so the plan is
    deterministic), each at the lowest aligned offset that does not collide with an already-placed
    tensor live at a common step.  Big tensors placed first leave small gaps that small tensors fill,
    which is why TFLite uses it.  ``"naive"`` gives every tensor its own bytes, for comparison.
    Zero-byte tensors get offset 0 and occupy nothing.  ``arena_bytes`` is a multiple of ``alignment``.
    """
    check_lifetimes(lives, alignment)
    if strategy == "naive":
        offsets = _plan_naive(lives, alignment)
    elif strategy == "greedy_by_size":
        offsets = _plan_greedy_by_size(lives, alignment)
    else:
        raise MemoryPlanError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    end = max((offsets[lt.name] + lt.nbytes for lt in lives), default=0)
    return offsets, align_up(end, alignment)


def _plan_naive(lives: Sequence[Lifetime], alignment: int) -> dict[str, int]:
    """Back-to-back placement in the given order: no reuse at all."""
    offsets: dict[str, int] = {}
    cursor = 0
    for lt in lives:
        offsets[lt.name] = cursor if lt.nbytes else 0
        cursor += align_up(lt.nbytes, alignment)
    return offsets


class _LiveIndex:
    """The placed tensors, indexed by lifetime, so a query returns only those overlapping in time.

    A lifetime [f, l] intersects [F, L] iff it contains step F, or it starts inside (F, L].  The first
    case is a stabbing query on a segment tree over steps (each interval is stored in O(log S) disjoint
    canonical nodes, so at most once on a root-to-leaf path); the second is a range of a list sorted by
    first step.  Both cost O(log) plus the size of the answer, which keeps the planner far from O(n^2)
    when lifetimes are short, as in long chains.
    """

    def __init__(self, lo: int, hi: int) -> None:
        self._base = lo  # step ``lo`` maps to leaf 0
        self._size = 1
        while self._size < hi - lo + 1:
            self._size *= 2
        self._nodes: list[list[Lifetime]] = [[] for _ in range(2 * self._size)]
        self._by_first: list[tuple[int, int]] = []  # (first, serial), kept sorted
        self._placed: list[Lifetime] = []

    def add(self, lt: Lifetime) -> None:
        """Record a placed tensor."""
        serial = len(self._placed)
        self._placed.append(lt)
        bisect.insort(self._by_first, (lt.first, serial))
        lo = lt.first - self._base + self._size
        hi = lt.last - self._base + 1 + self._size
        while lo < hi:
            if lo & 1:
                self._nodes[lo].append(lt)
                lo += 1
            if hi & 1:
                hi -= 1
                self._nodes[hi].append(lt)
            lo >>= 1
            hi >>= 1

    def overlapping(self, lt: Lifetime) -> list[Lifetime]:
        """Placed tensors whose lifetime intersects ``lt``'s."""
        found: list[Lifetime] = []
        pos = lt.first - self._base + self._size
        while pos >= 1:
            found.extend(self._nodes[pos])
            pos >>= 1
        start = bisect.bisect_right(self._by_first, (lt.first, len(self._placed)))
        stop = bisect.bisect_right(self._by_first, (lt.last, len(self._placed)))
        found.extend(self._placed[serial] for _, serial in self._by_first[start:stop])
        return found


def _lowest_fit(size: int, busy: list[tuple[int, int]], alignment: int) -> int:
    """Lowest aligned offset where ``size`` bytes avoid every ``(start, end)`` range in ``busy``."""
    candidate = 0
    for start, end in sorted(busy):
        if candidate + size <= start:
            break  # fits in the gap below ``start``; every later range starts even higher
        candidate = max(candidate, align_up(end, alignment))
    return candidate


def _plan_greedy_by_size(lives: Sequence[Lifetime], alignment: int) -> dict[str, int]:
    """TFLite-style greedy by size (see :func:`plan_memory`)."""
    offsets = {lt.name: 0 for lt in lives if lt.nbytes == 0}
    sized = [lt for lt in lives if lt.nbytes > 0]
    if not sized:
        return offsets
    index = _LiveIndex(min(lt.first for lt in sized), max(lt.last for lt in sized))
    for lt in sorted(sized, key=lambda t: (-t.nbytes, t.first, t.name)):
        busy = [(offsets[o.name], offsets[o.name] + o.nbytes) for o in index.overlapping(lt)]
        offsets[lt.name] = _lowest_fit(lt.nbytes, busy, alignment)
        index.add(lt)
    return offsets


# ---------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryReport:
    """How much the plan saves over giving every tensor its own bytes."""

    arena_bytes: int
    no_reuse_bytes: int
    num_tensors: int = 0

    @property
    def ratio(self) -> float:
        """arena / no-reuse bytes: 1.0 means no saving (also for an empty program)."""
        return self.arena_bytes / self.no_reuse_bytes if self.no_reuse_bytes else 1.0

    def __str__(self) -> str:
        return (
            f"arena {_human(self.arena_bytes)} for {self.num_tensors} tensors vs {_human(self.no_reuse_bytes)} "
            f"without reuse ({self.ratio:.1%})"
        )


def _human(n: int) -> str:
    """Bytes with a binary unit, for one-line reports."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def memory_report(lives: Sequence[Lifetime], arena_bytes: int, *, alignment: int = 64) -> MemoryReport:
    """Summarise a plan's arena size against the no-reuse baseline."""
    return MemoryReport(arena_bytes, no_reuse_bytes(lives, alignment), len(lives))
