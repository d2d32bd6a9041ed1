"""The op registry and the reference executor: custom ops, unsupported ops, input and weight checks."""

from __future__ import annotations

import pytest
import torch

import torch_ir
from torch_ir.ir import ir_from_dict, ir_to_dict
from torch_ir.ops import unregister_op
from torch_ir.weights import module_state

from .helpers import assert_outputs_close, build_pair


@torch.library.custom_op("torch_ir_test::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x + alpha * y


@scaled_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


class UsesCustomOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.ops.torch_ir_test.scaled_add(self.fc(x), x, 0.5).relu()


@pytest.fixture(scope="module")
def custom():
    meta, real = build_pair(UsesCustomOp)
    return torch_ir.extract_ir(meta, (torch.randn(2, 4),)), real


def test_library_custom_op_runs_through_the_generic_path(custom):
    ir, real = custom
    assert "torch_ir_test.scaled_add.default" in ir.op_histogram()
    x = torch.randn(2, 4)
    assert_outputs_close(torch_ir.IRExecutor(ir, real.state_dict()).run([x]), real(x))


def _renamed(ir, old: str, new: str):
    doc = ir_to_dict(ir)
    for node in doc["nodes"]:
        if node["op_type"] == old:
            node["op_type"] = new
    return ir_from_dict(doc)


def test_unknown_ops_are_all_listed_before_running(custom):
    ir, real = custom
    ir = _renamed(_renamed(ir, "torch_ir_test.scaled_add.default", "vendor.fused.default"),
                  "aten.relu.default", "vendor.act.default")
    with pytest.raises(torch_ir.UnsupportedOpError) as info:
        torch_ir.IRExecutor(ir, real.state_dict())
    message = str(info.value)
    assert "vendor.act.default, vendor.fused.default" in message
    assert "node 'scaled_add'" in message and "node 'relu'" in message
    assert "@torch_ir.register_op(" in message


def test_register_op_supplies_a_missing_op(custom):
    ir, real = custom
    ir = _renamed(ir, "torch_ir_test.scaled_add.default", "vendor.fused.default")

    @torch_ir.register_op("vendor.fused.default")
    def fused(x, y, *, alpha):
        """x + alpha * y, as the vendor kernel computes it."""
        return x + alpha * y

    try:
        with pytest.raises(ValueError, match="already registered"):
            torch_ir.register_op("vendor.fused.default")(fused)
        x = torch.randn(2, 4)
        assert_outputs_close(torch_ir.IRExecutor(ir, real.state_dict()).run([x]), real(x))
    finally:
        unregister_op("vendor.fused.default")


def test_override_changes_the_result_and_the_failure_names_the_node(custom):
    ir, real = custom

    @torch_ir.register_op("aten.relu.default", override=True)
    def broken(x):
        raise RuntimeError("kernel exploded")

    try:
        with pytest.raises(torch_ir.ExecutionError, match=r"while executing node relu \(aten.relu.default\)"):
            torch_ir.IRExecutor(ir, real.state_dict()).run([torch.randn(2, 4)])
    finally:
        unregister_op("aten.relu.default")


def test_inputs_are_checked_by_name_shape_and_dtype(custom):
    ir, real = custom
    executor = torch_ir.IRExecutor(ir, real.state_dict())
    with pytest.raises(torch_ir.InputMismatchError, match=r"must have shape \[2, 4\], got \[3, 4\]"):
        executor.run([torch.randn(3, 4)])
    with pytest.raises(torch_ir.InputMismatchError, match="must have dtype float32, got float64"):
        executor.run([torch.randn(2, 4, dtype=torch.float64)])
    with pytest.raises(torch_ir.InputMismatchError, match="takes 1 inputs"):
        executor.run([torch.randn(2, 4), torch.randn(2, 4)])
    with pytest.raises(torch_ir.InputMismatchError, match=r"missing \['x'\], unexpected \['y'\]"):
        executor.run({"y": torch.randn(2, 4)})
    assert_outputs_close(executor.run({"x": torch.ones(2, 4)}), real(torch.ones(2, 4)))


def test_weight_mismatches_are_reported_together(custom):
    ir, real = custom
    state = dict(real.state_dict())
    del state["fc.bias"]
    state["fc.weight"] = torch.zeros(4, 5)
    state["extra.weight"] = torch.zeros(1)
    with pytest.raises(torch_ir.WeightsMismatchError) as info:
        torch_ir.IRExecutor(ir, state)
    message = str(info.value)
    assert "missing (1): fc.bias" in message
    assert "fc.weight: shape [4, 5], IR expects [4, 4]" in message
    assert "unexpected (1): extra.weight" in message
    state = dict(real.state_dict(), **{"fc.weight": real.fc.weight.detach().double()})
    with pytest.raises(torch_ir.WeightsMismatchError, match="dtype float64, IR expects float32"):
        torch_ir.IRExecutor(ir, state)


def test_weights_from_files(custom, tmp_path):
    ir, real = custom
    x = torch.randn(2, 4)
    torch.save(real.state_dict(), tmp_path / "w.pt")
    torch_ir.save_weights(real.state_dict(), tmp_path / "w.safetensors")
    for name in ("w.pt", "w.safetensors"):
        assert_outputs_close(torch_ir.IRExecutor(ir, tmp_path / name).run([x]), real(x))
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(torch_ir.WeightsMismatchError, match="bad.safetensors: not a readable safetensors file"):
        torch_ir.IRExecutor(ir, tmp_path / "bad.safetensors")
    torch.save({"weights": real.fc}, tmp_path / "pickled.pt")  # a module pickle, not a state dict
    with pytest.raises(torch_ir.WeightsMismatchError, match="weights_only=True"):
        torch_ir.IRExecutor(ir, tmp_path / "pickled.pt")


def test_intermediates_are_freed_after_last_use():
    class Chain(torch.nn.Module):
        def forward(self, x):
            a = x.sin()
            b = a.cos()
            return b.exp() + a

    ir = torch_ir.extract_ir(Chain(), (torch.randn(3),))
    executor = torch_ir.IRExecutor(ir)
    freed = [name for dead in executor.dead_after for name in dead]
    assert sorted(freed) == sorted({"x", "sin", "cos", "exp"})
    seen: list[int] = []
    executor.run_traced([torch.randn(3)], lambda node, outs: seen.append(len(outs)))
    assert seen == [1, 1, 1, 1]


def test_meta_weights_are_refused_at_run_time():
    meta, _ = build_pair(UsesCustomOp)
    ir = torch_ir.extract_ir(meta, (torch.randn(2, 4),))
    with pytest.raises(torch_ir.WeightsMismatchError, match="meta device"):
        torch_ir.IRExecutor(ir, module_state(meta))
