"""Every element type the project knows, in one table: its name, size and names in torch, numpy and ONNX.

Why one table: the IR, the ONNX importer, the compiled-program format and the runtime each kept their own
list of dtypes (byte sizes in ``compiled_program``, the dtypes an IR may hold inline in ``ops.values``, ONNX
element-type maps in the importer, numpy names in the runtime, the tensor-attribute and numpy-foldable
sets in the ONNX frontend), and the lists had drifted: one side could accept a dtype another refused or
sized differently. A row here is the one place a dtype is described; everything else is derived from
``DTYPES``, so adding a dtype (the packed ``int4``/``int2`` for quantization, say) is adding a row.

A dtype's ``name`` is the IR's name for it, which is torch's name without the ``torch.`` prefix where
torch has the type (``"float32"``, ``"bfloat16"``, ``"bool"``). Sub-byte types (``int4``, ``uint4``,
``int2``, ``uint2``, ``float4_e2m1fn``) are stored *packed*, several elements to a byte, so they have no
torch or numpy storage type (torch's own ``torch.int4`` and ml_dtypes' ``int4`` take a byte per element);
their sizes come from :func:`nbytes`, which rounds up to whole bytes.

This module imports neither torch nor numpy at import time: a compiled program (``.npubin``) names its
dtypes with these names and must be readable without either. The conversions import them when called.

Names come from files (IRs, programs, ONNX models), so a lookup of an unknown name is a ``ValueError`` that
lists the known names, never a guess and never ``getattr(torch, name)``::

    >>> get_dtype("bfloat16").itemsize
    2
    >>> nbytes(5, "int4")
    3
    >>> from_onnx(1)
    'float32'
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["float", "int", "uint", "bool", "complex"]


@dataclass(frozen=True)
class DType:
    """One element type.

    ``bits`` is the storage size of one element (8 for ``bool``; 4 for a packed ``int4``). ``torch_name``,
    ``numpy_name`` and ``onnx`` (the ``onnx.TensorProto`` element-type number) are None where that library
    has no storage type for it. ``ml_dtypes`` marks a ``numpy_name`` that numpy only knows once the
    ``ml_dtypes`` package is loaded (bfloat16, the float8 formats); the others are numpy's own.
    ``inline`` marks the dtypes whose values an IR may hold inline in ``constant_values`` (as JSON numbers).
    """

    name: str
    bits: int
    kind: Kind
    torch_name: str | None = None
    numpy_name: str | None = None
    onnx: int | None = None
    ml_dtypes: bool = False
    inline: bool = False

    @property
    def packed(self) -> bool:
        """Several elements share a byte (sub-byte dtypes): there is no per-element byte size."""
        return self.bits % 8 != 0

    @property
    def itemsize(self) -> int:
        """Bytes per element; a packed dtype has none (use :func:`nbytes`)."""
        if self.packed:
            raise ValueError(f"dtype {self.name} is packed ({self.bits} bits per element) and has no itemsize; "
                             "use torch_ir.dtypes.nbytes(numel, dtype)")
        return self.bits // 8

    @property
    def numpy_native(self) -> bool:
        """numpy has this dtype of its own (no ml_dtypes needed): ``np.asarray(...).astype(name)`` works."""
        return self.numpy_name is not None and not self.ml_dtypes

    def nbytes(self, numel: int) -> int:
        """Bytes that ``numel`` elements take, packed; a partly used last byte counts."""
        return nbytes(numel, self)


def _row(name: str, bits: int, kind: Kind, onnx: int | None, *, torch: bool = True, numpy: bool = True,
         ml_dtypes: bool = False, inline: bool = False) -> DType:
    return DType(name, bits, kind, torch_name=name if torch else None, numpy_name=name if numpy else None,
                 onnx=onnx, ml_dtypes=ml_dtypes, inline=inline)


#: The table, by name. ONNX numbers are ``onnx.TensorProto`` element types (FLOAT = 1, ...), written as
#: numbers so that onnx need not be installed; tests/test_dtypes.py checks them against onnx.
DTYPES: dict[str, DType] = {d.name: d for d in (
    _row("float64", 64, "float", 11, inline=True),
    _row("float32", 32, "float", 1, inline=True),
    _row("float16", 16, "float", 10, inline=True),
    _row("bfloat16", 16, "float", 16, ml_dtypes=True),
    _row("float8_e4m3fn", 8, "float", 17, ml_dtypes=True),
    _row("float8_e4m3fnuz", 8, "float", 18, ml_dtypes=True),
    _row("float8_e5m2", 8, "float", 19, ml_dtypes=True),
    _row("float8_e5m2fnuz", 8, "float", 20, ml_dtypes=True),
    _row("float8_e8m0fnu", 8, "float", 24, ml_dtypes=True),
    _row("int64", 64, "int", 7, inline=True),
    _row("int32", 32, "int", 6, inline=True),
    _row("int16", 16, "int", 5, inline=True),
    _row("int8", 8, "int", 3, inline=True),
    _row("uint64", 64, "uint", 13),
    _row("uint32", 32, "uint", 12),
    _row("uint16", 16, "uint", 4),
    _row("uint8", 8, "uint", 2, inline=True),
    _row("bool", 8, "bool", 9, inline=True),
    _row("complex128", 128, "complex", 15),
    _row("complex64", 64, "complex", 14),
    _row("complex32", 32, "complex", None, numpy=False),
    # packed sub-byte types (quantized weights): no torch or numpy storage
    _row("int4", 4, "int", 22, torch=False, numpy=False),
    _row("uint4", 4, "uint", 21, torch=False, numpy=False),
    _row("int2", 2, "int", 26, torch=False, numpy=False),
    _row("uint2", 2, "uint", 25, torch=False, numpy=False),
    _row("float4_e2m1fn", 4, "float", 23, torch=False, numpy=False),
)}

#: Names of the dtypes an IR may hold inline (``constant_values``); values must also be finite.
INLINE_DTYPES = frozenset(d.name for d in DTYPES.values() if d.inline)

_BY_TORCH = {d.torch_name: d for d in DTYPES.values() if d.torch_name is not None}
_BY_NUMPY = {d.numpy_name: d for d in DTYPES.values() if d.numpy_name is not None}
_BY_ONNX = {d.onnx: d for d in DTYPES.values() if d.onnx is not None}


def _known() -> str:
    return ", ".join(DTYPES)


def _show(value: Any) -> str:
    """``repr(value)``, shortened: values come from files and may be huge."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def get_dtype(name: str | DType) -> DType:
    """The table row of dtype ``name`` (a row is returned as it is); any other value is a ValueError."""
    if isinstance(name, DType):
        return name
    row = DTYPES.get(name) if isinstance(name, str) else None
    if row is None:
        raise ValueError(f"unknown dtype {_show(name)}; known dtypes: {_known()}")
    return row


