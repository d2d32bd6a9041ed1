"""Static shapes for a program: bind an IR's symbolic dimensions before it is compiled.

A program is planned for static shapes. An IR exported with a dynamic batch (``torch.export.Dim``, an
ONNX ``dim_param``) has symbols in its graph inputs' shapes; ``compile(ir, bind={"batch": 1})`` or
``compile(ir, input_shapes={"x": [1, 16]})`` (``torch-ir compile --bind batch=1`` / ``--input-shape
x=1,16``) fixes them with ``torch_ir.ir.specialize`` (sizes checked against each symbol's exported range).
An IR whose graph inputs are still symbolic is refused once, naming the symbols and how to bind them,
instead of once per node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch_ir.ir import NPU_IR
from torch_ir.ir.specialize import specialize
from torch_ir.ir.validate import IRValidationError

from .errors import CompileError


def bind_shapes(ir: NPU_IR, bind: Mapping[str, int] | None = None,
                input_shapes: Mapping[str, Sequence[int]] | None = None) -> NPU_IR:
    """``ir`` with the symbols of ``bind`` and those ``input_shapes`` determine replaced by their sizes."""
    sizes = dict(bind or {})
    for name, shape in (input_shapes or {}).items():
        _sizes_from_shape(ir, name, list(shape), sizes)
    if not sizes:
        return ir
    try:
        return specialize(ir, sizes)
    except IRValidationError as e:
        raise CompileError(str(e)) from None


def check_static_inputs(ir: NPU_IR) -> None:
    """Refuse, once, an IR whose graph inputs still have symbolic dimensions."""
    dynamic = [(t.name, list(t.shape)) for t in ir.graph_inputs if not t.is_static]
    if not dynamic:
        return
    symbols = sorted({d for _, shape in dynamic for d in shape if isinstance(d, str)})
    example_bind = ",".join(f"{s}=1" for s in symbols)
    name, shape = dynamic[0]
    example_shape = ",".join(str(d) if isinstance(d, int) else "1" for d in shape)
    shapes = "; ".join(f"{n}: {s}" for n, s in dynamic)
    raise CompileError(
        f"IR {ir.model_name!r} has symbolic input dimensions ({', '.join(symbols)}; {shapes}), and a program is "
        f"planned for static shapes: bind them (torch-ir compile --bind {example_bind.replace(',', ' --bind ')}, "
        f"or --input-shape {name}={example_shape}; in Python compile(ir, bind={{...}}) or input_shapes=...), "
        "or run the IR with torch_ir.IRExecutor")


def _sizes_from_shape(ir: NPU_IR, name: str, shape: list[int], sizes: dict[str, int]) -> None:
    inputs = {t.name: t for t in ir.graph_inputs}
    if name not in inputs:
        raise CompileError(f"IR {ir.model_name!r} has no graph input {name!r} to give a shape; its inputs are "
                           f"{', '.join(inputs)}")
    declared = list(inputs[name].shape)
    if len(declared) != len(shape):
        raise CompileError(f"input {name!r} has {len(declared)} dimensions {declared}; the shape given has "
                           f"{len(shape)}: {shape}")
    for dim, (want, given) in enumerate(zip(declared, shape)):
        if isinstance(want, int) and want != given:
            raise CompileError(f"input {name!r} dimension {dim} is {want} in the IR; the shape given says {given}")
        if isinstance(want, str) and want in ir.symbols:
            if sizes.setdefault(want, given) != given:
                raise CompileError(f"symbol {want!r} is bound twice with different sizes ({sizes[want]} and "
                                   f"{given}, from input {name!r})")


__all__ = ["bind_shapes", "check_static_inputs"]
