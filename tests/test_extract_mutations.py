"""Inputs a model writes in place, and ops extraction has to trace with CPU inputs.

An op that writes into one of the model's inputs (``x.uniform_()``, batch norm in training updating
running statistics passed as inputs) is recorded in ``ir.mutations`` keyed by the graph input's name;
the executor writes the new value back into the caller's tensor, as eager does. Ops without a Meta
kernel (``geqrf``, ``histogram``) or that need an argument on the CPU (``tensor_split``'s tensor of
indices) are exported with CPU inputs when the model has no weights.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.compiler import CompileError
from torch_ir.errors import ExtractionError
from torch_ir.ir import IRValidationError
from torch_ir.ir.serialize import ir_from_dict


def _meta(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to("meta") for t in tensors)


class AddInPlace(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(y)
        return x * 2


class UniformInPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.uniform_(2.0, 3.0) + 1


class BatchNormTraining(nn.Module):
    """Batch norm in training mode as the ATen op that the OpInfo samples call: it updates the running
    statistics in place. (``F.batch_norm`` stays ``aten.batch_norm`` in the exported graph, which the
    executor runs as one op.)"""

    def forward(self, x, weight, bias, running_mean, running_var):
        out, _, _ = torch.ops.aten._native_batch_norm_legit(x, weight, bias, running_mean, running_var, True, 0.3, 1e-5)
        return out


def test_deterministic_input_write_is_recorded_and_written_back():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    ir = torch_ir.extract_ir(AddInPlace(), _meta(x, y))
    assert set(ir.mutations) == {"x"}  # keyed by the graph input's name
    ex, ey = x.clone(), y.clone()
    expected = AddInPlace()(ex, ey)
    ix, iy = x.clone(), y.clone()
    (out,) = torch_ir.IRExecutor(ir, {}).run([ix, iy])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(ix, ex)  # the caller's tensor holds the new value, as in eager
    torch.testing.assert_close(iy, y)  # the input that is only read is left alone


def test_random_input_write_fills_the_callers_tensor():
    x = torch.zeros(5, 6)
    ir = torch_ir.extract_ir(UniformInPlace(), _meta(x))
    (out,) = torch_ir.IRExecutor(ir, {}).run([x])
    assert out.shape == (5, 6) and out.dtype == torch.float32
    assert ((x >= 2) & (x <= 3)).all()  # written: uniform values replaced the zeros
    torch.testing.assert_close(out, x + 1)  # and the output is computed from the same draw


def test_batch_norm_training_updates_running_stats_given_as_inputs():
    x, w, b = torch.randn(4, 3, 5, 5), torch.rand(3) + 0.5, torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    ir = torch_ir.extract_ir(BatchNormTraining(), _meta(x, w, b, rm, rv))
    names = [t.name for t in ir.graph_inputs]
    assert set(ir.mutations) == {names[3], names[4]}
    eager_rm, eager_rv = rm.clone(), rv.clone()
    expected = BatchNormTraining()(x, w, b, eager_rm, eager_rv)
    ir_rm, ir_rv = rm.clone(), rv.clone()
    ir = ir_from_dict(ir.to_dict())  # through the JSON form
    (out,) = torch_ir.IRExecutor(ir, {}).run([x, w, b, ir_rm, ir_rv])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(ir_rm, eager_rm)
    torch.testing.assert_close(ir_rv, eager_rv)
    assert not torch.equal(ir_rm, rm)  # the statistics did move


def test_input_mutations_survive_save_and_load(tmp_path):
    ir = torch_ir.extract_ir(AddInPlace(), _meta(torch.randn(2, 2), torch.randn(2, 2)))
    path = tmp_path / "ir.json"
    ir.save(str(path))
    loaded = torch_ir.load_ir(str(path))
    assert loaded.mutations == ir.mutations
    assert "%x <- %" in str(loaded)


def test_mutation_of_an_unknown_tensor_is_refused():
    doc = torch_ir.extract_ir(AddInPlace(), _meta(torch.randn(2, 2), torch.randn(2, 2))).to_dict()
    doc["mutations"] = {"nobody": next(iter(doc["mutations"].values()))}
    with pytest.raises(IRValidationError, match="not a declared weight/buffer or graph input"):
        ir_from_dict(doc)


def test_compiler_and_partition_refuse_input_writes():
    ir = torch_ir.extract_ir(AddInPlace(), _meta(torch.randn(2, 2), torch.randn(2, 2)))
    with pytest.raises(CompileError, match="writes its inputs in place"):
        npu_compiler.compile(ir)
    with pytest.raises(CompileError, match="writes its inputs in place"):
        npu_compiler.partition(ir, npu_compiler.is_op_supported)


class Geqrf(nn.Module):
    def forward(self, a: torch.Tensor):
        return torch.geqrf(a)


class Histogram(nn.Module):
    def forward(self, x: torch.Tensor):
        return torch.histogram(x, bins=5, range=(-2.0, 2.0))


class TensorSplit(nn.Module):
    def forward(self, x: torch.Tensor, sections: torch.Tensor):
        return torch.tensor_split(x, sections)


@pytest.mark.parametrize("model, inputs", [
    (Geqrf(), (torch.randn(5, 3),)),
    (Histogram(), (torch.randn(20),)),
    (TensorSplit(), (torch.randn(7, 2), torch.tensor([1, 4]))),  # shapes depend on the indices: unbacked symbols
])
def test_ops_without_a_meta_kernel_extract_with_cpu_inputs(model, inputs):
    ir = torch_ir.extract_ir(model, _meta(*inputs))
    expected = model(*inputs)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    actual = torch_ir.IRExecutor(ir, {}).run(list(inputs))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


class GeqrfWithWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(5, 3, device="meta"))

    def forward(self, a: torch.Tensor):
        return torch.geqrf(a + self.w)


def test_model_with_meta_weights_keeps_the_meta_error():
    with pytest.raises(ExtractionError, match="could not export"):
        torch_ir.extract_ir(GeqrfWithWeight(), (torch.randn(5, 3, device="meta"),))


class ListIndex(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[[2, 0]] * 2  # the list becomes a tensor constant inside the op (lifted_tensor_0)


def test_constant_made_inside_an_op_is_inlined():
    x = torch.randn(3, 4)
    ir = torch_ir.extract_ir(ListIndex(), _meta(x))
    assert not ir.weights and list(ir.constant_values.values()) == [[2, 0]]
    torch.testing.assert_close(torch_ir.IRExecutor(ir, {}).run([x])[0], x[[2, 0]] * 2)
