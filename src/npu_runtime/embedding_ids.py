"""The ids of an EMBEDDING, checked where they enter a program: the Executor's copy-in.

An id outside the table must be an error, as in eager PyTorch (``F.embedding`` raises IndexError), not the
embedding of another token. The op's reference raises for one (the CPU backend's kernel, host dispatches and
``validate=True`` run it), but a WebGPU shader cannot raise, and per-element checks in a kernel's hot loop
would cost every run. So the Executor checks each graph input that feeds an EMBEDDING's ids (directly,
through views, or through an integer cast such as the ONNX importer's to int64) when it is copied in: one
min and max over a small integer array. Ids a program computes itself (the argmax of logits) are in range by
construction; the shader clamps them all the same, so no read leaves the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from npu_program.memory_check import alias_roots
from npu_program.program import CompiledProgram, Dispatch, TensorSpec
from torch_ir.ops.npu import embedding_id_problem

from .device import RuntimeInputError

#: Casts through which an input still counts as the ids it becomes, when they keep its values (see _widens).
_CASTS = ("aten._to_copy.default",)
_INTEGERS = ("int8", "uint8", "int16", "int32", "int64")


@dataclass(frozen=True)
class IdsCheck:
    """One EMBEDDING whose ids come from a graph input: where it is, its table's rows and its id rule."""

    dispatch: int
    node: str
    rows: int
    negative_wraps: bool


def ids_checks(program: CompiledProgram, specs: Mapping[str, TensorSpec]) -> dict[str, list[IdsCheck]]:
    """Graph input name -> the EMBEDDINGs whose ids it is (usually none or one)."""
    inputs = {s.name for s in program.input_specs}
    roots = alias_roots(program.memory.aliases)
    producers = {name: d for d in program.dispatches for name in d.outputs}
    checks: dict[str, list[IdsCheck]] = {}
    for index, dispatch in enumerate(program.dispatches):
        if dispatch.kernel != "EMBEDDING" or len(dispatch.inputs) != 2:
            continue
        table = specs[dispatch.inputs[0]].shape
        source = _source_input(dispatch.inputs[1], roots, producers, specs)
        if source in inputs and table:  # a table of no rank is refused later, by its shape check
            checks.setdefault(source, []).append(
                IdsCheck(index, dispatch.node, int(table[0]), bool(dispatch.params.get("negative_wraps", False))))
    return checks


def _source_input(name: str, roots: Mapping[str, str], producers: Mapping[str, Dispatch],
                  specs: Mapping[str, TensorSpec]) -> str:
    """The tensor ``name``'s values come from, through views and value-keeping integer casts."""
    seen: set[str] = set()
    while name not in seen:  # a hostile program may loop; a cycle ends the walk
        seen.add(name)
        name = roots.get(name, name)
        cast = producers.get(name)
        if cast is None or cast.kernel not in _CASTS or len(cast.inputs) != 1 \
                or not _widens(specs[cast.inputs[0]].dtype, specs[name].dtype):
            return name
        name = cast.inputs[0]
    return name


def _widens(src: str, dst: str) -> bool:
    """A cast to int64 keeps every value of a narrower integer (int32 ids made int64 by the ONNX importer)."""
    return dst == "int64" and src in _INTEGERS


def check_ids(array: np.ndarray, name: str, checks: list[IdsCheck], model: str) -> None:
    """Raise ``RuntimeInputError`` if ``array`` (the graph input ``name``) holds an id outside a table it
    indexes; the message names the input, the id, the table's size and the dispatch that reads it."""
    if array.size == 0:
        return
    low, high = int(array.min()), int(array.max())
    for check in checks:
        problem = embedding_id_problem(low, high, check.rows, check.negative_wraps)
        if problem is not None:
            raise RuntimeInputError(
                f"input {name!r} of program {model!r}: {problem}; it is read by dispatch {check.dispatch} "
                f"(EMBEDDING, node {check.node!r})")
