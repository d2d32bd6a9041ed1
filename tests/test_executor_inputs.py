"""What the executor and the verifier take, and what they check (issue 13).

Weights and inputs as numpy arrays, ``__array__`` and ``__dlpack__`` objects through one conversion; the
``check_shapes`` debug switch; constants holding -inf/NaN through save and load, and hostile encodings of them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from torch import nn

import torch_ir
from torch_ir.errors import ExecutionError, InputMismatchError, IRValidationError, WeightsMismatchError
from torch_ir.ir import ir_from_dict, ir_to_dict
from torch_ir.ir.core import NPU_IR, OpNode, TensorMeta
from torch_ir.weights import as_tensor

from .helpers import assert_outputs_close, build_pair

SCHEMA = json.loads((Path(torch_ir.__file__).parent / "ir" / "schema.json").read_text())


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, scale):
        return self.fc(x) * scale


class ArrayOnly:
    """An array from another framework that only speaks the numpy array protocol."""

    def __init__(self, array: np.ndarray):
        self._array = array

    def __array__(self, dtype=None, copy=None):
        return self._array if dtype is None else self._array.astype(dtype)


class DLPackOnly:
    """An array from another framework that only speaks DLPack (numpy exports it)."""

    def __init__(self, array: np.ndarray):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


@pytest.fixture(scope="module")
def two_inputs():
    meta, real = build_pair(TwoInputs)
    x, scale = torch.randn(2, 4), torch.rand(2, 1)
    return torch_ir.extract_ir(meta, (x, scale)), real, x, scale


@pytest.mark.parametrize("wrap", [np.asarray, ArrayOnly, DLPackOnly, lambda a: np.flip(np.flip(a, 0), 0)],
                         ids=["numpy", "__array__", "__dlpack__", "negative_strides"])
def test_inputs_and_weights_as_arrays(two_inputs, wrap):
    ir, real, x, scale = two_inputs
    weights = {k: wrap(v.numpy()) for k, v in real.state_dict().items()}
    executor = torch_ir.IRExecutor(ir, weights)
    expected = real(x, scale)
    assert_outputs_close(executor.run([wrap(x.numpy()), wrap(scale.numpy())]), [expected])
    assert_outputs_close(executor.run({"x": wrap(x.numpy()), "scale": scale}), [expected])


def test_read_only_numpy_arrays_are_copied_not_refused(two_inputs):
    ir, real, x, scale = two_inputs
    frozen = x.numpy().copy()
    frozen.flags.writeable = False
    assert_outputs_close(torch_ir.IRExecutor(ir, real).run([frozen, scale]), [real(x, scale)])


def test_anything_else_is_refused_naming_the_input_or_weight(two_inputs):
    ir, real, x, scale = two_inputs
    executor = torch_ir.IRExecutor(ir, real)
    with pytest.raises(InputMismatchError, match=r"input 'scale' of IR 'TwoInputs' is a list, not a tensor: pass a "
                                                 r"torch.Tensor, a numpy array, or an object with __array__ or "
                                                 r"__dlpack__"):
        executor.run([x, [[0.5], [0.5]]])
    with pytest.raises(InputMismatchError, match=r"input 'x' of IR 'TwoInputs' must have dtype float32, got float64"):
        executor.run([x.double().numpy(), scale])  # converted as it is, never silently cast
    with pytest.raises(InputMismatchError, match=r"input 'x' .* numpy array of dtype <U1, which holds no numbers"):
        executor.run([np.array(["a"]), scale])
    weights = {**real.state_dict(), "fc.bias": [0.0, 0.0, 0.0]}
    with pytest.raises(WeightsMismatchError, match=r"'fc.bias' \(a list\).*numpy arrays, or objects with __array__"):
        torch_ir.IRExecutor(ir, weights)


def test_as_tensor_shares_memory_where_it_can():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = as_tensor(array, "w")
    array[0, 0] = 42.0
    assert tensor[0, 0].item() == 42.0
    assert as_tensor(DLPackOnly(array), "w").data_ptr() == tensor.data_ptr()
    assert as_tensor(np.float32(2.5), "w").shape == ()


def test_verifier_entry_points_take_arrays(two_inputs):
    ir, real, x, scale = two_inputs
    ok, report = torch_ir.verify_ir(ir, None, real, (x.numpy(), DLPackOnly(scale.numpy())))
    assert ok, report.to_text()
    state = {k: v.numpy() for k, v in real.state_dict().items()}
    ok, report = torch_ir.verify_ir_with_state_dict(ir=ir, state_dict=state, original_model=real,
                                                    test_inputs=(), test_kwargs={"x": ArrayOnly(x.numpy()),
                                                                                 "scale": scale.numpy()})
    assert ok, report.to_text()


# -- check_shapes ------------------------------------------------------------------------------------

def _relu_ir(declared: list, dtype: str = "float32") -> NPU_IR:
    """x -> relu, with the output's shape and dtype as given (a deliberately wrong one, in the tests)."""
    x = TensorMeta("x", ["n", 4], "float32", role="input")
    out = TensorMeta("relu", declared, dtype, role="output")
    return NPU_IR("hand_made", [x], [out], [], [OpNode("relu", "aten.relu.default", [x], [out])],
                  symbols={"n": {"min": 1, "max": 8}})


