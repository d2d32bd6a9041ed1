"""Inputs for an IR on the command line: the ``--input`` arrays given, and seeded ones for the rest
(``torch-ir verify``, ``verify-onnx``, ``bisect``); and the one ``--markdown [FILE]`` writer.

Floats are normal, an integer input that indexes a table (a token id) stays below the table's size, other
integers and bools take an example's values where there is one (positions and masks have ranges the graph does
not state), else small non-negative ints. Every shape is checked against the allocation limit before anything is
allocated, and dtypes are read through the checked name table (never ``getattr(torch, <a name from a file>)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .errors import InputMismatchError
from .ir import NPU_IR
from .limits import check_shape
from .ops.values import dtype_from_name

_SMALL_INT = 8  # the bound of an integer input nothing in the graph bounds
# ops that index a table with an integer input: op -> (position of the table, position of the index, table axis)
_INDEXING = {"aten.embedding.default": (0, 1, 0), "EMBEDDING": (0, 1, 0), "aten.index_select.default": (0, 2, None)}


def random_inputs(ir: NPU_IR, seed: int = 0, *, examples: Sequence[torch.Tensor] | None = None,
                  shapes: Mapping[str, Sequence[int]] | None = None,
                  error: type[Exception] = InputMismatchError) -> list[torch.Tensor]:
    """Seeded inputs for ``ir.graph_inputs``: normal floats, valid indices, example values for other ints.

    Example::

        x, ids = random_inputs(ir, seed=0, shapes={"ids": [1, 16]})

    Shapes are the IR's, with symbolic ones taken from ``shapes`` (by input name) or the example's. An
    integer input that indexes a table (``aten.embedding``, ``EMBEDDING``, ``aten.index_select``) stays below
    the table's size; any other integer or bool input takes the example's values when there is one (positions
    and masks have ranges the graph does not state), else small non-negative ints (random bools). A symbolic
    dimension nothing binds raises ``error`` (a command line passes its usage error).
    """
    g = torch.Generator().manual_seed(seed)
    bounds = index_bounds(ir)
    out = []
    for i, meta in enumerate(ir.graph_inputs):
        example = examples[i] if examples is not None else None
        shape = _concrete_shape(ir, meta, (shapes or {}).get(meta.name), example, error)
        dtype = dtype_from_name(meta.dtype)  # a checked name: never getattr(torch, <a name from a file>)
        check_shape(shape, dtype.itemsize, f"random input {meta.name!r}")  # before allocating it
        if dtype.is_floating_point or dtype.is_complex:
            out.append(torch.randn(shape, generator=g).to(dtype))
        elif meta.name in bounds:
            out.append(torch.randint(0, bounds[meta.name], shape, generator=g).to(dtype))
        elif example is not None and list(example.shape) == shape:
            out.append(example.clone())
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            out.append(torch.randint(0, _SMALL_INT, shape, generator=g).to(dtype))
    return out


def given_or_random_inputs(ir: NPU_IR, given: Sequence[str], seed: int = 0, *,
                           shapes: Mapping[str, Sequence[int]] | None = None,
                           error: type[Exception] = InputMismatchError) -> list[torch.Tensor]:
    """The command line's inputs: the arrays of its ``--input`` options (``torch_ir.arrays.read_cli_inputs``),
    seeded random ones (:func:`random_inputs`) for the graph inputs they leave out, in graph order."""
    from .arrays import read_cli_inputs

    arrays = read_cli_inputs(given, [t.name for t in ir.graph_inputs])
    shapes = {**(shapes or {}), **{name: list(a.shape) for name, a in arrays.items()}}
    values = random_inputs(ir, seed, shapes=shapes, error=error)
    return [torch.from_numpy(arrays[t.name]) if t.name in arrays else v for t, v in zip(ir.graph_inputs, values)]


def write_report(markdown: str | None, to_markdown: Callable[[], str], text: str) -> None:
    """``--markdown [FILE]``: the Markdown report to FILE (atomically) or to standard output (no FILE, or
    ``-``); without the flag, the plain ``text``."""
    if markdown is None:
        print(text)
    elif markdown == "-":
        print(to_markdown())
    else:
        from .fileio import atomic_write

        atomic_write(markdown, to_markdown(), what="Markdown report")
        print(f"{text}\nwrote {markdown}")


def index_bounds(ir: NPU_IR) -> dict[str, int]:
    """Graph input name -> the smallest table size it indexes (a token id's vocabulary)."""
    inputs = {t.name for t in ir.graph_inputs}
    bounds: dict[str, int] = {}
    for node in ir.nodes:
        where = _INDEXING.get(node.op_type)
        if where is None or len(node.inputs) < 2:
            continue
        table_at, index_at, axis = where
        index = node.inputs[min(index_at, len(node.inputs) - 1)]
        if index.name not in inputs or index.dtype.startswith(("float", "bfloat", "bool")):
            continue
        axis = axis if axis is not None else int(node.attrs.get("dim", 0))
        size = node.inputs[table_at].shape[axis] if node.inputs[table_at].rank > axis else None
        if isinstance(size, int) and size > 0:
            bounds[index.name] = min(bounds.get(index.name, size), size)
    return bounds


def _concrete_shape(ir: NPU_IR, meta: Any, bound: Sequence[int] | None, example: torch.Tensor | None,
                    error: type[Exception]) -> list[int]:
    if bound is not None:
        shape = list(bound)
    elif meta.is_static:
        return list(meta.shape)
    elif example is not None:
        shape = list(example.shape)
    else:
        shape = list(meta.shape)
    if len(shape) != meta.rank or not all(isinstance(d, int) and d >= 0 for d in shape):
        example_dims = ",".join(str(d if isinstance(d, int) else 1) for d in meta.shape)
        raise error(f"input {meta.name!r} of IR {ir.model_name!r} has shape {meta.shape}; bind its "
                                 f"symbolic dimensions: input_shapes={{{meta.name!r}: [{example_dims}]}} in Python, "
                                 f"--input-shape {meta.name}={example_dims} on the command line")
    return shape


__all__ = ["given_or_random_inputs", "index_bounds", "random_inputs", "write_report"]
