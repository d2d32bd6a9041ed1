"""The one dtype table (``torch_ir.dtypes``) against torch, numpy and onnx, and its refusals."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torch_ir import dtypes
from torch_ir.dtypes import DTYPES, DType

ROWS = list(DTYPES.values())
IDS = [d.name for d in ROWS]
MODULE = Path(dtypes.__file__)


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_row_is_consistent(row: DType) -> None:
    assert row.bits > 0 and row.kind in ("float", "int", "uint", "bool", "complex")
    assert row.packed == (row.bits < 8)
    if row.packed:
        with pytest.raises(ValueError, match="packed"):
            _ = row.itemsize
        assert row.torch_name is None and row.numpy_name is None  # packed: no storage type in either
        assert not row.inline
    else:
        assert row.itemsize * 8 == row.bits
    if row.inline:  # inline values are JSON numbers that numpy and torch both hold
        assert row.numpy_native and row.torch_name is not None


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("row", [d for d in ROWS if d.torch_name], ids=[d.name for d in ROWS if d.torch_name])
def test_torch_agrees(row: DType) -> None:
    t = dtypes.torch_dtype(row.name)
    assert isinstance(t, torch.dtype)
    assert torch.empty((), dtype=t).element_size() * 8 == row.bits
    assert dtypes.from_torch(t) == row.name
    assert str(t) == f"torch.{row.name}"  # the IR's names are torch's names
    kind = "bool" if t == torch.bool else "complex" if t.is_complex else "float" if t.is_floating_point else (
        "int" if t.is_signed else "uint")
    assert kind == row.kind


@pytest.mark.parametrize("row", [d for d in ROWS if d.numpy_name], ids=[d.name for d in ROWS if d.numpy_name])
def test_numpy_agrees(row: DType) -> None:
    dt = dtypes.numpy_dtype(row.name)
    assert isinstance(dt, np.dtype)
    assert dt.itemsize * 8 == row.bits
    assert dtypes.from_numpy(dt) == row.name
    assert np.zeros(3, dtype=dt).nbytes == dtypes.nbytes(3, row.name)
    if row.numpy_native:
        assert dt.kind == {"float": "f", "int": "i", "uint": "u", "bool": "b", "complex": "c"}[row.kind]


def test_numpy_native_and_ml_dtypes() -> None:
    assert dtypes.from_numpy(np.bool_) == "bool" and dtypes.from_numpy("float32") == "float32"
    assert {d.name for d in ROWS if d.ml_dtypes} == {"bfloat16", *(d.name for d in ROWS if "float8" in d.name)}
    for name in ("object", np.str_, "datetime64[s]", np.longdouble):
        with pytest.raises(ValueError):
            dtypes.from_numpy(name)


def test_onnx_numbers_match_onnx() -> None:
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    numbers = {d.name: d.onnx for d in ROWS if d.onnx is not None}
    assert len(set(numbers.values())) == len(numbers)  # one table name per ONNX type
    expected = {"float32": "FLOAT", "float64": "DOUBLE", "float16": "FLOAT16", "bfloat16": "BFLOAT16",
                "bool": "BOOL", "complex64": "COMPLEX64", "int4": "INT4", "uint2": "UINT2",
                "float4_e2m1fn": "FLOAT4E2M1", "float8_e8m0fnu": "FLOAT8E8M0"}
    for name, proto in expected.items():
        assert numbers[name] == getattr(TensorProto, proto)
    for row in ROWS:
        if row.onnx is None:
            continue
        assert dtypes.from_onnx(row.onnx) == row.name and dtypes.onnx_elem(row.name) == row.onnx
        np_dt = helper.tensor_dtype_to_np_dtype(row.onnx)
        # onnx's numpy dtype is ml_dtypes' for the exotic ones, unpacked (a byte each) for the sub-byte ones
        assert np_dt.name == (row.numpy_name or row.name)
        if not row.packed:
            assert np_dt.itemsize * 8 == row.bits
        if row.numpy_name:
            assert helper.np_dtype_to_tensor_dtype(dtypes.numpy_dtype(row.name)) == row.onnx
    assert dtypes.from_onnx(TensorProto.FLOAT) == "float32"
    for elem in (TensorProto.STRING, TensorProto.UNDEFINED, 999, -1, True, "1", None):
        with pytest.raises(ValueError):
            dtypes.from_onnx(elem)
    with pytest.raises(ValueError, match="no ONNX element type"):
        dtypes.onnx_elem("complex32")


def test_onnx_importer_maps_come_from_the_table() -> None:
    pytest.importorskip("onnx")
    from torch_ir.frontends.onnx.dtypes import IR_TO_ONNX, ONNX_TO_IR

    # the types torch holds, and the 4-bit quantized ones, which the importer holds packed (quant.spec.stored)
    assert set(ONNX_TO_IR.values()) == {d.name for d in ROWS if d.onnx is not None and d.torch_name} | {"int4", "uint4"}
    assert "int2" not in IR_TO_ONNX and "float4_e2m1fn" not in IR_TO_ONNX  # packed: the IR cannot hold these


@pytest.mark.parametrize(("numel", "dtype", "expected"), [
    (0, "int4", 0), (1, "int4", 1), (2, "int4", 1), (3, "int4", 2), (5, "uint4", 3), (1, "int2", 1),
    (4, "int2", 1), (5, "int2", 2), (9, "uint2", 3), (7, "float4_e2m1fn", 4), (3, "float32", 12), (3, "bool", 3),
    (2, "complex128", 32), (0, "float64", 0),
])
def test_nbytes_packs(numel: int, dtype: str, expected: int) -> None:
    assert dtypes.nbytes(numel, dtype) == expected == DTYPES[dtype].nbytes(numel)


def test_nbytes_refuses_bad_counts() -> None:
    for bad in (-1, 1.5, True, "3", None):
        with pytest.raises(ValueError):
            dtypes.nbytes(bad, "float32")
    assert dtypes.nbytes(np.int64(3), "int4") == 2


@pytest.mark.parametrize("name", ["float", "half", "qint8", "quint4x2", "complex", "Float32", "torch.float32",
                                  "__class__", "", "x" * 10_000, None, 1, ["float32"], {"a": 1}])
def test_unknown_names_refused(name: object) -> None:
    with pytest.raises(ValueError, match="unknown dtype") as info:
        dtypes.get_dtype(name)  # type: ignore[arg-type]
    assert "float32" in str(info.value) and len(str(info.value)) < 600  # lists the known names, not the input
    assert not dtypes.is_dtype(name)
    from torch_ir.ops.values import dtype_from_name

    with pytest.raises(ValueError):
        dtype_from_name(name)  # type: ignore[arg-type]


def test_conversions_refuse_what_a_library_lacks() -> None:
    with pytest.raises(ValueError, match="no torch dtype"):
        dtypes.torch_dtype("int4")
    with pytest.raises(ValueError, match="no numpy dtype"):
        dtypes.numpy_dtype("complex32")
    with pytest.raises(ValueError, match="no entry"):
        dtypes.from_torch(torch.qint8)
    with pytest.raises(ValueError):
        dtypes.from_torch("float32")
    assert dtypes.from_torch(torch.float) == "float32" and dtypes.from_torch(torch.long) == "int64"


def test_name_of_for_messages() -> None:
    assert dtypes.name_of(torch.bfloat16) == "bfloat16" and dtypes.name_of(np.dtype("int8")) == "int8"
    assert dtypes.name_of(np.dtype(object)) == "object" and dtypes.name_of(torch.qint8) == "qint8"


def test_wrappers_use_the_table() -> None:
    from npu_compiler.compiled_program import TensorSpec, dtype_size
    from torch_ir.ops.values import INLINE_DTYPES, dtype_from_name, dtype_name

    for row in ROWS:
        if not row.packed:
            assert dtype_size(row.name) == row.itemsize
        if row.torch_name:
            assert dtype_name(dtype_from_name(row.name)) == row.name
    assert INLINE_DTYPES == {d.name for d in ROWS if d.inline}
    assert TensorSpec("w", [3, 5], "int4").nbytes == 8
    with pytest.raises(ValueError, match="packed"):
        dtype_size("int4")
    with pytest.raises(ValueError, match="unknown dtype 'qint8'"):
        dtype_size("qint8")


def test_ir_document_refuses_unknown_dtype() -> None:
    from torch_ir.errors import IRValidationError
    from torch_ir.ir import NPU_IR, TensorMeta, check_document, ir_to_dict

    x = TensorMeta("x", [2], "float32", role="input")
    doc = ir_to_dict(NPU_IR(model_name="m", graph_inputs=[x], graph_outputs=[x], weights=[], nodes=[]))
    check_document(doc)
    doc["graph_inputs"][0]["dtype"] = "int4"  # packed, no torch dtype, but a dtype: the format holds it
    check_document(doc)
    for bad in ("qint8", "float", "x" * 500):
        doc["graph_inputs"][0]["dtype"] = bad
        with pytest.raises(IRValidationError, match=r"<dict>: graph_inputs\[0\]\.dtype: unknown dtype '") as info:
            check_document(doc)
        assert len(str(info.value)) < 600


def test_module_imports_neither_torch_nor_numpy() -> None:
    """The module on its own (as a program reader would load it) pulls in neither torch nor numpy."""
    code = (f"import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('dtypes_alone', {str(MODULE)!r})\n"
            "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)\n"
            "assert m.nbytes(3, 'int4') == 2 and m.get_dtype('bfloat16').itemsize == 2\n"
            "print(sorted(k for k in ('torch', 'numpy') if k in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert importlib.util.find_spec("torch_ir.dtypes") is not None


def test_import_the_dtype_table_does_not_import_torch() -> None:
    """The table lives in torch_ir's base, which the kernel table (and so a program reader) imports
    without torch."""
    code = "import sys, torch_ir.dtypes, npu_program.kernels; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
