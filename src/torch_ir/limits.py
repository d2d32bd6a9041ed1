"""Resource limits for what a file may ask of the machine.

An IR, a ``.npubin`` program or an ONNX model is untrusted data: a few bytes can declare a tensor of
10^24 bytes, an arena of a petabyte, or a constant that takes minutes to fold. Every allocation whose
size comes from a file is checked against these limits *before* it is made, and refused with a
:class:`~torch_ir.errors.LimitExceededError` that names the file, the field, the size and this module.

The defaults fit a workstation; raise them for a larger machine, in the environment::

    TORCH_IR_MAX_ALLOC_BYTES=68719476736 torch-ir run big.npubin --weights big.safetensors

or in Python, for the whole process or for a block::

    torch_ir.limits.set_limits(max_alloc_bytes=64 << 30)
    with torch_ir.limits.limits(max_fold_bytes=1 << 30):
        ir = import_onnx("model.onnx")
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, replace

from .errors import LimitExceededError

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """The limits in force; see the module docstring for how to change them."""

    #: Largest single allocation a file may cause: one tensor, an activation arena, a random input.
    max_alloc_bytes: int = 16 * GiB
    #: Largest constant that constant folding (ONNX ``ConstantOfShape``, ``Range``, ...) may materialize;
    #: a larger one stays a graph node.
    max_fold_bytes: int = 64 * MiB
    #: Largest size of one dimension anywhere in an IR or program (fits an int64 with room for products).
    max_dim: int = 1 << 40


_ENV = {f.name: f"TORCH_IR_{f.name.upper()}" for f in fields(Limits)}


def _from_env() -> Limits:
    values = {}
    for name, var in _ENV.items():
        text = os.environ.get(var)
        if text is None:
            continue
        try:
            values[name] = int(text.replace("_", ""))
        except ValueError:
            raise LimitExceededError(f"environment variable {var}={text!r} is not an integer number of bytes; "
                                     f"write e.g. {var}={getattr(Limits(), name)}") from None
    return Limits(**values)


_current: Limits | None = None


def get_limits() -> Limits:
    """The limits in force (defaults, overridden by ``TORCH_IR_*`` environment variables, then by code)."""
    global _current
    if _current is None:
        _current = _from_env()
    return _current


def set_limits(**changes: int) -> Limits:
    """Change limits for the rest of the process; returns the previous ones."""
    global _current
    previous = get_limits()
    _current = replace(previous, **changes)
    return previous


@contextlib.contextmanager
def limits(**changes: int) -> Iterator[Limits]:
    """Change limits inside a ``with`` block only."""
    global _current
    previous = set_limits(**changes)
    try:
        yield get_limits()
    finally:
        _current = previous


def _how_to_raise(name: str) -> str:
    return (f"if the file is trusted and the machine has the memory, raise the limit: set {_ENV[name]} or call "
            f"torch_ir.limits.set_limits({name}=...)")


def check_alloc(nbytes: int, what: str) -> int:
    """Refuse an allocation of ``nbytes`` (computed from a file) over ``max_alloc_bytes``; returns ``nbytes``."""
    limit = get_limits().max_alloc_bytes
    if nbytes < 0:
        raise LimitExceededError(f"{what}: negative size {nbytes} bytes")
    if nbytes > limit:
        raise LimitExceededError(f"{what} needs {_human(nbytes)} ({nbytes} bytes), over the {_human(limit)} "
                                 f"limit on one allocation; {_how_to_raise('max_alloc_bytes')}")
    return nbytes


def check_shape(shape: Iterable[int], itemsize: int, what: str) -> int:
    """Check each dimension and the total size of a tensor a file declares; returns its byte count."""
    dims = list(shape)
    max_dim = get_limits().max_dim
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise LimitExceededError(f"{what}: dimension {d!r} of shape {dims} is not a non-negative integer")
        if d > max_dim:
            raise LimitExceededError(f"{what}: dimension {d} of shape {dims} is over the {max_dim} limit on one "
                                     f"dimension; {_how_to_raise('max_dim')}")
    return check_alloc(math.prod(dims) * itemsize, what)


def fold_allowed(nbytes: int) -> bool:
    """Whether constant folding may materialize ``nbytes``; over the limit the value stays a graph node."""
    return 0 <= nbytes <= get_limits().max_fold_bytes


def _human(nbytes: int) -> str:
    from .report.stats import human_bytes  # not at the top: report imports the IR, whose checker imports this

    return human_bytes(nbytes)


__all__ = ["Limits", "check_alloc", "check_shape", "fold_allowed", "get_limits", "limits", "set_limits"]
