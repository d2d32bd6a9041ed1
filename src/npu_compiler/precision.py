"""What a compute precision costs in accuracy: the cast IR against the float32 one on example inputs.

``compile(ir, options=CompileOptions(precision="bf16"))`` retypes the model (``passes.precision``); this module
measures what that does to the outputs, before anything is run on a device: both IRs (normalized, then one of them
cast) run in the reference executor with the model's weights on the same inputs, and each output is compared
(max abs error, that error relative to the largest float32 value, the cosine, and for logits the top-1 and
top-5 agreement). ``torch-ir compile --precision`` prints it in the summary and keeps it in the program
(``metadata["precision"]["error"]``), so the figure travels with the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from torch_ir import dtypes
from torch_ir.executor import IRExecutor
from torch_ir.ir import NPU_IR

from .passes import NormalizeOptions, normalize
from .passes.precision import cast_precision

#: The last dim up to which an output is read as class scores (top-k agreement is reported for it).
MAX_CLASSES = 1 << 20


@dataclass(frozen=True)
class OutputError:
    """One output of the cast model against the float32 one."""

    name: str
    max_abs: float
    rel: float  # max_abs / max |float32 value|
    cosine: float
    top1: float | None = None  # share of rows whose arg-max is the float32 one's (class scores only)
    top5: float | None = None  # share of rows whose 5 best classes are the float32 ones, in any order


@dataclass(frozen=True)
class PrecisionError:
    """Every output's error at one precision, on the inputs it was measured on (``inputs``: how they were made)."""

    precision: str
    inputs: str
    outputs: list[OutputError]

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "inputs": self.inputs, "outputs": [asdict(o) for o in self.outputs]}


def precision_error(ir: NPU_IR, precision: str, weights: Any, inputs: Sequence[torch.Tensor], *,
                    inputs_note: str = "the example inputs",
                    normalize_options: NormalizeOptions | None = None) -> PrecisionError:
    """Run ``ir`` normalized (float32, as the model is) and normalized then cast to ``precision`` on ``inputs`` with
    ``weights`` (anything ``torch_ir.IRExecutor`` takes), and compare every output. Raises what the reference
    executor raises (a weights file of another model, inputs of the wrong shape)."""
    reference = normalize(ir, normalize_options)
    cast = cast_precision(reference, precision)
    # not strict: normalizing folds some of a model's tensors (masks, lifted constants) into others
    executor = IRExecutor(reference, weights, strict_weights=False)
    expected = executor.run(list(inputs))
    retyped = cast.metadata["precision"]["weights"]
    state = {k: v.to(dtypes.torch_dtype(cast.tensor(k).dtype)) if k in retyped else v
             for k, v in executor.state.items()}
    got = IRExecutor(cast, state, strict_weights=False).run(list(inputs))
    outputs = [_compare(t.name, e, g) for t, e, g in zip(ir.graph_outputs, expected, got)
               if e.is_floating_point()]
    return PrecisionError(precision, inputs_note, outputs)


def _compare(name: str, expected: torch.Tensor, got: torch.Tensor) -> OutputError:
    e, g = expected.detach().double().reshape(-1), got.detach().double().reshape(-1)
    max_abs = (e - g).abs().max().item() if e.numel() else 0.0
    scale = e.abs().max().item() if e.numel() else 0.0
    norms = e.norm() * g.norm()
    cosine = (e @ g / norms).item() if norms > 0 else float(torch.equal(e, g))
    top1 = top5 = None
    if expected.dim() >= 2 and 5 <= expected.shape[-1] <= MAX_CLASSES:
        rows_e, rows_g = expected.reshape(-1, expected.shape[-1]), got.reshape(-1, got.shape[-1]).to(expected.dtype)
        top1 = (rows_e.argmax(-1) == rows_g.argmax(-1)).double().mean().item()
        best_e, best_g = rows_e.topk(5).indices.sort().values, rows_g.topk(5).indices.sort().values
        top5 = (best_e == best_g).all(-1).double().mean().item()
    return OutputError(name, max_abs, max_abs / scale if scale else 0.0, cosine, top1, top5)


def attach(program: Any, error: PrecisionError) -> None:
    """Keep ``error`` in ``program.metadata["precision"]`` (saved with it, printed by its summary)."""
    record = program.metadata.setdefault("precision", {"precision": error.precision})
    record["error"] = error.to_dict()  # npu_program.program.precision_lines prints it


__all__ = ["OutputError", "PrecisionError", "attach", "precision_error"]
