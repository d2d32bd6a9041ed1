"""ONNX element types <-> the IR's dtype names (torch's names) <-> numpy, in one table."""

from __future__ import annotations

import numpy as np
import onnx
import torch

from ...errors import ExtractionError
from ...ops.values import dtype_from_name

TP = onnx.TensorProto

#: ONNX element type -> IR dtype name. Types torch cannot hold (strings, 4-bit ints) are absent.
ONNX_TO_IR: dict[int, str] = {
    TP.FLOAT: "float32", TP.DOUBLE: "float64", TP.FLOAT16: "float16", TP.BFLOAT16: "bfloat16",
    TP.INT8: "int8", TP.INT16: "int16", TP.INT32: "int32", TP.INT64: "int64",
    TP.UINT8: "uint8", TP.UINT16: "uint16", TP.UINT32: "uint32", TP.UINT64: "uint64",
    TP.BOOL: "bool", TP.COMPLEX64: "complex64", TP.COMPLEX128: "complex128",
    TP.FLOAT8E4M3FN: "float8_e4m3fn", TP.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    TP.FLOAT8E5M2: "float8_e5m2", TP.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
}
IR_TO_ONNX = {v: k for k, v in ONNX_TO_IR.items()}


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
    if dtype == "bfloat16" or dtype.startswith("float8"):
        # numpy holds these as ml_dtypes (or raw uint16/uint8); go through their bit pattern
        bits = {1: torch.uint8, 2: torch.uint16}[array.dtype.itemsize]
        flat = np.ascontiguousarray(array.reshape(-1)).view(f"uint{8 * array.dtype.itemsize}")
        return torch.from_numpy(flat.copy()).view(bits).view(dtype_from_name(dtype)).reshape(array.shape)
    return torch.from_numpy(np.array(array, copy=True)).to(dtype_from_name(dtype))


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor as the numpy array ONNX tools (onnxruntime, onnx.reference) expect."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16 or "float8" in str(tensor.dtype):
        import ml_dtypes

        bits = tensor.view(torch.uint16 if tensor.dtype == torch.bfloat16 else torch.uint8).numpy()
        target = {torch.bfloat16: ml_dtypes.bfloat16, torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
                  torch.float8_e5m2: ml_dtypes.float8_e5m2, torch.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
                  torch.float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz}[tensor.dtype]
        return bits.view(target)
    return tensor.numpy()
