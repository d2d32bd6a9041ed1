"""``compile(ir, dynamic=UpperBound())``: one program planned for the upper bound, sized at run time.

The compiler plans for static shapes, so the upper-bound program's sizes are *derived*: the model is compiled at
the corners of a box inside the ranges (every symbol at a small or a large size) and every size that differs
between those programs (a tensor dimension, an integer kernel parameter) is fitted exactly by a polynomial of
degree one in each symbol, ``c + a*seq + b*batch + d*batch*seq``, with integer coefficients. The fit is checked at
a size between, a compile it did not see. A model the scheme does not fit is refused with the reason, never
approximated: a compiler that chose other kernels at another size, a size that is not such a polynomial (a strided
convolution's ``floor``), a size that shrinks as a symbol grows (the arena plan would not hold it), a constant
that is not the top-left corner of its value at the top. Buckets (``npu_compiler.dynamic.Buckets``) serve those
models.

The sizes compiled at lie inside the ranges, away from their ends where they can (``_samples``): at a size of 1, or
at the length of a buffer, the compiler drops a broadcast or a slice that is the identity there and that every other
size needs. The program at the top is the template's instance there, with its arena planned anew.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from npu_program.dynamic import DynamicProgram, SymbolPadding, SymbolRange, Variant
from npu_program.program import CompiledProgram
from npu_program.template import SymbolicParam, Template, instantiate
from torch_ir.dtypes import get_dtype
from torch_ir.ir import NPU_IR

from .dynamic import check_exported_range, varying_symbols
from .errors import CompileError
from .memory import plan_arena

#: Symbols an upper-bound program may vary: each doubles the compiles (the corners of the ranges).
MAX_SYMBOLS = 3


@dataclass
class UpperBound:
    """Compile one program for the largest sizes (``ranges``: symbol -> (min, max); default the ranges the IR
    was exported with, which must then be bounded). ``specialize`` as for ``Buckets``."""

    ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    specialize: Callable[[Mapping[str, int]], NPU_IR] | None = None


Point = dict[str, int]


def compile_upper_bound(ir: NPU_IR, upper: UpperBound, compile_at: Callable[[Point], CompiledProgram],
                        progress: Callable[[str], None] | None = None) -> DynamicProgram:
    """The upper-bound program of ``ir`` (its other symbols bound); ``compile_at`` compiles it at given sizes."""
    ranges = _ranges(ir, upper)
    symbols = list(ranges)
    samples = {s: _samples(*ranges[s], s, ir.model_name) for s in symbols}
    corners = [dict(zip(symbols, values)) for values in itertools.product(*((a, c) for a, _, c in samples.values()))]
    points = [*corners, {s: b for s, (_, b, _) in samples.items()}]  # the last one checks the fit
    programs = []
    for i, point in enumerate(points):
        if progress is not None:
            progress(f"compile {i + 1}/{len(points)}: {' '.join(f'{k}={v}' for k, v in point.items())}")
        programs.append(compile_at(point))
    top = {s: hi for s, (_, hi) in ranges.items()}
    fit = _Fit(symbols, points, programs, ir.model_name)
    template = fit.template()
    top_program = None
    if template.constants:  # their values at the top: from a compile there (the corners' must be cut from them)
        if progress is not None:
            progress(f"compile at the top for the constants that vary: {' '.join(f'{k}={v}' for k, v in top.items())}")
        top_program = compile_at(top)
    program = _at_top(programs[len(corners) - 1], template, top, ir.model_name)
    for name in template.constants:
        program.constants[name] = fit.constant_at_top(name, top_program, program.tensors[name].shape)
    return DynamicProgram(
        model_name=ir.model_name, target=program.target,
        symbols={s: SymbolRange(lo, hi) for s, (lo, hi) in ranges.items()},
        input_shapes={t.name: list(t.shape) for t in ir.graph_inputs},
        output_shapes={spec.name: list(t.shape) for t, spec in zip(ir.graph_outputs, program.output_specs)},
        padding={s: SymbolPadding(reason="an upper-bound program runs every size as it is") for s in symbols},
        variants=[Variant(top, program)], template=template)


def _samples(lo: int, hi: int, symbol: str, model: str) -> tuple[int, int, int]:
    """Three sizes to compile at, inside the range and away from its ends where it can: at a size of 1 or at the
    top of a buffer's length a compiler drops an identity broadcast or slice, which other sizes need."""
    inner = list(range(max(lo, 2), hi))
    for end in (hi, lo):  # the ends only when the inside is too small: the top first (1 is the likelier identity)
        if len(inner) < 3 and end not in inner:
            inner = sorted({*inner, end})
    if len(inner) < 3:
        raise CompileError(f"IR {model!r}: the range of {symbol!r} ({lo}..{hi}) is too narrow to derive sizes from; "
                           "compile it with --buckets")
    return inner[0], inner[len(inner) // 2], inner[-1]


def _at_top(base: CompiledProgram, template: Template, top: Point, model: str) -> CompiledProgram:
    """The program at the top of every range, its arena planned there: the template's instance, re-planned (the
    compiler may have compiled other dispatches at the top itself, dropping a slice that is the identity there)."""
    # varying constants are not cut from the base (smaller than the top): the caller puts the top's values in
    program = instantiate(base, replace(template, constants=[]), top, f"IR {model!r}")
    memory = program.memory
    sizes = {name: spec.nbytes for name, spec in program.tensors.items()
             if name not in memory.aliases and name not in program.constants}
    strategy = program.metadata.get("options", {}).get("memory_strategy", "greedy_by_size")
    program.memory = plan_arena(program.dispatches, sizes, [s.name for s in program.input_specs],
                                [s.name for s in program.output_specs], memory.aliases, alignment=memory.alignment,
                                strategy=strategy, where=f"IR {model!r} at the upper bound")
    return program


def _ranges(ir: NPU_IR, upper: UpperBound) -> dict[str, tuple[int, int]]:
    where = f"IR {ir.model_name!r}"
    varying = varying_symbols(ir)
    if not varying:
        raise CompileError(f"{where} has no symbolic input dimension: compile it without --upper-bound")
    if len(varying) > MAX_SYMBOLS:
        raise CompileError(f"{where}: an upper-bound program varies at most {MAX_SYMBOLS} symbols, the inputs have "
                           f"{varying}; fix the others (--bind)")
    unknown = sorted(set(upper.ranges) - set(varying))
    if unknown:
        raise CompileError(f"{where}: --range names {unknown}, which no input has; its symbols are {varying}")
    out = {}
    for symbol in varying:
        spec = ir.symbols.get(symbol, {})
        lo, hi = upper.ranges.get(symbol, (spec.get("min") or 1, spec.get("max")))
        if hi is None:
            raise CompileError(f"{where}: symbol {symbol!r} has no upper bound (exported without a max): give one "
                               f"(--range {symbol}=LO:HI)")
        check_exported_range(ir, symbol, int(lo), int(hi))
        if lo == hi:
            raise CompileError(f"{where}: symbol {symbol!r} has one size ({lo}): bind it (--bind {symbol}={lo})")
        out[symbol] = (int(lo), int(hi))
    return out


class _Fit:
    """The template of the programs compiled at ``points``: the sizes that vary, as fitted expressions."""

    def __init__(self, symbols: list[str], points: list[Point], programs: list[CompiledProgram], model: str) -> None:
        self.symbols, self.points, self.programs = symbols, points, programs
        self.where = f"IR {model!r} (an upper-bound program)"

    def refuse(self, problem: str) -> CompileError:
        sizes = " and ".join(" ".join(f"{k}={v}" for k, v in p.items()) for p in self.points[:2])
        return CompileError(f"{self.where}: {problem} (compiled at {sizes}, ...); compile it with --buckets instead")

    def template(self) -> Template:
        base = self.programs[0]
        for other in self.programs:
            self._same_structure(base, other)
        template = Template()
        for name in base.tensors:
            shape = self._sizes([p.tensors[name].shape for p in self.programs], f"tensor {name!r}")
            if any(isinstance(d, str) for d in shape):
                template.shapes[name] = shape
                if name in base.constants:
                    template.constants.append(name)
        for index, d in enumerate(base.dispatches):
            for path, values in _int_leaves([p.dispatches[index].params for p in self.programs]):
                expr = self._size(values, f"dispatch {index} ({d.kernel}) param {path}")
                if isinstance(expr, str):
                    template.params.append(SymbolicParam(index, path, expr))
        return template

    def _same_structure(self, a: CompiledProgram, b: CompiledProgram) -> None:
        """The same dispatches over the same tensors; only sizes may differ."""
        shape_of = [(d.kernel, d.node, d.inputs, d.outputs, d.host, d.at_bind) for d in a.dispatches]
        if shape_of != [(d.kernel, d.node, d.inputs, d.outputs, d.host, d.at_bind) for d in b.dispatches]:
            first = next((i for i, (x, y) in enumerate(zip(a.dispatches, b.dispatches))
                          if (x.kernel, x.inputs, x.outputs) != (y.kernel, y.inputs, y.outputs)),
                         min(len(a.dispatches), len(b.dispatches)))
            raise self.refuse(f"the compiler chose other dispatches at another size (from dispatch {first} on)")
        if list(a.tensors) != list(b.tensors) or set(a.constants) != set(b.constants) or \
                a.weight_specs != b.weight_specs or a.memory.aliases != b.memory.aliases:
            raise self.refuse("the programs at two sizes differ in their tensors, constants or weights")
        for x, y in zip(a.dispatches, b.dispatches):
            if _skeleton(x.params) != _skeleton(y.params):
                raise self.refuse(f"dispatch {x.node!r} has parameters that differ otherwise than in sizes")
        for name, spec in a.tensors.items():
            other = b.tensors[name]
            if (spec.dtype, spec.layout, spec.quant, len(spec.shape)) != (other.dtype, other.layout, other.quant,
                                                                         len(other.shape)):
                raise self.refuse(f"tensor {name!r} differs otherwise than in its sizes")

    def _sizes(self, shapes: list[list[int]], what: str) -> list[Any]:
        return [self._size([s[axis] for s in shapes], f"{what} dimension {axis}") for axis in range(len(shapes[0]))]

    def _size(self, values: list[int], what: str) -> int | str:
        """The size as an int (the same everywhere) or its fitted expression."""
        if len(set(values)) == 1:
            return values[0]
        corners = 2 ** len(self.symbols)  # the first points; the centre after them checks the fit
        coefficients = _solve(self.symbols, self.points[:corners], values[:corners])
        if coefficients is None:
            raise self.refuse(f"{what} is {values} at those sizes, which is not an integer polynomial of degree one "
                              "in each symbol")
        if any(c < 0 for key, c in coefficients.items() if key):
            raise self.refuse(f"{what} shrinks as a symbol grows ({_render(coefficients)}), so the upper bound's "
                              "plan would not hold it")
        for point, value in zip(self.points, values):
            if _evaluate(coefficients, point) != value:
                raise self.refuse(f"{what} is {value} at {point}, not the {_render(coefficients)} the corners give")
        return _render(coefficients)


    def constant_at_top(self, name: str, top: CompiledProgram, shape: list[int]) -> bytes:
        """A varying constant's value at the top (from the compile there), of which every size's is the top-left
        corner: checked at every size compiled."""
        spec = top.tensors.get(name)
        if name not in top.constants or spec is None or list(spec.shape) != list(shape):
            raise self.refuse(f"constant {name!r} varies with the sizes, and the compile at the top has no such "
                              "constant to take its value from")
        itemsize = get_dtype(spec.dtype).itemsize
        full = np.frombuffer(bytes(top.constants[name]), dtype=np.uint8).reshape([*shape, itemsize])
        for program in self.programs:
            small = program.tensors[name].shape
            if full[tuple(slice(0, n) for n in small)].tobytes() != bytes(program.constants[name]):
                raise self.refuse(f"constant {name!r} at {small} is not the top-left corner of its value at the top")
        return bytes(top.constants[name])


def _int_leaves(params: list[Any], path: tuple[Any, ...] = ()) -> list[tuple[list[Any], list[int]]]:
    """(path, values across the programs) of every integer in the params (bools excluded)."""
    first = params[0]
    if isinstance(first, bool):
        return []
    if isinstance(first, int):
        return [(list(path), [int(p) for p in params])]
    if isinstance(first, dict):
        return [leaf for key in first for leaf in _int_leaves([p[key] for p in params], (*path, key))]
    if isinstance(first, list):
        return [leaf for i in range(len(first)) for leaf in _int_leaves([p[i] for p in params], (*path, i))]
    return []


def _skeleton(value: Any) -> Any:
    """The params with every integer blanked: what must be equal at every size."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int
    if isinstance(value, dict):
        return {k: _skeleton(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_skeleton(v) for v in value]
    return value


Key = tuple[str, ...]


def _solve(symbols: list[str], points: list[Point], values: list[int]) -> dict[Key, Fraction] | None:
    """Coefficients of the multilinear polynomial through the corner points (one unknown per subset of symbols),
    or None when they are not integers (or the corners do not determine them)."""
    keys = [key for r in range(len(symbols) + 1) for key in itertools.combinations(symbols, r)]
    rows = [[Fraction(_monomial(key, p)) for key in keys] + [Fraction(v)] for p, v in zip(points, values)]
    if len(rows) < len(keys):
        return None
    for col in range(len(keys)):  # Gaussian elimination, exact
        pivot = next((r for r in range(col, len(rows)) if rows[r][col] != 0), None)
        if pivot is None:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(len(rows)):
            if r != col and rows[r][col] != 0:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col])]
    solution = {key: rows[i][-1] / rows[i][i] for i, key in enumerate(keys)}
    return solution if all(c.denominator == 1 for c in solution.values()) else None


def _monomial(key: Key, point: Point) -> int:
    out = 1
    for s in key:
        out *= point[s]
    return out


def _evaluate(coefficients: dict[Key, Fraction], point: Point) -> int:
    return int(sum(c * _monomial(key, point) for key, c in coefficients.items()))


def _render(coefficients: dict[Key, Fraction]) -> str:
    """``c + a*s + b*s*t`` as the symbolic grammar writes it (terms with a zero coefficient left out)."""
    terms = []
    for key, c in sorted(coefficients.items(), key=lambda item: (-len(item[0]), item[0])):
        if c == 0:
            continue
        name = "*".join(key)
        terms.append(str(int(c)) if not key else name if c == 1 else f"{int(c)}*{name}")
    text = " + ".join(terms) or "0"
    return text.replace("+ -", "- ")


__all__ = ["MAX_SYMBOLS", "UpperBound", "compile_upper_bound"]
