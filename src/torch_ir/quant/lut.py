"""A quantized elementwise chain as a table over the codes: the numerics of ``QLUT``.

A QDQ graph leaves each float elementwise op between a DEQUANTIZE and a QUANTIZE: a QDQ BERT's GELU is four such
chains (``erf(x · 0.7071)``, ``+ 1``, a product, ``· 0.5``), its attention scale a fifth, and each runs three float
passes over its tensor. When the input is 8-bit codes with one scale and zero point, such a chain maps each of the
256 codes to one output code, so it is a table: ``y = table[x]``, one byte read per element. That is how NPUs run
nonlinear functions on int8 (a lookup table beside the MAC array), and it is exact: the table holds the chain's own
float32 results (dequantize, the steps in order, quantize), computed once for all codes.

The steps come from a file, so they are names from :data:`STEPS`, a closed table, never an op the file names:

* ``mul``, ``add``, ``sub``, ``div`` take one number (the ATen op's scalar ``other``), as torch applies it to a
  float32 tensor: the number rounded to float32, one correctly rounded operation;
* ``erf``, ``tanh``, ``sigmoid``, ``exp``, ``neg``, ``abs``, ``sqrt``, ``rsqrt``, ``reciprocal`` take none;
* every activation of :mod:`torch_ir.activations` (``relu``, ``relu6``, ``silu``, ``gelu``, ``gelu_tanh``), by
  its row's reference.

A step is applied to the 256 dequantized codes as one float32 tensor, by the same torch function the chain's ATen
op runs. torch computes some functions (``sigmoid``, ``gelu``) on a vector path and a scalar path that can differ
in the last bit, and a chain over a tensor takes the scalar path for the elements past its last full vector (which
elements those are depends on the tensor's size and the thread count); the table takes the vector path for every
code, so QLUT's result is one fixed function of the code, the chain's up to torch's own last-bit differences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..activations import ACTIVATIONS, activation_of
from . import numerics as qn

#: The code types a table covers (256 entries, indexed by the code's byte).
CODES = ("int8", "uint8")


@dataclass(frozen=True)
class Step:
    """One function of the chain: ``fn(x, number)``; ``aten``: the ATen op types it is read from."""

    name: str
    fn: Callable[[torch.Tensor, float | None], torch.Tensor]
    aten: tuple[str, ...]
    takes_number: bool = False


def _arith(name: str, fn: Callable[[torch.Tensor, float], torch.Tensor]) -> Step:
    return Step(name, fn, (f"aten.{name}.Tensor", f"aten.{name}.Scalar"), takes_number=True)


def _unary(name: str) -> Step:
    method = getattr(torch.Tensor, name)
    return Step(name, lambda x, _: method(x), (f"aten.{name}.default",))


def _activation(name: str) -> Step:
    reference = ACTIVATIONS[name].reference
    return Step(name, lambda x, _: reference(x), tuple(f.op_type for f in ACTIVATIONS[name].aten))


#: Step name -> its row (module docstring). Adding a step is adding a row: its ATen forms, its torch function.
STEPS: dict[str, Step] = {s.name: s for s in [
    _arith("mul", torch.mul), _arith("add", torch.add), _arith("sub", torch.sub), _arith("div", torch.div),
    *(_unary(n) for n in ("erf", "tanh", "sigmoid", "exp", "neg", "abs", "sqrt", "rsqrt", "reciprocal")),
    *(_activation(n) for n in ACTIVATIONS)]}
#: Every ATen op type some step is read from (the fusion rule's pattern).
STEP_OPS: tuple[str, ...] = tuple(dict.fromkeys(op for s in STEPS.values() for op in s.aten))


def step_of(op_type: str, attrs: Mapping[str, Any]) -> tuple[str, float | None] | None:
    """The step an ATen node of one tensor input computes, with its number: ``aten.mul.Tensor`` with
    ``other=0.25`` is ``("mul", 0.25)``; None when it is no step (a tensor ``other``, ``alpha`` other than 1, a
    ``rounding_mode``, an activation's attributes another row's)."""
    name = activation_of(op_type, attrs)
    if name is not None:
        return name, None
    step = next((s for s in STEPS.values() if op_type in s.aten and s.name not in ACTIVATIONS), None)
    if step is None:
        return None
    if not step.takes_number:
        return (step.name, None) if not attrs else None
    other, rest = attrs.get("other"), {k: v for k, v in attrs.items() if k != "other"}
    if isinstance(other, bool) or not isinstance(other, (int, float)):
        return None
    if rest.get("alpha", 1) != 1 or rest.get("rounding_mode") is not None or set(rest) - {"alpha", "rounding_mode"}:
        return None
    return step.name, float(other)


def check_steps(functions: str, numbers: Sequence[float], where: str = "QLUT") -> list[tuple[Step, float | None]]:
    """The steps of ``functions`` (names separated by spaces) with their numbers (one per step that takes one, in
    order), or a ValueError naming what is wrong: the attributes come from a file."""
    if not isinstance(functions, str) or not functions.split():
        raise ValueError(f"{where}: functions={functions!r} names no step; give step names separated by spaces "
                         f"(from {', '.join(STEPS)})")
    names = functions.split()
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        raise ValueError(f"{where}: unknown step(s) {', '.join(map(repr, unknown))} in functions={functions!r}; "
                         f"the steps are {', '.join(STEPS)}")
    wanted = sum(STEPS[n].takes_number for n in names)
    numbers = list(numbers or [])
    if len(numbers) != wanted or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers):
        raise ValueError(f"{where}: functions={functions!r} takes {wanted} number(s) (one per "
                         f"{'/'.join(n for n, s in STEPS.items() if s.takes_number)}), got numbers={numbers!r}")
    it = iter(numbers)
    return [(STEPS[n], float(next(it)) if STEPS[n].takes_number else None) for n in names]


def apply_steps(x: torch.Tensor, steps: Sequence[tuple[Step, float | None]]) -> torch.Tensor:
    """``x`` (float32) through the steps in order, each as torch computes it."""
    for step, number in steps:
        x = step.fn(x, number)
    return x


def table(x_dtype: str, x_scale: torch.Tensor, x_zero_point: torch.Tensor | None, y_scale: torch.Tensor,
          y_zero_point: torch.Tensor | None, *, functions: str, numbers: Sequence[float], out_dtype: str,
          method: str = "divide") -> torch.Tensor:
    """The 256 output codes (``out_dtype``) indexed by the input code's byte (an int8 code -1 is entry 255):
    ``quantize(steps(dequantize(code)))`` with the QUANTIZE's ``method``, per-tensor scales and zero points."""
    for dtype, what in ((x_dtype, "x"), (out_dtype, "out_dtype")):
        if dtype not in CODES:
            raise ValueError(f"QLUT: {what} is {dtype}; a table covers {' and '.join(CODES)} codes only")
    for t, what in ((x_scale, "x_scale"), (x_zero_point, "x_zero_point"), (y_scale, "y_scale"),
                    (y_zero_point, "y_zero_point")):
        if t is not None and t.numel() != 1:
            raise ValueError(f"QLUT: {what} holds {t.numel()} values; a table takes one scale and zero point per "
                             "tensor")
    steps = check_steps(functions, numbers)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(qn.storage_dtype(x_dtype))
    v = qn.dequantize(codes, x_scale, x_zero_point, dtype=x_dtype)
    return qn.quantize(apply_steps(v, steps), y_scale, y_zero_point, dtype=out_dtype, method=method)


def table_of(x_dtype: str, scalars: Sequence[torch.Tensor], params: Mapping[str, Any]) -> torch.Tensor:
    """:func:`table` for a QLUT's attributes (``functions``, ``numbers``, ``out_dtype``, ``method``, as the IR and a
    program hold them) and its four scalar inputs (x_scale, x_zero_point, y_scale, y_zero_point): what a backend
    makes when the weights are bound."""
    return table(x_dtype, *scalars, functions=params.get("functions"), numbers=params.get("numbers") or [],
                 out_dtype=params.get("out_dtype", "int8"), method=params.get("method", "divide"))


def lookup(x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """``codes[byte of x]`` for every element: a table of :func:`table` applied to 8-bit codes."""
    if x.dtype not in (torch.int8, torch.uint8) or codes.numel() != 256:
        raise ValueError(f"QLUT: looks up int8/uint8 codes in a 256-entry table, got {x.dtype} and {codes.numel()}")
    return codes[x.contiguous().view(torch.uint8).long()]


__all__ = ["CODES", "STEPS", "STEP_OPS", "Step", "apply_steps", "check_steps", "lookup", "step_of", "table", "table_of"]
