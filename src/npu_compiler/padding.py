"""May a symbol be padded? The check behind a dynamic program's ``SymbolPadding``.

Padding an input along a symbol (a sentence of 100 tokens run in the 128-token bucket, ids and attention mask
padded with zeros) gives the same results for the real positions only if the model keeps the padded positions
apart: row-wise layers do, attention does where the mask hides the padded keys, a mean over the sequence does
not. Rather than trust a rule per op, the compiler asks the reference executor: it runs the IR at a size and at
a larger padded size with seeded weights and inputs, cuts the outputs back, and compares. A difference beyond
rounding means padding changes the result, and the symbol is then served only at its bucket sizes (the runtime
refuses the others), never padded silently.

The check is empirical: it runs two sizes with random values. A model whose results depend on padding only at
some sizes, or only for particular weight values, would pass it; such models are rare, and the runtime's
``validate=True`` and ``torch-ir verify`` remain the way to check a served length end to end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from npu_program.dynamic import PaddedAxis, SymbolPadding
from torch_ir.executor import IRExecutor
from torch_ir.inputs import random_inputs
from torch_ir.ir import NPU_IR
from torch_ir.ops.symbolic import sym_names
from torch_ir.ops.values import dtype_from_name
from torch_ir.verify.drift import relative_error

#: Relative error (of the largest magnitude) above which padding is said to change an output: far above fp32
#: rounding between two shapes (a different blocking of the same sums), far below what a real leak gives.
PAD_TOLERANCE = 1e-4


def padding_for(ir: NPU_IR, symbol: str, sizes: tuple[int, int], others: Mapping[str, int],
                pad_values: Mapping[str, float], output_names: list[str], make_ir: Callable[[dict[str, int]], NPU_IR],
                weights: Any = None, seed: int = 0) -> SymbolPadding:
    """How ``symbol`` is padded, or the reason it may not be: the axes of ``ir`` (symbolic) carrying it, then the
    reference check of ``sizes`` (actual, padded) with the other symbols at ``others``: the static IRs
    ``make_ir`` gives for both run with ``weights`` (None: seeded random ones). ``output_names`` are the
    program's names of ``ir.graph_outputs``, in order."""
    inputs = [PaddedAxis(t.name, axis, float(pad_values.get(t.name, 0)))
              for t in ir.graph_inputs for axis, d in enumerate(t.shape) if d == symbol]
    outputs = [PaddedAxis(name, axis) for t, name in zip(ir.graph_outputs, output_names)
               for axis, d in enumerate(t.shape) if d == symbol]
    reason = _structural_reason(ir, symbol)
    if reason is None:
        actual, padded = (make_ir({**others, symbol: n}) for n in sizes)
        weights = weights if weights is not None else seeded_weights(actual, seed)
        # strict_weights=False: a static import may fold a weight away (ONNX: the expanded class token)
        run = [IRExecutor(one, weights, strict_weights=False) for one in (actual, padded)]
        reason = _reference_check(*run, symbol, sizes, inputs, outputs, output_names, seed)
    return SymbolPadding(inputs, outputs, reason)


def _structural_reason(ir: NPU_IR, symbol: str) -> str | None:
    if ir.mutations:
        return "the model writes state (a cache or buffer), which padded positions would write too"
    for t in ir.graph_outputs:
        for d in t.shape:
            if isinstance(d, str) and d != symbol and symbol in sym_names(d):
                return f"output {t.name!r} has the dimension {d!r}, which cannot be cut back to the actual size"
    return None


def _reference_check(small_ir: IRExecutor, big_ir: IRExecutor, symbol: str, sizes: tuple[int, int],
                     inputs: list[PaddedAxis], outputs: list[PaddedAxis], output_names: list[str],
                     seed: int) -> str | None:
    """Run the actual size and the padded one, cut the padded outputs back and compare."""
    actual, padded = sizes
    small = random_inputs(small_ir.ir, seed)
    big = [_pad(x, t.name, inputs, padded) for x, t in zip(small, small_ir.ir.graph_inputs)]
    want, got = small_ir.run(small), big_ir.run(big)
    cut = {a.name: a.axis for a in outputs}
    for name, w, g in zip(output_names, want, got):
        if name in cut:
            g = g.narrow(cut[name], 0, actual)
        if w.shape != g.shape:
            return f"output {name!r} is {list(g.shape)} padded and {list(w.shape)} not"
        if w.is_floating_point() and not (torch.isfinite(w).all() and torch.isfinite(g).all()):
            return (f"the padding check was inconclusive: output {name!r} is not finite with the weights it ran with "
                    "(give the model's own: Buckets(weights=...), torch-ir compile --weights)")
        error = relative_error(g, w)  # of the largest magnitude; integers must be equal
        if error > PAD_TOLERANCE:
            return (f"padding {symbol} from {actual} to {padded} changes output {name!r} by {error:.2g} of its "
                    "largest value in the reference executor")
    return None


def _pad(x: torch.Tensor, name: str, axes: list[PaddedAxis], size: int) -> torch.Tensor:
    for a in axes:
        if a.name == name and x.shape[a.axis] < size:
            shape = list(x.shape)
            shape[a.axis] = size - x.shape[a.axis]
            x = torch.cat([x, torch.full(shape, a.value, dtype=x.dtype)], dim=a.axis)
    return x


def seeded_weights(ir: NPU_IR, seed: int = 0) -> dict[str, Any]:
    """Random weights for ``ir`` by state-dict key: small uniform floats (variances positive), zero integers, True
    bools.
    Non-persistent buffers with a recipe (position ids, rotary tables) are left out: the executor rebuilds them,
    and a random position id would index out of its table."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for w in [*ir.weights, *(c for c in ir.constants if c.name not in ir.constant_values)]:
        key = ir.weight_name_mapping.get(w.name, w.name)
        if key in ir.non_persistent_buffers and ir.non_persistent_buffers[key] is not None:
            continue
        dtype = dtype_from_name(w.dtype)
        shape = [int(d) for d in w.shape]
        if dtype.is_floating_point:
            low = 0.5 if "var" in key.rsplit(".", 1)[-1] else -0.1
            value = torch.rand(shape, generator=g) * (1.0 - low if low > 0 else 0.2) + low
            out[key] = value.to(dtype)
        else:  # a bool buffer is most often a mask: all True keeps every value finite
            out[key] = torch.ones(shape, dtype=dtype) if dtype == torch.bool else torch.zeros(shape, dtype=dtype)
    return out


__all__ = ["PAD_TOLERANCE", "padding_for", "seeded_weights"]
