"""A dynamic program: static variants of one model (shape buckets) sharing one weight table and state layout.

A program is planned for static shapes; a model that serves several shapes (a batch of 1 to 16, a sentence of
8 to 512 tokens) is compiled once per *bucket*, a combination of sizes for its symbolic dimensions, and the
variants travel together as one `DynamicProgram` (one `.npubin` file, `npu_program.npubin_dynamic`). This is
the scheme of Qualcomm QNN's multi-graph contexts, RKNN's shape sets and Ascend's "gears".

The runtime picks a variant per run (`select`): the symbols are read from the inputs' shapes (one symbol
bound twice with different sizes is refused), and the smallest variant whose sizes are at least the actual
ones is taken, where the compiler found that padding a symbol does not change the results
(`SymbolPadding`); a symbol that cannot be padded runs only in a variant of exactly its size. The inputs are
padded with their pad values, the outputs cut back to the actual sizes.

Plain data, like `CompiledProgram`: the runtime reads it without the compiler.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch_ir.errors import TorchIRError
from torch_ir.ops.symbolic import eval_sym

from .program import CompiledProgram, StateSpec, TensorSpec
from .template import Template, TemplateError, instantiate


class ShapeError(TorchIRError, ValueError):
    """Inputs whose shapes no variant of a dynamic program serves; the message says which and the fix."""


@dataclass
class SymbolRange:
    """The sizes a symbol may take at run time (inclusive), as the variants cover them."""

    min: int
    max: int


@dataclass
class PaddedAxis:
    """One axis of an input or output that carries a symbol: an input is padded there with ``value`` (a pad
    token id, a zero attention-mask entry), an output cut back to the actual size."""

    name: str
    axis: int
    value: float = 0.0


@dataclass
class SymbolPadding:
    """How a symbol is padded, or why it is not (``reason`` set: only variants of the exact size serve it)."""

    inputs: list[PaddedAxis] = field(default_factory=list)
    outputs: list[PaddedAxis] = field(default_factory=list)
    reason: str | None = None

    @property
    def allowed(self) -> bool:
        return self.reason is None


@dataclass
class Variant:
    """One static program and the symbol sizes it was compiled for."""

    sizes: dict[str, int]
    program: CompiledProgram


@dataclass
class DynamicProgram:
    """Variants of one model for several shapes (see the module docstring)."""

    model_name: str
    target: str
    # symbol -> the run-time sizes covered
    symbols: dict[str, SymbolRange]
    # the program's inputs and outputs with their symbolic dimensions (a symbol's name where it varies)
    input_shapes: dict[str, list[Any]]
    output_shapes: dict[str, list[Any]]
    padding: dict[str, SymbolPadding]
    variants: list[Variant]
    metadata: dict[str, Any] = field(default_factory=dict)
    # the IR the variants were specialized from (JSON dict), or None for a smaller file
    ir: dict[str, Any] | None = None
    # an upper-bound program (`npu_program.template`): the one variant is planned for the largest sizes and
    # sized at run time from the bound symbols, never padded; None for buckets
    template: Template | None = None

    # -- what the variants share ----------------------------------------------------------------------

    @property
    def weight_program(self) -> CompiledProgram:
        """A variant to read the shared weight table from (all variants' tables are equal: `check_shared`)."""
        return self.variants[0].program

    @property
    def weight_specs(self) -> list[TensorSpec]:
        return self.weight_program.weight_specs

    @property
    def state_specs(self) -> list[StateSpec]:
        return self.weight_program.state_specs

    @property
    def arena_bytes(self) -> int:
        """The one arena the runtime allocates for every variant (one runs at a time): the largest variant's.
        What a variant's bind-time dispatches compute lives beside it (``bind_bytes``), since another variant's
        run would overwrite it there."""
        return max(v.program.arena_bytes for v in self.variants)

    @property
    def bind_bytes(self) -> int:
        """The memory the variants' bind-time results take beside the shared arena, all variants together."""
        return sum(v.program.tensors[name].nbytes for v in self.variants for name in v.program.bind_outputs
                   if name in v.program.memory.offsets)

    def bucket_list(self) -> str:
        return ", ".join(_sizes_text(v.sizes) for v in self.variants)

    # -- choosing a variant ---------------------------------------------------------------------------

    def bind_symbols(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """The symbol sizes the input shapes give, each checked against its range; static dimensions must
        match. Raises ``ShapeError`` for an unknown or missing input, a wrong rank or size, a symbol given two
        different sizes, or a size outside the covered range."""
        names = list(self.input_shapes)
        missing, extra = [n for n in names if n not in shapes], [n for n in shapes if n not in names]
        if missing or extra:
            raise ShapeError(f"dynamic program {self.model_name!r} takes inputs {names}; missing {missing}, "
                             f"unexpected {extra}")
        sizes: dict[str, int] = {}
        first: dict[str, str] = {}
        for name, declared in self.input_shapes.items():
            shape = [int(d) for d in shapes[name]]
            if len(shape) != len(declared):
                raise ShapeError(f"input {name!r} of {self.model_name!r} has shape {shape}; it takes {len(declared)} "
                                 f"dimensions {declared}")
            for axis, (want, got) in enumerate(zip(declared, shape)):
                self._bind_dim(name, axis, want, got, sizes, first)
        for symbol, size in sizes.items():
            covered = self.symbols[symbol]
            if not covered.min <= size <= covered.max:
                raise ShapeError(f"{symbol}={size} (from the input shapes) is outside every bucket of "
                                 f"{self.model_name!r}: they serve {symbol} {covered.min}..{covered.max} (buckets "
                                 f"{self.bucket_list()}); recompile with a bucket of at least {size}")
        return sizes

    def _bind_dim(self, name: str, axis: int, want: Any, got: int, sizes: dict[str, int],
                  first: dict[str, str]) -> None:
        if isinstance(want, int):
            if want != got:
                raise ShapeError(f"input {name!r} of {self.model_name!r}: dimension {axis} is {got}; the program "
                                 f"takes {want} there (shape {self.input_shapes[name]})")
            return
        where = f"input {name!r} dimension {axis}"
        if sizes.setdefault(want, got) != got:
            raise ShapeError(f"symbol {want!r} is bound twice with different sizes: {sizes[want]} by "
                             f"{first[want]} and {got} by {where}; inputs sharing a symbol must agree")
        first.setdefault(want, where)

    def select(self, sizes: Mapping[str, int]) -> Variant:
        """The variant for ``sizes``: of exactly those sizes, or the smallest (fewest padded elements) that
        is larger only in symbols that may be padded. Raises ``ShapeError`` when none fits."""
        if self.template is not None:  # one variant, sized at run time (npu_program.template.instantiate)
            return self.variants[0]
        fits = [v for v in self.variants if self._fits(v, sizes)]
        if not fits:
            exact_only = [s for s, p in self.padding.items() if not p.allowed]
            why = "".join(f"; {s} is served only at its bucket sizes ({self.padding[s].reason})" for s in exact_only)
            raise ShapeError(f"no bucket of {self.model_name!r} serves {_sizes_text(sizes)} (buckets "
                             f"{self.bucket_list()}{why}); recompile with --buckets that include it")
        return min(fits, key=lambda v: (math.prod(v.sizes.values()), sorted(v.sizes.items())))

    def _fits(self, variant: Variant, sizes: Mapping[str, int]) -> bool:
        for symbol, size in sizes.items():
            have = variant.sizes[symbol]
            if have < size or (have > size and not self.padding[symbol].allowed):
                return False
        return True

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write one `.npubin` file (format 3) holding every variant, atomically."""
        from .npubin_dynamic import write_dynamic  # local import: it imports this module

        write_dynamic(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DynamicProgram:
        """Read a dynamic program file; a static one is refused with the fix."""
        from .npubin import NpubinError
        from .npubin_dynamic import load_program

        program = load_program(path)
        if not isinstance(program, DynamicProgram):
            raise NpubinError(f"{path}: holds one static program, not a dynamic one; load it with "
                              "CompiledProgram.load or npu_program.load_program")
        return program

    def summary(self) -> str:
        """A few lines for CLIs: the buckets, how each symbol is padded, the shared arena and weights."""
        if self.template is not None:
            lines = [f"model: {self.model_name}  target: {self.target}  dynamic: one program planned for the upper "
                     f"bound ({self.bucket_list()}), every dispatch sized at run time"]
            lines += [f"  {symbol} {covered.min}..{covered.max}: run at its actual size, never padded"
                      for symbol, covered in self.symbols.items()]
            lines.append(f"  {len(self.template.shapes)} tensors, {len(self.template.params)} kernel parameters and "
                         f"{len(self.template.constants)} constants sized from the symbols")
        else:
            lines = [f"model: {self.model_name}  target: {self.target}  dynamic: {len(self.variants)} variants "
                     f"({self.bucket_list()})"]
        for symbol, covered in (self.symbols.items() if self.template is None else ()):
            pad = self.padding[symbol]
            how = (f"padded ({', '.join(f'{a.name}[{a.axis}]={a.value:g}' for a in pad.inputs)}), outputs cut back"
                   if pad.allowed else f"exact sizes only: {pad.reason}")
            lines.append(f"  {symbol} {covered.min}..{covered.max}: {how}")
        for v in self.variants:
            p = v.program
            lines.append(f"  {_sizes_text(v.sizes)}: {p.dispatch_count} dispatches, arena {p.arena_bytes} bytes")
        beside = f" (+ {self.bind_bytes} bytes of bind-time results beside it)" if self.bind_bytes else ""
        one = "planned for the upper bound" if self.template is not None else "one for all variants (the largest)"
        lines.append(f"arena: {self.arena_bytes} bytes, {one}{beside}; weights: {len(self.weight_specs)} tensors, "
                     f"{self.weight_program.weight_bytes} bytes, bound once")
        return "\n".join(lines)


def _sizes_text(sizes: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sizes.items())





def check_dynamic(program: DynamicProgram, where: str) -> None:
    """Refuse a dynamic program whose parts disagree (a hostile or damaged file): every variant of the same
    target, with one weight table and one state layout, its inputs and outputs the declared shapes at its
    sizes, and every padded axis an axis of a symbol. Raises ``ShapeError`` naming ``where``."""
    if not program.variants:
        raise ShapeError(f"{where}: a dynamic program without variants; recompile the model")
    first = program.variants[0].program
    symbols = set(program.symbols)
    for i, variant in enumerate(program.variants):
        p, what = variant.program, f"{where}: variant {i} ({_sizes_text(variant.sizes)})"
        if set(variant.sizes) != symbols:
            raise ShapeError(f"{what} binds {sorted(variant.sizes)}; the program's symbols are {sorted(symbols)}")
        if p.target != program.target:
            raise ShapeError(f"{what} is for target {p.target!r}, the program for {program.target!r}")
        if (p.weight_specs, p.weight_keys, p.state_specs) != (first.weight_specs, first.weight_keys,
                                                               first.state_specs):
            raise ShapeError(f"{what} has its own weight table or state layout; the variants of one program "
                             "share one")
        _check_io(what, "input", p.input_specs, program.input_shapes, variant.sizes)
        _check_io(what, "output", p.output_specs, program.output_shapes, variant.sizes)
    for symbol, pad in program.padding.items():
        for axis in [*pad.inputs, *pad.outputs]:
            shapes = program.input_shapes if axis in pad.inputs else program.output_shapes
            declared = shapes.get(axis.name)
            if declared is None or not 0 <= axis.axis < len(declared) or declared[axis.axis] != symbol:
                raise ShapeError(f"{where}: padding of {symbol!r} names {axis.name!r} axis {axis.axis}, which is not "
                                 f"an axis of {symbol!r}; recompile the model")
    if set(program.padding) != symbols:
        raise ShapeError(f"{where}: padding is given for {sorted(program.padding)}, the symbols are {sorted(symbols)}")
    if program.template is not None:
        _check_template(program, where)


def _check_template(program: DynamicProgram, where: str) -> None:
    """An upper-bound program: one variant at the top of every range, unpadded, and its template reproducing
    that variant's own sizes there (the expressions are parsed by the safe grammar on the way)."""
    variant = program.variants[0]
    top = {s: r.max for s, r in program.symbols.items()}
    if len(program.variants) != 1 or variant.sizes != top:
        raise ShapeError(f"{where}: an upper-bound program has one variant, at {top}")
    if any(p.allowed for p in program.padding.values()):
        raise ShapeError(f"{where}: an upper-bound program is never padded")
    try:
        again = instantiate(variant.program, program.template, top, where)
    except TorchIRError as err:
        raise ShapeError(str(err)) from None
    changed = [n for n, s in again.tensors.items() if s.shape != variant.program.tensors[n].shape]
    if changed or again.dispatches != variant.program.dispatches:
        raise ShapeError(f"{where}: the template does not give the program's own sizes at {top} "
                         f"({'tensors ' + str(changed[:3]) if changed else 'dispatch params'})")


def _check_io(what: str, kind: str, specs: list[TensorSpec], declared: Mapping[str, list[Any]],
              sizes: Mapping[str, int]) -> None:
    if [s.name for s in specs] != list(declared):
        raise ShapeError(f"{what}: {kind}s {[s.name for s in specs]}, the program declares {list(declared)}")
    for spec in specs:
        try:
            want = [eval_sym(d, sizes, what) if isinstance(d, str) else d for d in declared[spec.name]]
        except TorchIRError as err:
            raise ShapeError(f"{what}: {kind} {spec.name!r}: {err}") from None
        if list(spec.shape) != want:
            raise ShapeError(f"{what}: {kind} {spec.name!r} is {spec.shape}; at these sizes it must be {want}")

__all__ = ["DynamicProgram", "PaddedAxis", "ShapeError", "SymbolPadding", "SymbolRange", "Template", "TemplateError",
           "Variant", "check_dynamic"]
