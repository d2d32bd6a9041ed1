"""A dispatch's params from lowering to the file and back: plain values the kernel record declares, refused with
the node, kernel and param named when they do not fit; a host dispatch's are its node's attributes, checked apart."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.errors import CompileError
from npu_compiler.library import get_target
from npu_compiler.lower import lower
from npu_program import npubin
from npu_program.check import check_program
from npu_program.program import CompiledProgram
from npu_runtime import Device, Executor
from torch_ir.errors import UnsafeInputError
from torch_ir.ir import NPU_IR, OpNode, TensorMeta


class Clamped(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x.clamp(min=float("-inf"), max=6.0), approximate="tanh").to(torch.float16)


def _program() -> CompiledProgram:
    with torch.device("meta"):
        model = Clamped()
    return npu_compiler.compile(torch_ir.extract_ir(model, (torch.randn(2, 4, device="meta"),), model_name="clamped"))


def _one_node_ir(op: str, attrs: dict, n_inputs: int = 1) -> NPU_IR:
    ins = [TensorMeta(f"x{i}", [2, 4], "float32") for i in range(n_inputs)]
    out = TensorMeta("y", [2, 4], "float32")
    return NPU_IR(model_name="m", graph_inputs=ins, graph_outputs=[out], weights=[],
                  nodes=[OpNode("n0", op, ins, [out], attrs)])


def test_lowering_writes_plain_params_with_every_default() -> None:
    params = {d.kernel: d.params for d in _program().dispatches}
    assert params["aten.clamp.default"] == {"min": -math.inf, "max": 6.0}
    assert params["aten.gelu.default"] == {"approximate": "tanh"}
    assert params["aten._to_copy.default"]["dtype"] == "float16"  # not the IR's {"dtype": "float16"}


@pytest.mark.parametrize(("op", "attrs", "message"), [
    ("aten.gelu.default", {"approximatee": "tanh"}, r"node 'n0' \(kernel aten\.gelu\.default\): attribute "
                                                    r"'approximatee' is not a param of the kernel"),
    ("aten.gelu.default", {"approximate": "sigmoid"}, r"node 'n0' \(kernel aten\.gelu\.default\): param "
                                                      r"'approximate' is 'sigmoid', expected one of 'none', 'tanh'"),
    ("aten.mean.dim", {"dim": [{"sym": "s0"}]}, r"node 'n0' \(kernel aten\.mean\.dim\): param 'dim': the symbolic "
                                                r"size 's0' has no value"),
])
def test_lowering_refuses_an_attribute_the_kernel_does_not_declare(op, attrs, message) -> None:
    with pytest.raises(CompileError, match=message):
        lower(_one_node_ir(op, attrs), get_target("cpu"))


def test_a_non_finite_float_survives_the_file_as_a_string() -> None:
    program = _program()
    data = npubin.encode_npubin(program)
    header = json.loads(data[20:20 + struct.unpack_from("<Q", data, 12)[0]])
    clamp = next(d for d in header["dispatches"] if d["kernel"] == "aten.clamp.default")
    assert clamp["params"] == {"min": "-inf", "max": 6.0}
    loaded = npubin.decode_npubin(data)
    assert loaded.dispatches == program.dispatches
    x = torch.tensor([[-1e30, -1.0, 0.5, 9.0]] * 2)
    out = Executor(loaded, Device()).run({loaded.input_specs[0].name: x.numpy()})
    expected = Clamped()(x)
    torch.testing.assert_close(torch.from_numpy(out[loaded.output_specs[0].name].to_numpy()), expected)


@pytest.mark.parametrize(("kernel", "edit", "message"), [
    ("aten.gelu.default", lambda p: p.update(approximate="erf"), r"dispatch \d+ \(aten\.gelu\.default\): param "
                                                                  r"'approximate' is 'erf', expected one of"),
    ("aten.gelu.default", lambda p: p.update(extra=1), r"'extra' is not a param of the kernel"),
    ("aten.clamp.default", lambda p: p.update(max="6"), r"param 'max' is '6', expected scalar or null"),
    ("aten._to_copy.default", lambda p: p.update(dtype={"dtype": "float16"}), r"param 'dtype' is \{'dtype'"),
])
def test_the_loader_refuses_params_that_do_not_fit_their_declarations(kernel, edit, message) -> None:
    program = _program()
    edit(next(d for d in program.dispatches if d.kernel == kernel).params)
    with pytest.raises(npubin.NpubinError, match=message):
        npubin.decode_npubin(npubin.encode_npubin(program))


def test_a_host_dispatch_keeps_its_attributes_and_their_own_check() -> None:
    """A host dispatch has no kernel record: the loader bounds its params as JSON, the runtime checks them as the
    IR's attributes (a tag, a symbolic size in the safe grammar) before anything runs."""
    program = _program()
    gelu = next(d for d in program.dispatches if d.kernel == "aten.gelu.default")
    gelu.host, gelu.params = "kept on the host", {"approximate": "tanh", "whatever": {"float": "inf"}}
    check_program(program)  # no declaration to break: the op's schema is the runtime's business
    gelu.params = {"approximate": [[[[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]]]}
    with pytest.raises(npubin.NpubinError, match=r"params\['approximate'\].*nested more than 16"):
        check_program(program)
    gelu.params = {"approximate": {"sym": "__import__('os').system('true')"}}
    check_program(program)
    with pytest.raises(UnsafeInputError, match=r"dispatch \d+ \(host op 'aten\.gelu\.default'\) param 'approximate'"):
        Executor(program, Device())


def test_a_kernel_no_record_declares_is_refused_whatever_the_target() -> None:
    program = _program()
    program.target = "npu-unknown"
    program.dispatches[0].kernel = "MY_KERNEL"
    with pytest.raises(npubin.NpubinError, match=r"names kernel 'MY_KERNEL'"):
        check_program(program)
