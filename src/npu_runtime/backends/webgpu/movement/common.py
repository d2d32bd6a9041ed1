"""What every data-movement kernel shares: its parameters read and checked (a program file is untrusted), the
names of a multi-index, index tensors loaded safely, and the one-invocation-per-output-element shader."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npu_program.program import TensorSpec

from ..wgsl import Call, Shader, UnsupportedCall, move, numel, offset, per_element, shape_of, unravel

#: Index tensor dtypes (bool and uint8 indices are masks, whose result size depends on the data).
INDEX_DTYPES = frozenset({"int64", "int32"})


# -- parameters -------------------------------------------------------------------------------------------

def int_param(call: Call, name: str, default: int | None = None) -> int:
    """Parameter ``name`` as an int (a program file is untrusted: anything else is refused)."""
    value = call.param(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnsupportedCall(f"parameter {name!r} = {value!r} is not an integer")
    return value


def ints_param(call: Call, name: str, default: Sequence[int] = ()) -> list[int]:
    """Parameter ``name`` as a list of ints (a single int is a list of one)."""
    value = call.param(name, list(default))
    values = [value] if isinstance(value, int) else value
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise UnsupportedCall(f"parameter {name!r} = {value!r} is not a list of integers")
    return list(values)


def number(value: Any, name: str) -> float | int:
    """A scalar parameter's value: a number (inf and nan are floats in a loaded program: ``npu_program.params``)."""
    if isinstance(value, (bool, int, float)):
        return value
    raise UnsupportedCall(f"parameter {name!r} = {value!r} is not a number")


def norm_dim(dim: int, rank: int) -> int:
    """A dim in [0, rank) from one in [-rank, rank) (a 0-d tensor takes 0 and -1, as torch's wrap does)."""
    size = max(rank, 1)
    if not -size <= dim < size:
        raise UnsupportedCall(f"dim {dim} is out of range for a tensor of rank {rank}")
    return dim + size if dim < 0 else dim


def indices(n: int, prefix: str = "d") -> list[str]:
    """The names ``unravel`` gives a multi-index of ``n`` dims."""
    return [f"{prefix}{k}" for k in range(n)]


def load_index(call: Call, k: int, off: str, size: int, name: str) -> str:
    """WGSL lines making ``name`` (u32) the index at element ``off`` of input ``k`` along a dim of ``size``:
    a negative index wraps once (torch's rule); what is still outside [0, size) is clamped, so it never reads
    outside the tensor (torch would raise)."""
    spec = call.ins[k]
    if spec.dtype not in INDEX_DTYPES:
        raise UnsupportedCall(f"index input {k} is {spec.dtype}: only int64 and int32 indices are supported "
                              "(a bool mask's result size depends on the data)")
    if spec.dtype == "int32":
        lines = [f"let {name}_raw = ld_in{k}({off});"]
    else:  # int64: an index beyond i32 (its high word not the low one's sign) saturates, then clamps
        lines = [f"let {name}_w = 2u * ({off});",
                 f"let {name}_lo = in{k}[{name}_w];",
                 f"let {name}_hi = in{k}[{name}_w + 1u];",
                 f"let {name}_raw = select({name}_lo, select(i32(2147483647), i32(-2147483647), {name}_hi < 0), "
                 f"{name}_hi != ({name}_lo >> 31u));"]
    lines.append(f"let {name} = u32(clamp(select({name}_raw, {name}_raw + {size}, {name}_raw < 0), 0, "
                 f"{max(size - 1, 0)}));")
    return "\n  ".join(lines)


def per_output(call: Call, lines: Sequence[str]) -> Shader:
    """One invocation per output element: its logical index ``d0``, ``d1``, ... then ``lines``."""
    out = call.outs[0]
    return per_element(call, numel(out), "\n  ".join([unravel("i", shape_of(out)), *lines]))


def copy_from(call: Call, src_idx: Sequence[str], lines: Sequence[str] = ()) -> Shader:
    """Every output element from input 0 at logical indices ``src_idx`` (WGSL u32 expressions of the output's
    ``d0``, ``d1``, ... and of what ``lines`` define)."""
    out = call.outs[0]
    dst = offset(out, indices(len(shape_of(out))))
    return per_output(call, [*lines, move(call, 0, offset(call.ins[0], src_idx), dst)])


def check_shape(spec: TensorSpec, shape: Sequence[int], what: str) -> None:
    """Refuse a tensor whose shape is not what the kernel's other shapes and parameters give (a program file
    is untrusted: every index a kernel computes must stay inside the dims of the tensor it reads)."""
    if shape_of(spec) != list(shape):
        raise UnsupportedCall(f"{what}: {spec.name} is {shape_of(spec)}, the kernel's shapes and parameters give "
                              f"{list(shape)}")


def check_broadcast(spec: TensorSpec, shape: Sequence[int], what: str) -> None:
    """Refuse a tensor that does not broadcast to ``shape`` (numpy rules)."""
    own = shape_of(spec)
    if len(own) > len(shape) or any(d not in (1, s) for d, s in zip(own, shape[len(shape) - len(own):])):
        raise UnsupportedCall(f"{what}: {spec.name} of {own} does not broadcast to {list(shape)}")


def without_dim(shape: Sequence[int], dim: int) -> list[int]:
    return [*shape[:dim], *shape[dim + 1:]]


def with_dim(shape: Sequence[int], dim: int, size: int) -> list[int]:
    return [*shape[:dim], size, *shape[dim + 1:]]
