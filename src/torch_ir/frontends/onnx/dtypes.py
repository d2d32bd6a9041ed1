"""ONNX element types <-> the IR's dtype names <-> numpy, through the one dtype table (``torch_ir.dtypes``)."""

from __future__ import annotations

import numpy as np
import onnx
import torch

from torch_ir import dtypes

from ...errors import ExtractionError
from ...ops.values import dtype_from_name

TP = onnx.TensorProto

#: ONNX element type -> IR dtype name, for the types the IR can hold: those with a torch dtype, and the 4-bit
#: quantized ones (INT4, UINT4: held packed two per byte, ``torch_ir.quant.spec.stored``). Strings and the other
#: sub-byte types (INT2, FLOAT4E2M1, ...) are absent. Derived from ``torch_ir.dtypes.DTYPES``.
ONNX_TO_IR: dict[int, str] = {d.onnx: d.name for d in dtypes.DTYPES.values()
                              if d.onnx is not None and (d.torch_name is not None or d.name in ("int4", "uint4"))}
IR_TO_ONNX = {v: k for k, v in ONNX_TO_IR.items()}
#: A 4-bit tensor that cannot be packed two per byte along its last dim (odd, symbolic, or a scalar) is held one
#: code per byte in the wider type: the same codes, exactly.
WIDE = {"int4": "int8", "uint4": "uint8"}


def packable(shape: list) -> bool:
    """Whether a 4-bit tensor of ``shape`` packs two per byte along its last dim (an even, static one)."""
    return bool(shape) and isinstance(shape[-1], int) and shape[-1] % 2 == 0


def held_dtype(dtype: str, shape: list) -> str:
    """The IR dtype a tensor of ONNX type ``dtype`` and ``shape`` has: ``dtype``, or the wider type (``WIDE``)
    for a 4-bit one that cannot be packed."""
    return WIDE[dtype] if dtype in WIDE and not packable(list(shape)) else dtype


def ir_dtype(elem_type: int, where: str) -> str:
    """The IR dtype name of an ONNX element type, or an error naming ``where`` it occurs.

    Example::

        >>> ir_dtype(onnx.TensorProto.FLOAT, "input x")
        'float32'
    """
    try:
        return ONNX_TO_IR[elem_type]
    except KeyError:
        name = TP.DataType.Name(elem_type) if elem_type in TP.DataType.values() else str(elem_type)
        raise ExtractionError(
            f"{where} has ONNX element type {name}, which the IR cannot hold (no torch dtype); "
            "cast it to a supported type in the model"
        ) from None


def to_torch(array: np.ndarray, dtype: str) -> torch.Tensor:
    """A numpy array (as onnx.numpy_helper gives it) as a CPU tensor of the IR dtype ``dtype``."""
    array = np.asarray(array)
    if dtype in WIDE:  # 4-bit codes (one per byte in numpy, as ml_dtypes holds them) packed two per byte
        from ...quant.numerics import pack4

        return pack4(torch.from_numpy(array.astype(np.int8 if dtype == "int4" else np.uint8)))
    if dtypes.name_of(array.dtype) in WIDE:  # 4-bit codes held one per byte (WIDE)
        array = array.astype(np.int8 if dtypes.name_of(array.dtype) == "int4" else np.uint8)
    if dtypes.get_dtype(dtype).ml_dtypes:
        # numpy holds these as ml_dtypes (or raw uint16/uint8); go through their bit pattern
        bits = {1: torch.uint8, 2: torch.uint16}[array.dtype.itemsize]
        flat = np.ascontiguousarray(array.reshape(-1)).view(f"uint{8 * array.dtype.itemsize}")
        return torch.from_numpy(flat.copy()).view(bits).view(dtype_from_name(dtype)).reshape(array.shape)
    return torch.from_numpy(np.array(array, copy=True)).to(dtype_from_name(dtype))


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor as the numpy array ONNX tools (onnxruntime, onnx.reference) expect."""
    tensor = tensor.detach().cpu()
    name = dtypes.name_of(tensor.dtype)
    row = dtypes.DTYPES.get(name)
    if row is not None and row.ml_dtypes:  # bfloat16, float8: numpy has them through ml_dtypes; reinterpret bits
        bits = tensor.view({1: torch.uint8, 2: torch.uint16}[row.itemsize]).numpy()
        return bits.view(dtypes.numpy_dtype(row))
    return tensor.numpy()
