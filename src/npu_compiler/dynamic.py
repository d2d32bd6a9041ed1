"""``compile(ir, dynamic=Buckets(...))``: one program of static variants for the shapes a model serves.

The IR keeps its symbolic dimensions (``Dim("seq", min=8, max=512)`` from torch.export, ``dim_param`` from
ONNX). Each bucket, a combination of sizes for the symbols, is specialized (``torch_ir.ir.specialize``, which
checks the size against the symbol's exported range and evaluates the guards recorded as derived symbols and
attribute expressions) and compiled as a static program; the variants share one weight table and one state
layout and go into one ``npu_program.DynamicProgram``. Whether a symbol may be padded is decided here, once,
by ``npu_compiler.padding``; the runtime only reads the answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any

from npu_program.dynamic import DynamicProgram, ShapeError, SymbolPadding, SymbolRange, Variant, check_dynamic
from torch_ir.ir import NPU_IR
from torch_ir.ir.specialize import specialize
from torch_ir.ir.validate import IRValidationError

from .errors import CompileError
from .padding import padding_for

#: The most variants one dynamic program may hold: each is a whole compile and a whole program in the file.
MAX_VARIANTS = 256


@dataclass
class Buckets:
    """The sizes to compile for each symbol, and what the runtime may do between them.

    ``sizes``: symbol -> bucket sizes (``{"seq": [128, 256, 512]}``). ``ranges``: symbol -> (min, max), the
    sizes the program must serve; a bucket list that does not cover them is refused (without it, the program
    serves what its buckets cover: every size up to the largest bucket where padding is allowed, the bucket
    sizes themselves where not). ``pad_values``: input name -> the value padded positions take (default 0: a pad
    token id, a zero attention-mask entry, a zero). ``padding=False`` serves every symbol at its bucket sizes only.
    ``weights``: what the padding check runs the model with (anything ``IRExecutor`` takes: a state dict, a file, a
    module); the model's own give the most faithful answer (its buffers hold masks and tables that random values
    do not); None: seeded random weights. ``specialize``: how a bucket's static IR is made (None:
    ``torch_ir.ir.specialize`` of the IR; an ONNX model whose shape arithmetic folds only at import:
    ``torch_ir.frontends.onnx.onnx_specializer``).
    """

    sizes: Mapping[str, Sequence[int]]
    ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    pad_values: Mapping[str, float] = field(default_factory=dict)
    padding: bool = True
    weights: Any = None
    specialize: Callable[[Mapping[str, int]], NPU_IR] | None = None


Progress = Callable[[str], None]


def compile_dynamic(ir: NPU_IR, buckets: Buckets, compile_one: Callable[[NPU_IR], object], *,
                    progress: Progress | None = None) -> DynamicProgram:
    """The dynamic program of ``ir`` (its other symbols already bound) for ``buckets``; ``compile_one`` compiles
    one static IR into a ``CompiledProgram``."""
    sizes = _check_buckets(ir, buckets)
    combos = [dict(zip(sizes, values)) for values in itertools.product(*sizes.values())]
    if len(combos) > MAX_VARIANTS:
        raise CompileError(f"--buckets give {len(combos)} variants of IR {ir.model_name!r}; at most {MAX_VARIANTS} "
                           "are compiled into one program: use fewer sizes per symbol")
    variants: list[Variant] = []

    def compile_next() -> None:
        combo = combos[len(variants)]
        if progress is not None:
            progress(f"variant {len(variants) + 1}/{len(combos)}: {' '.join(f'{k}={v}' for k, v in combo.items())}")
        variants.append(Variant(combo, compile_one(specialized(ir, combo, buckets.specialize))))

    compile_next()  # the program's output names, which the padding records, come from the first variant
    output_names = [s.name for s in variants[0].program.output_specs]
    padding = {s: _padding(ir, s, sizes, buckets, output_names) for s in sizes}
    covered = {s: _covered(ir, s, sizes[s], buckets, padding[s]) for s in sizes}  # before the other compiles
    while len(variants) < len(combos):
        compile_next()
    program = DynamicProgram(
        model_name=ir.model_name, target=variants[0].program.target,
        symbols=covered,
        input_shapes={t.name: list(t.shape) for t in ir.graph_inputs},
        output_shapes={name: list(t.shape) for t, name in zip(ir.graph_outputs, output_names)},
        padding=padding, variants=variants)
    try:
        check_dynamic(program, f"IR {ir.model_name!r}")
    except ShapeError as err:  # variants that disagree: a compiler bug or an IR the scheme does not fit
        raise CompileError(str(err)) from None
    return program


def _check_buckets(ir: NPU_IR, buckets: Buckets) -> dict[str, list[int]]:
    """The bucket sizes, sorted, each symbol one of the IR's inputs' and each size in its exported range."""
    where = f"IR {ir.model_name!r}"
    varying = set(varying_symbols(ir))
    for t in ir.graph_inputs:
        for axis, d in enumerate(t.shape):
            if isinstance(d, str) and d not in ir.symbols:
                raise CompileError(f"{where}: input {t.name!r} dimension {axis} is {d!r}; buckets need each varying "
                                   "input dimension to be one symbol (export with a plain torch.export.Dim there)")
    unknown = sorted(set(buckets.sizes) - varying)
    if unknown:
        raise CompileError(f"{where}: --buckets name {unknown}, which no input has; its symbols are "
                           f"{sorted(varying) or 'none (it is static)'}")
    unbucketed = sorted(varying - set(buckets.sizes))
    if unbucketed:
        raise CompileError(f"{where}: symbols {unbucketed} have no buckets: give them sizes (--buckets "
                           f"{unbucketed[0]}=...) or fix them (--bind {unbucketed[0]}=N)")
    out = {}
    for symbol, values in buckets.sizes.items():
        values = sorted(set(int(v) for v in values))
        spec = ir.symbols[symbol]
        low, high = spec.get("min"), spec.get("max")
        bad = [v for v in values if (low is not None and v < low) or (high is not None and v > high) or v < 1]
        if not values or bad:
            raise CompileError(f"{where}: bucket {symbol}={bad[0] if bad else '(none)'} is outside the range the model "
                               f"was exported for ({low}..{high}); use sizes in that range, or export with a wider "
                               "torch.export.Dim")
        out[symbol] = values
        if symbol in buckets.ranges:
            _check_range(ir, symbol, values, buckets.ranges[symbol])
    unknown_ranges = sorted(set(buckets.ranges) - set(out))
    if unknown_ranges:
        raise CompileError(f"{where}: --range names {unknown_ranges}, which have no --buckets")
    return out


def varying_symbols(ir: NPU_IR) -> list[str]:
    """The symbols of the IR's input shapes, sorted: what a dynamic program varies."""
    return sorted({d for t in ir.graph_inputs for d in t.shape if isinstance(d, str)})


