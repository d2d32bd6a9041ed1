"""Subjects from an IR and its weights; the IR's own reference execution is trusted."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from torch_ir.errors import WeightsMismatchError
from torch_ir.executor import IRExecutor
from torch_ir.inputs import random_inputs
from torch_ir.ir import NPU_IR, OpNode, load_ir

from .subject import Subject, WeightsUsed, given_inputs, given_weights


def subject_from_ir(ir: NPU_IR | str | os.PathLike, weights: Any = None, inputs: Sequence[Any] | None = None, *,
                    seed: int = 0, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Subject:
    """A subject from an IR (object or JSON path) and its weights; the IR's own reference execution is trusted.

    Example::

        subject = subject_from_ir("model.json", "model.safetensors")

    Without a source model nothing outside the IR can be trusted: the stages after extraction (normalize,
    compile, the backends) are compared with ``IRExecutor`` on the IR as given. ``weights`` defaults to the
    file the IR names (``metadata["weights_file"]``) or the ``.safetensors`` beside a JSON path.
    """
    from torch_ir.weights import load_state_dict

    # given weights are read first: a missing or unreadable file is told before the IR is read
    state = load_state_dict(weights) if weights is not None else None
    path = None
    if not isinstance(ir, NPU_IR):
        path = Path(ir)
        ir = load_ir(path)
    used = given_weights(weights) if weights is not None else WeightsUsed("none", "none (the IR has no weights)")
    if state is None:
        beside = _weights_beside(ir, path)
        state = load_state_dict(beside) if beside is not None else {}
        used = WeightsUsed.file(beside) if beside is not None else used
    shapes = {k: list(v) for k, v in (input_shapes or {}).items()}
    values = given_inputs(ir, inputs, ir.model_name) if inputs is not None else random_inputs(ir, seed, shapes=shapes)
    executor = IRExecutor(ir, state)  # binds the weights now: a mismatch is told before any bisection

    def run_trusted() -> list[torch.Tensor]:
        return executor.run(values)

    def trusted_values() -> dict[str, torch.Tensor]:
        found = dict(zip((t.name for t in ir.graph_inputs), values))

        def keep(node: OpNode, outs: list[torch.Tensor]) -> None:
            found.update({meta.name: v for meta, v in zip(node.outputs, outs)})

        executor.run_traced(values, keep)
        return found

    return Subject(name=ir.model_name, ir=ir, weights=state, inputs=values, trusted="the IR's reference execution",
                   run_trusted=run_trusted, trusted_values=trusted_values, frontend=None, weights_used=used)


def _weights_beside(ir: NPU_IR, path: Path | None) -> Path | None:
    if not ir.weights:
        return None
    named = ir.metadata.get("weights_file")
    candidates = [path.parent / Path(named).name] if path is not None and isinstance(named, str) else []
    if path is not None:
        candidates.append(path.with_suffix(".safetensors"))
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        where = f"IR {str(path)!r}" if path is not None else f"IR {ir.model_name!r}"
        text = f"{where} has {len(ir.weights)} weights and no weights were given" \
            + (f" (none of {[str(c) for c in candidates]} exists)" if candidates else "")
        raise WeightsMismatchError(text + "; pass weights= (a .safetensors file or a state dict)",
                                   cli=text + "; give --weights FILE (a .safetensors or .pt file)")
    return found
