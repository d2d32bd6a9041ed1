"""An upper-bound program: one program planned for the largest sizes, every dispatch sized at run time.

The ExecuTorch way of serving several shapes: the arena is planned once, for the upper bound of every symbol,
and a run at smaller sizes places each tensor at the offset the plan gave it (it fits: no size grows when a
symbol shrinks, which the compiler checked), with its shape, its kernel parameters (a reshape's sizes, an
attention's length) and its constants (a causal mask, cut to its top-left corner) computed from the bound
symbols. A `Template` records where the program's sizes are expressions of the symbols (``"12*seq"``,
``"batch*seq"``, in the grammar of `torch_ir.ops.symbolic`, never given to ``eval``); `instantiate` makes
the static program for given sizes: plain data, no compiler. The runtime checks every instance with
`npu_program.check.check_program` before running it, like any program.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from torch_ir.dtypes import get_dtype
from torch_ir.errors import TorchIRError
from torch_ir.ops.symbolic import eval_sym

from .program import CompiledProgram, MemoryPlan, TensorSpec


@dataclass
class SymbolicParam:
    """An integer in a dispatch's params that varies: the param's key, then list indices into its value."""

    dispatch: int
    path: list[Any]
    expr: str


@dataclass
class Template:
    """Where the upper-bound program's sizes are expressions of the symbols."""

    # tensor name -> its shape, with an expression where a dimension varies (only tensors whose shape varies)
    shapes: dict[str, list[Any]] = field(default_factory=dict)
    params: list[SymbolicParam] = field(default_factory=list)
    # constants whose shape varies: their data at the upper bound, cut to the actual sizes (the top-left corner)
    constants: list[str] = field(default_factory=list)


class TemplateError(TorchIRError, ValueError):
    """A template that does not fit its program (a damaged or hostile file); the message says where."""


def instantiate(program: CompiledProgram, template: Template, sizes: Mapping[str, int],
                where: str = "upper-bound program") -> CompiledProgram:
    """The static program of ``template`` at ``sizes``: the upper-bound program with its varying shapes, params
    and constants evaluated; the memory plan stays the upper bound's (every tensor fits where it was put)."""
    def size(expr: Any, what: str) -> int:
        if isinstance(expr, int):
            return expr
        value = eval_sym(expr, sizes, f"{where}: {what}")
        if value < 0:
            raise TemplateError(f"{where}: {what} is {expr} = {value} at {dict(sizes)}, a negative size")
        return value

    shapes = {name: [size(d, f"tensor {name!r}") for d in shape] for name, shape in template.shapes.items()}
    missing = sorted(set(shapes) - set(program.tensors))
    if missing:
        raise TemplateError(f"{where}: the template sizes tensors {missing[:5]}, which the program lacks")

    def spec(s: TensorSpec) -> TensorSpec:
        return replace(s, shape=shapes[s.name]) if s.name in shapes else s

    dispatches = [copy.copy(d) for d in program.dispatches]
    for p in template.params:
        if not 0 <= p.dispatch < len(dispatches):
            raise TemplateError(f"{where}: a symbolic param names dispatch {p.dispatch}, which does not exist")
        d = dispatches[p.dispatch]
        d.params = copy.deepcopy(d.params)
        _set(d.params, p.path, size(p.expr, f"dispatch {p.dispatch} param {p.path}"), where)
    constants = dict(program.constants)
    for name in template.constants:
        if name not in constants or name not in shapes:
            raise TemplateError(f"{where}: the template cuts constant {name!r}, which is not a varying constant")
        constants[name] = _corner(constants[name], program.tensors[name], shapes[name], where)
    memory = MemoryPlan(program.memory.arena_bytes, dict(program.memory.offsets), program.memory.no_reuse_bytes,
                        program.memory.alignment, dict(program.memory.aliases))
    return replace(program, input_specs=[spec(s) for s in program.input_specs],
                   output_specs=[spec(s) for s in program.output_specs],
                   tensors={name: spec(s) for name, s in program.tensors.items()}, dispatches=dispatches,
                   memory=memory, constants=constants)


def _set(params: Any, path: list[Any], value: int, where: str) -> None:
    target = params
    for step in path[:-1]:
        target = _step(target, step, path, where)
    last = path[-1] if path else None
    _step(target, last, path, where)  # checks the last step exists and holds an int
    target[last] = value


def _step(value: Any, key: Any, path: list[Any], where: str) -> Any:
    ok = (isinstance(value, dict) and isinstance(key, str) and key in value) or \
         (isinstance(value, list) and isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(value))
    if not ok:
        raise TemplateError(f"{where}: a symbolic param's path {path} does not lead to a value of its dispatch")
    return value[key]


def _corner(data: bytes, spec: TensorSpec, want: list[int], where: str) -> bytes:
    """The top-left corner ``want`` of a constant stored at ``spec.shape`` (row-major)."""
    have = list(spec.shape)
    if len(want) != len(have) or any(w > h for w, h in zip(want, have)):
        raise TemplateError(f"{where}: constant {spec.name!r} of shape {have} cannot be cut to {want}")
    itemsize = get_dtype(spec.dtype).itemsize
    return _rows(bytes(data), have, want, itemsize)


def _rows(data: bytes, have: list[int], want: list[int], itemsize: int) -> bytes:
    if not have:
        return data
    inner = math.prod(have[1:]) * itemsize
    if have[1:] == want[1:]:
        return data[:want[0] * inner]
    return b"".join(_rows(data[i * inner:(i + 1) * inner], have[1:], want[1:], itemsize) for i in range(want[0]))


__all__ = ["SymbolicParam", "Template", "TemplateError", "instantiate"]
