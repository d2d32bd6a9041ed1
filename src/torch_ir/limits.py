"""Resource limits for what a file may ask of the machine.

An IR, a ``.npubin`` program, an ONNX model or a checkpoint's ``config.json`` is untrusted data: a few bytes
can declare a tensor of 10^24 bytes, an arena of a petabyte, a constant that takes minutes to fold, or a
model of 100,000 layers that takes minutes to build even on the meta device. Every allocation or count
whose size comes from a file is checked against these limits *before* it is made, and refused with a
:class:`~torch_ir.errors.LimitExceededError` that names the file, the field, the size and this module.

=========================  =======  ==================================  ===================================
limit                      default  environment variable                what it bounds
=========================  =======  ==================================  ===================================
``max_alloc_bytes``        16 GiB   ``TORCH_IR_MAX_ALLOC_BYTES``        one allocation a file causes: a
                                                                        tensor, an arena, a file read
                                                                        whole, one weight a config makes
``max_fold_bytes``         64 MiB   ``TORCH_IR_MAX_FOLD_BYTES``         one constant made by constant
                                                                        folding
``max_dim``                2^40     ``TORCH_IR_MAX_DIM``                one dimension of any shape; each
                                                                        width a ``config.json`` declares
                                                                        (hidden, vocabulary, heads, ...)
``max_layers``             1024     ``TORCH_IR_MAX_LAYERS``             the layers of the model a
                                                                        ``config.json`` describes
``max_experts``            1024     ``TORCH_IR_MAX_EXPERTS``            the experts per layer of a
                                                                        mixture-of-experts ``config.json``
``max_tokenizer_seconds``  30       ``TORCH_IR_MAX_TOKENIZER_SECONDS``  one call into a checkpoint's
                                                                        tokenizer (loading it, encoding
                                                                        a text)
=========================  =======  ==================================  ===================================

The defaults fit a workstation and every published model (Llama 3.1 405B has 126 layers; DeepSeek-V3
256 experts); raise them for a larger machine, in the environment::

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
    #: Largest size of one dimension anywhere in an IR or program (fits an int64 with room for products), and
    #: of each width a model config declares.
    max_dim: int = 1 << 40
    #: Most layers a model config may declare: a model is built (even on the meta device), traced and compiled
    #: layer by layer, so a 700-byte config of 100,000 layers would take minutes and gigabytes.
    max_layers: int = 1024
    #: Most experts per layer a mixture-of-experts config may declare.
    max_experts: int = 1024
    #: Longest one call into a checkpoint's tokenizer may run (seconds) before it is abandoned as hostile.
    max_tokenizer_seconds: int = 30


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
            raise LimitExceededError(f"environment variable {var}={text!r} is not an integer; "
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


def how_to_raise(name: str) -> str:
    """The sentence an error over the limit ``name`` ends with: how to raise it, for a trusted file."""
    afford = "the time" if name == "max_tokenizer_seconds" else "the memory"
    return (f"if the file is trusted and the machine has {afford}, raise the limit: set {_ENV[name]} or call "
            f"torch_ir.limits.set_limits({name}=...)")


def check_alloc(nbytes: int, what: str) -> int:
    """Refuse an allocation of ``nbytes`` (computed from a file) over ``max_alloc_bytes``; returns ``nbytes``."""
    limit = get_limits().max_alloc_bytes
    if nbytes < 0:
        raise LimitExceededError(f"{what}: negative size {nbytes} bytes")
    if nbytes > limit:
        raise LimitExceededError(f"{what} needs {_human(nbytes)} ({nbytes} bytes), over the {_human(limit)} "
                                 f"limit on one allocation; {how_to_raise('max_alloc_bytes')}")
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
                                     f"dimension; {how_to_raise('max_dim')}")
    return check_alloc(math.prod(dims) * itemsize, what)


def check_count(count: int, limit: str, what: str) -> int:
    """Refuse a count a file declares (layers, experts, a width) over the limit named ``limit``; returns it.

    ``count`` must already be a non-negative integer: the caller knows the field and says what it must be.
    """
    bound = getattr(get_limits(), limit)
    if count > bound:
        raise LimitExceededError(f"{what} is {count}, over the {bound} limit ({limit}); {how_to_raise(limit)}")
    return count


def fold_allowed(nbytes: int) -> bool:
    """Whether constant folding may materialize ``nbytes``; over the limit the value stays a graph node."""
    return 0 <= nbytes <= get_limits().max_fold_bytes


def _human(nbytes: int) -> str:
    from .report.stats import human_bytes  # not at the top: report imports the IR, whose checker imports this

    return human_bytes(nbytes)


__all__ = ["Limits", "check_alloc", "check_count", "check_shape", "fold_allowed", "get_limits", "how_to_raise",
           "limits", "set_limits"]