def test_check_shapes_names_the_node_and_both_shapes():
    x = torch.randn(3, 4)
    assert torch_ir.IRExecutor(_relu_ir(["n", 5])).run([x])[0].shape == (3, 4)  # off by default: nothing checked
    with pytest.raises(ExecutionError, match=r"(?s)check_shapes: node relu \(aten.relu.default\) output 0 \('relu'\): "
                                             r"the IR declares float32\[3, 5\] \(IR: \['n', 5\]\), the kernel "
                                             r"returned float32\[3, 4\]"):
        torch_ir.IRExecutor(_relu_ir(["n", 5]), check_shapes=True).run([x])
    with pytest.raises(ExecutionError, match=r"declares float16\[3, 4\].*returned float32\[3, 4\]"):
        torch_ir.IRExecutor(_relu_ir(["n", 4], "float16"), check_shapes=True).run([x])
    torch_ir.IRExecutor(_relu_ir(["n", 4]), check_shapes=True).run([x])  # a right IR passes


def test_check_shapes_from_the_environment(monkeypatch):
    monkeypatch.setenv("TORCH_IR_CHECK_SHAPES", "1")
    with pytest.raises(ExecutionError, match="check_shapes: node relu"):
        torch_ir.IRExecutor(_relu_ir(["n", 5])).run([torch.randn(2, 4)])
    assert torch_ir.IRExecutor(_relu_ir(["n", 5]), check_shapes=False).run([torch.randn(2, 4)])


