"""The ATen ops a file may run: a reviewed allow-list, not a deny-list.

An IR node or a program's host dispatch names its op by a string from an untrusted file. A registered
implementation (our NPU ops, the ONNX custom ops, your own ``@register_op``) runs as registered. An op of
torch's ``aten`` or ``prims`` namespaces runs only when it is on :data:`ALLOWLIST_FILE`
(``allowed_ops.txt`` beside this module), one overload a line:

- ``aten.add.Tensor``: allowed as it is (its kernel checks its own index, size and shape arguments);
- ``aten.empty.memory_format  guard zeroed``: allowed behind a check of :mod:`torch_ir.ops.guards` that makes it
  memory-safe for any arguments (indices validated against what they index, views against their storage, no
  uninitialized outputs);
- ``aten.max_pool2d_with_indices_backward.default  refuse <reason>``: reviewed and refused.

The list holds the ops the frontends emit (torch.export of every OpInfo sample that exports, the ONNX and
tinygrad importers, the passes and the tests) and the other functional overloads of the same ops. Every
allowed op is run with hostile index, size, stride and shape arguments by ``tests/security/test_op_fuzz.py``
in child processes: a clean error or a result, never a signal. An op not on the list is refused by name; a
torch release that adds an overload to a listed op fails ``tests/security/test_allowlist.py`` until the new
overload has a line (allowed, guarded or refused).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from .guards import GUARDS, Guard

ALLOWLIST_FILE = Path(__file__).with_name("allowed_ops.txt")
#: Namespaces whose ops must be on the list. Other torch namespaces are refused outright
#: (``registry.DENIED_NAMESPACES``); a namespace your own ``torch.library`` code defines runs as you wrote it.
LISTED_NAMESPACES = ("aten", "prims")


@dataclass(frozen=True)
class Review:
    """One line of the list: an op overload, allowed (with its guard, if any) or refused with the reason."""

    op_type: str
    guard: str | None = None
    refused: str | None = None

    @property
    def allowed(self) -> bool:
        return self.refused is None


@functools.cache
def reviews() -> dict[str, Review]:
    """Every reviewed overload (allowed, guarded or refused) by op type, as the list file says."""
    table: dict[str, Review] = {}
    for number, raw in enumerate(ALLOWLIST_FILE.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        op_type, _, rest = line.partition(" ")
        verb, _, detail = rest.strip().partition(" ")
        if verb == "guard" and detail.strip() in GUARDS:
            table[op_type] = Review(op_type, guard=detail.strip())
        elif verb == "refuse" and detail.strip():
            table[op_type] = Review(op_type, refused=detail.strip())
        elif not verb:
            table[op_type] = Review(op_type)
        else:  # our own file: a typo here is a bug, not bad input
            raise ValueError(f"{ALLOWLIST_FILE.name}:{number}: cannot read {raw!r}")
    return table


def refusal(op_type: str) -> str | None:
    """Why an op of a listed namespace may not run from a file (None: it may)."""
    review = reviews().get(op_type)
    if review is None:
        return ("it is not on the reviewed allow-list of ops a file may run (torch_ir/ops/allowed_ops.txt, "
                "docs/security.md)")
    return None if review.allowed else f"it was reviewed and refused: {review.refused}"


def guard_of(op_type: str) -> Guard | None:
    """The check that makes ``op_type`` safe for any arguments (None: its kernel checks them itself)."""
    review = reviews().get(op_type)
    return GUARDS[review.guard] if review is not None and review.guard else None


def allowed_ops() -> list[str]:
    return sorted(op for op, r in reviews().items() if r.allowed)


__all__ = ["ALLOWLIST_FILE", "LISTED_NAMESPACES", "Review", "allowed_ops", "guard_of", "refusal", "reviews"]