def is_dtype(name: Any) -> bool:
    """Whether ``name`` is a dtype name of the table (any value may be asked, e.g. a field of a file)."""
    return isinstance(name, str) and name in DTYPES


def nbytes(numel: int, dtype: str | DType) -> int:
    """Bytes that ``numel`` elements of ``dtype`` take, packed: ``ceil(numel * bits / 8)``."""
    if isinstance(numel, bool) or not hasattr(numel, "__index__") or numel < 0:
        raise ValueError(f"element count must be a non-negative integer, got {_show(numel)}")
    return (operator.index(numel) * get_dtype(dtype).bits + 7) // 8


def torch_dtype(name: str | DType) -> Any:
    """The ``torch.dtype`` of ``name``; a ValueError for an unknown name or one torch cannot store."""
    row = get_dtype(name)
    if row.torch_name is None:
        raise ValueError(f"dtype {row.name} has no torch dtype ({row.bits}-bit elements are stored packed)")
    import torch

    return getattr(torch, row.torch_name)


def from_torch(dtype: Any) -> str:
    """The table name of a ``torch.dtype``; a ValueError for one the table lacks (quantized types, ...)."""
    import torch

    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"expected a torch.dtype, got {type(dtype).__name__}")
    row = _BY_TORCH.get(str(dtype).removeprefix("torch."))
    if row is None:
        raise ValueError(f"torch dtype {dtype} has no entry in torch_ir.dtypes; known dtypes: {_known()}")
    return row.name


def numpy_dtype(name: str | DType) -> Any:
    """The ``numpy.dtype`` of ``name`` (bfloat16 and float8 from ml_dtypes); a ValueError where there is none."""
    row = get_dtype(name)
    if row.numpy_name is None:
        raise ValueError(f"dtype {row.name} has no numpy dtype")
    import numpy as np

    if row.ml_dtypes:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, row.numpy_name))
    return np.dtype(row.numpy_name)


def from_numpy(dtype: Any) -> str:
    """The table name of a numpy dtype (or anything ``numpy.dtype()`` accepts); a ValueError for others."""
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"{_show(dtype)} is not a numpy dtype") from None
    row = _BY_NUMPY.get(dt.name)
    if row is None:
        raise ValueError(f"numpy dtype {dt.name} has no entry in torch_ir.dtypes; known dtypes: {_known()}")
    return row.name


def from_onnx(elem_type: int) -> str:
    """The table name of an ONNX ``TensorProto`` element type; a ValueError for one the table lacks."""
    row = _BY_ONNX.get(elem_type) if isinstance(elem_type, int) and not isinstance(elem_type, bool) else None
    if row is None:
        raise ValueError(f"ONNX element type {_show(elem_type)} has no entry in torch_ir.dtypes")
    return row.name


def onnx_elem(name: str | DType) -> int:
    """The ONNX ``TensorProto`` element type of ``name``; a ValueError where ONNX has none."""
    row = get_dtype(name)
    if row.onnx is None:
        raise ValueError(f"dtype {row.name} has no ONNX element type")
    return row.onnx


def name_of(dtype: Any) -> str:
    """For messages: the table name of a torch or numpy dtype (or dtype name), else the dtype's own text."""
    if isinstance(dtype, str):
        return dtype
    convert = from_torch if type(dtype).__module__.partition(".")[0] == "torch" else from_numpy
    try:
        return convert(dtype)
    except ValueError:
        return str(dtype).removeprefix("torch.")