def check_exported_range(ir: NPU_IR, symbol: str, lo: int, hi: int) -> None:
    """``--range SYMBOL=LO:HI`` must lie inside the range the model was exported for (and be a range)."""
    spec = ir.symbols.get(symbol, {})
    low, high = spec.get("min"), spec.get("max")
    if not 1 <= lo <= hi or (low is not None and lo < low) or (high is not None and hi > high):
        raise CompileError(f"IR {ir.model_name!r}: --range {symbol}={lo}:{hi} is not inside the range the model was "
                           f"exported for ({low}..{high})")


def _check_range(ir: NPU_IR, symbol: str, values: list[int], asked: tuple[int, int]) -> None:
    """A range asked for lies inside the exported one and ends at or below the largest bucket."""
    lo, hi = int(asked[0]), int(asked[1])
    check_exported_range(ir, symbol, lo, hi)
    if hi > values[-1]:
        raise CompileError(f"IR {ir.model_name!r}: the buckets {values} do not cover {symbol} {lo}..{hi} asked for: "
                           f"the largest bucket is {values[-1]}; add a bucket of {hi}, or narrow the range "
                           f"(--range {symbol}={lo}:{values[-1]})")


def specialized(ir: NPU_IR, sizes: Mapping[str, int],
                 specializer: Callable[[Mapping[str, int]], NPU_IR] | None) -> NPU_IR:
    try:
        return specialize(ir, sizes) if specializer is None else specializer(sizes)
    except IRValidationError as e:  # a recorded guard (a derived symbol out of its range, say) refuses the size
        raise CompileError(f"bucket {dict(sizes)}: {e}") from None


def _padding(ir: NPU_IR, symbol: str, sizes: Mapping[str, list[int]], buckets: Buckets,
             output_names: list[str]) -> SymbolPadding:
    """Padding for ``symbol``, checked in the reference executor at the smallest size it serves and its smallest
    bucket above (or, with one bucket, that bucket)."""
    if not buckets.padding:
        return SymbolPadding(reason="padding was turned off (--no-padding)")
    low = _range_min(ir, symbol, sizes[symbol], buckets)
    bigger = [v for v in sizes[symbol] if v > low]
    if not bigger:
        return SymbolPadding(reason=f"no bucket is larger than {low}, the smallest size served")
    others = {s: v[0] for s, v in sizes.items() if s != symbol}
    return padding_for(ir, symbol, (low, bigger[0]), others, buckets.pad_values, output_names,
                       lambda sizes: specialized(ir, sizes, buckets.specialize), buckets.weights)


def _range_min(ir: NPU_IR, symbol: str, values: list[int], buckets: Buckets) -> int:
    if symbol in buckets.ranges:
        return int(buckets.ranges[symbol][0])
    low = ir.symbols[symbol].get("min")
    return max(int(low) if low is not None else 1, 1)


def _covered(ir: NPU_IR, symbol: str, values: list[int], buckets: Buckets, padding: SymbolPadding) -> SymbolRange:
    """The sizes served; a range asked for (``Buckets.ranges``) that the buckets do not cover is refused."""
    low = _range_min(ir, symbol, values, buckets) if padding.allowed else values[0]
    covered = SymbolRange(min(low, values[0]), values[-1])
    asked = buckets.ranges.get(symbol)
    if asked is None:
        return covered
    lo, hi = int(asked[0]), int(asked[1])  # inside the exported range and the buckets: _check_range
    gaps = [] if padding.allowed else [v for v in range(lo, hi + 1) if v not in values][:5]
    if gaps:
        raise CompileError(f"IR {ir.model_name!r}: the buckets {values} do not cover {symbol} {lo}..{hi} asked for: "
                           f"sizes {gaps} have no bucket of their own ({symbol} cannot be padded: {padding.reason}); "
                           f"add buckets, or narrow the range (--range {symbol}=LO:HI)")
    return dc_replace(covered, min=lo)


__all__ = ["MAX_VARIANTS", "Buckets", "check_exported_range", "compile_dynamic", "specialized", "varying_symbols"]
