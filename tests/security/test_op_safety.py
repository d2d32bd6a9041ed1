"""The generic ``torch.ops`` path runs model ops only: an op type read from a file cannot name an op that
touches files, processes or global state, and a misspelled attribute is refused, not defaulted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from torch_ir import IRExecutor
from torch_ir.errors import IRValidationError, UnsafeInputError
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.ops.registry import DENIED_NAMESPACES, bind_kernel, is_supported


def one_node_ir(op_type: str, attrs: dict, inputs=("x",), out_shape=(4,)) -> NPU_IR:
    x = [TensorMeta(n, [4], "float32", role="input") for n in inputs]
    y = TensorMeta("y", list(out_shape), "float32")
    return NPU_IR(model_name="hostile", graph_inputs=x, graph_outputs=[y], weights=[],
                  nodes=[OpNode("n0", op_type, list(x), [y], attrs)])


@pytest.mark.parametrize(("op_type", "rule"), [
    ("aten.from_file.default", "reads or writes files"),
    ("aten.fill_.Scalar", "writes to an argument"),
    ("aten.add.out", "writes to an argument"),
    ("aten.copy_.default", "writes to an argument"),
    ("aten._assert_async.msg", "returns nothing"),
    ("profiler._record_function_enter.default", "namespace 'profiler'"),
])
def test_dangerous_ops_are_refused_before_running(op_type, rule):
    node = one_node_ir(op_type, {}).nodes[0]
    with pytest.raises(UnsafeInputError, match=rule):
        bind_kernel(node, torch.device("cpu"))
    assert not is_supported(op_type)


def test_from_file_cannot_read_a_file(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    ir = one_node_ir("aten.from_file.default", {"filename": str(secret), "shared": True, "size": 8},
                     inputs=(), out_shape=(8,))
    with pytest.raises(UnsafeInputError, match="aten.from_file.default"):
        IRExecutor(ir, {})


def test_a_misspelled_attribute_is_refused_not_defaulted():
    ir = one_node_ir("aten.gelu.default", {"approximatee": "tanh"})
    with pytest.raises(IRValidationError, match=r"\['approximatee'\].*approximate"):
        IRExecutor(ir, {})
    (out,) = IRExecutor(one_node_ir("aten.gelu.default", {"approximate": "tanh"}), {}).run((torch.ones(4),))
    torch.testing.assert_close(out, torch.nn.functional.gelu(torch.ones(4), approximate="tanh"))


def test_registered_ops_refuse_unknown_attributes_too():
    ir = one_node_ir("SOFTMAX", {"dim": -1, "dimm": 0})
    with pytest.raises(IRValidationError, match="dimm"):
        IRExecutor(ir, {})


def test_every_namespace_torch_ships_is_denied_except_aten_and_prims():
    """A new torch release that adds a namespace fails here, so it is reviewed before it can be named."""
    code = ("import json, torch; print(json.dumps(sorted({n.split('::')[0] "
            "for n in torch._C._dispatch_get_all_op_names()})))")
    shipped = set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                            check=True).stdout))
    assert shipped - {"aten", "prims"} <= DENIED_NAMESPACES, sorted(shipped - {"aten", "prims"} - DENIED_NAMESPACES)
