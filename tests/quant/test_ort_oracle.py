"""The oracle itself: onnxruntime's MatMulInteger against numpy's exact integer product, on operands that overflow an
int16 pair sum (uint8 255 times int8 127, twice: 64770). Exact wherever ``tests/ort_oracle.py`` lets the bit-for-bit
comparisons run; not exact where it skips them (if a newer onnxruntime is exact there, this fails: run them again)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ort_oracle import U8S8_SATURATES

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def test_onnxruntime_matmulinteger_is_exact_where_we_compare_with_it():
    from onnx import TensorProto, helper

    a = np.full((4, 64), 255, dtype=np.uint8)
    b = np.full((64, 8), 127, dtype=np.int8)
    b[:, 1::2] = -128
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape),
                               helper.make_tensor_value_info("b", TensorProto.INT8, b.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = session.run(None, {"a": a, "b": b})[0]
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert np.array_equal(y, exact) == (not U8S8_SATURATES), (U8S8_SATURATES, int(np.abs(y - exact).max()))
