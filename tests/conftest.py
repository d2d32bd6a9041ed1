"""Test hygiene: the ops a test module registers (the onnx.* ops an ONNX import keeps, say) are removed again
after it.

The ONNX importer registers the reference implementation of every ONNX op it keeps, on demand (in tests/onnx,
tests/dynamic, tests/tools, ...); without this, which ops the global registry holds (and what the generated
operator docs would show) would depend on which tests ran before.
"""

from __future__ import annotations

import pytest

from torch_ir.ops.registry import registered_ops, unregister_op


@pytest.fixture(autouse=True, scope="module")
def _restore_op_registry():
    before = set(registered_ops())
    yield
    for op_type in set(registered_ops()) - before:
        unregister_op(op_type)