class ConvBNInPlace(nn.Module):
    """An in-place op makes export functionalize, which turns batch norm into _native_batch_norm_legit_no_training."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return y.relu_()


def test_batch_norm_saved_statistics_are_declared_as_the_kernels_return_them():
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    args = [torch.randn(1, 4, 2, 2), torch.ones(4), torch.zeros(4), torch.zeros(4), torch.ones(4), 0.1, 1e-5]
    on_meta = [t.shape[0] for t in op(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])[1:]]
    on_cpu = [t.shape[0] for t in op(*args)[1:]]
    assert on_meta == [4, 4] and on_cpu == [0, 0]  # the drift: the meta kernel says [C], the CPU returns [0]
    meta, real = build_pair(ConvBNInPlace)
    x = torch.randn(2, 3, 8, 8)
    ir = torch_ir.extract_ir(meta, (x,))
    (bn,) = [n for n in ir.nodes if n.op_type == op.__name__ or n.op_type == str(op)]
    assert [t.shape for t in bn.outputs] == [[2, 4, 6, 6], [0], [0]]
    assert_outputs_close(torch_ir.IRExecutor(ir, real, check_shapes=True).run([x]), [real(x)])


# -- constants holding -inf and NaN -----------------------------------------------------------------------

class NonFiniteConstant(nn.Module):
    def forward(self, scores):
        mask = torch.tensor([0.0, float("-inf"), float("inf"), float("nan")], device=scores.device)
        return (scores + mask).softmax(-1), scores * mask


def test_a_constant_with_non_finite_values_saves_and_loads(tmp_path):
    scores = torch.randn(2, 4)
    ir = torch_ir.extract_ir(NonFiniteConstant(), (scores,))
    (name,) = ir.constant_values
    path = tmp_path / "nonfinite.json"
    ir.save(path)
    doc = json.loads(path.read_text())  # strict JSON: json.loads would refuse NaN/Infinity literals here anyway
    assert doc["constant_values"][name] == [0.0, {"float": "-inf"}, {"float": "inf"}, {"float": "nan"}]
    jsonschema.validate(doc, SCHEMA)
    loaded = torch_ir.load_ir(path)
    assert loaded.constant_values[name][1:3] == [float("-inf"), float("inf")]
    outputs = torch_ir.IRExecutor(loaded).run([scores])
    for actual, expected in zip(outputs, NonFiniteConstant()(scores)):
        torch.testing.assert_close(actual, expected, equal_nan=True)


def test_old_files_without_the_new_fields_load(tmp_path):
    ir = torch_ir.extract_ir(NonFiniteConstant(), (torch.randn(2, 4),))
    doc = ir_to_dict(ir)
    assert doc["ir_version"] == torch_ir.ir.IR_VERSION
    for key in ("non_persistent_buffers", "inlined_constant_keys", "constant_values", "constants"):
        del doc[key]
    doc["ir_version"] = "1.0"
    doc["nodes"] = [n for n in doc["nodes"] if not any(t["name"].startswith("c_") for t in n["inputs"])]
    doc["graph_outputs"], doc["nodes"] = [], []
    old = ir_from_dict(doc)
    assert old.non_persistent_buffers == {} and old.inlined_constant_keys == {}


@pytest.mark.parametrize("value, rule", [
    ([{"float": "1e999"}], r"not a number"),
    ([{"float": "-inf", "sym": "s0"}], r"not a number"),
    ([{"sym": "s0"}], r"not a number"),
    ([{"float": None}], r"not a number"),
    (["inf"], r"expected a number, a bool or a list of them, got str"),
    ([[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
     r"nested more than 64 lists deep"),
])
def test_hostile_constant_values_are_refused(value, rule):
    ir = torch_ir.extract_ir(NonFiniteConstant(), (torch.randn(2, 4),))
    doc = ir_to_dict(ir)
    (name,) = doc["constant_values"]
    doc["constant_values"][name] = value
    with pytest.raises(IRValidationError, match=rf"constant_values\['{name}'\].*{rule}"):
        ir_from_dict(doc)
    if "nested" not in rule:  # JSON Schema has no limit on depth; the checker does
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, SCHEMA)


def test_constant_values_must_fit_their_constant():
    ir = torch_ir.extract_ir(NonFiniteConstant(), (torch.randn(2, 4),))
    doc = ir_to_dict(ir)
    (name,) = doc["constant_values"]
    stray = copy.deepcopy(doc)
    stray["constant_values"]["ghost"] = [1.0]
    with pytest.raises(IRValidationError, match=r"constant_values\['ghost'\]: holds a value for a name that is not"):
        ir_from_dict(stray)
    doc["constant_values"][name] = [1.0, 2.0]  # the constant is float32[4]
    with pytest.raises(IRValidationError, match=rf"constant '{name}' of IR .*has shape \[2\], the IR declares \[4\]"):
        torch_ir.IRExecutor(ir_from_dict(doc))


@pytest.mark.parametrize("recipe, rule", [
    ({"arange": {"start": 0, "end": 4, "step": 0}, "dtype": "int64", "shape": [4]}, r"step: must not be 0"),
    ({"fill": 0, "dtype": "int64", "shape": [4], "code": "x"}, r"exactly one of arange, fill, values"),
    ({"fill": 0, "values": [0], "dtype": "int64", "shape": [1]}, r"exactly one of arange, fill, values"),
    ({"fill": 0, "dtype": "object", "shape": [4]}, r"\.dtype: unknown dtype"),
    ({"fill": 0, "dtype": "int64", "shape": [-1]}, r"\.shape: expected a list"),
    ({"fill": [0], "dtype": "int64", "shape": [1]}, r"\.fill: expected one number"),
    ({"values": [1, 2], "dtype": "int64", "shape": [3]}, r"\.values: a value of shape \[2\]"),
    ({"arange": {"start": 0, "end": {"float": "inf"}, "step": 1}, "dtype": "int64", "shape": [4]},
     r"three finite numbers"),
    ("arange(4)", r"expected null or a recipe object"),
])
def test_hostile_buffer_recipes_are_refused(recipe, rule):
    doc = ir_to_dict(_relu_ir(["n", 4]))
    doc["non_persistent_buffers"] = {"pos": recipe}
    with pytest.raises(IRValidationError, match=rf"non_persistent_buffers\['pos'\].*{rule}"):
        ir_from_dict(doc)
    if "dtype" not in rule and "value of shape" not in rule:  # the schema knows no dtype names or value shapes
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, SCHEMA)
