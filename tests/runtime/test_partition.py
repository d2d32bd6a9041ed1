"""partition + DAGExecutor: graphs with ops the NPU library lacks run in NPU and CPU parts, equal to eager."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from npu_compiler import UnsupportedOpsError, compile, is_op_supported, partition
from npu_runtime import CPUBackend, DAGExecutor, RuntimeInputError
from tests.helpers import build_pair
from torch_ir import extract_ir


class CumsumNet(nn.Module):
    """conv -> logcumsumexp over channels (no NPU kernel) -> conv -> pool -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.logcumsumexp(y, dim=1)
        y = torch.relu(self.conv2(y))
        return self.fc(y.mean(dim=(2, 3)))


class Branches(nn.Module):
    """Two independent branches, one with an op the NPU lacks, joined at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.c = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left = torch.relu(self.a(x))
        right = torch.logcumsumexp(self.b(x), dim=-1)
        return self.c(left + right)


def _setup(factory, x: torch.Tensor):
    meta, real = build_pair(factory)
    ir = extract_ir(meta, (x.to("meta"),), model_name=factory.__name__)
    with torch.no_grad():
        expected = real(x).numpy()
    return ir, real, expected


def _run(plan, real: nn.Module, x: torch.Tensor) -> np.ndarray:
    dag = DAGExecutor(plan, CPUBackend())
    dag.load_weights(real.state_dict())
    (out,) = dag.execute(inputs={"x": x.numpy()}).values()
    return out


def test_an_op_without_kernel_runs_on_the_cpu_between_two_npu_parts():
    x = torch.randn(2, 3, 16, 16)
    ir, real, expected = _setup(CumsumNet, x)
    with pytest.raises(UnsupportedOpsError, match="logcumsumexp"):
        compile(ir)  # the whole graph cannot be one program...
    plan = partition(ir.to_dict(), is_op_supported)  # ...but it can run in parts
    assert [p.device for p in plan.partitions] == ["npu", "cpu", "npu"]
    (cpu,) = plan.cpu_placements()
    assert cpu.op == "aten.logcumsumexp.default" and "not in the NPU kernel library" in cpu.reason
    np.testing.assert_allclose(_run(plan, real, x), expected, rtol=1e-4, atol=1e-5)


def test_placement_summary_counts_nodes_and_flops_and_says_why():
    ir, _, _ = _setup(CumsumNet, torch.randn(2, 3, 16, 16))
    plan = partition(ir, is_op_supported)
    totals = plan.totals()
    assert totals["npu"]["nodes"] + totals["cpu"]["nodes"] == len(plan.ir.nodes) == len(plan.placements)
    # the two convolutions dominate: 2 * out_elems * C_in * 9 each
    conv_flops = 2 * (2 * 8 * 16 * 16) * 3 * 9 + 2 * (2 * 8 * 16 * 16) * 8 * 9
    assert conv_flops < totals["npu"]["flops"] < conv_flops * 1.1
    assert totals["cpu"]["flops"] == 2 * 8 * 16 * 16  # one logcumsumexp output element each
    text = plan.summary()
    assert "aten.logcumsumexp.default" in text and "not in the NPU kernel library" in text and "3 partitions" in text
    json.dumps(plan.to_dict())


def test_a_user_predicate_moves_ops_to_the_cpu():
    x = torch.randn(2, 3, 16, 16)
    ir, real, expected = _setup(CumsumNet, x)

    def no_gemm(op: str) -> bool:
        return op != "GEMM" and is_op_supported(op)

    plan = partition(ir, no_gemm)
    reasons = {p.op: p.reason for p in plan.cpu_placements()}
    assert set(reasons) == {"GEMM", "aten.logcumsumexp.default"}
    assert reasons["GEMM"] == "the predicate no_gemm rejected GEMM"
    np.testing.assert_allclose(_run(plan, real, x), expected, rtol=1e-4, atol=1e-5)


def test_everything_on_the_cpu():
    x = torch.randn(2, 3, 16, 16)
    ir, real, expected = _setup(CumsumNet, x)
    plan = partition(ir, lambda op: False)
    assert [p.device for p in plan.partitions] == ["cpu"]
    np.testing.assert_allclose(_run(plan, real, x), expected, rtol=1e-5, atol=1e-6)


def test_independent_branches_need_no_extra_device_switches():
    x = torch.randn(4, 6)
    ir, real, expected = _setup(Branches, x)
    plan = partition(ir, is_op_supported)
    # logcumsumexp is the only CPU node; the left branch joins the first NPU part, the join the second
    assert [p.device for p in plan.partitions] == ["npu", "cpu", "npu"]
    assert len(plan.partitions[0].nodes) == 2  # both GEMMs that read x
    np.testing.assert_allclose(_run(plan, real, x), expected, rtol=1e-5, atol=1e-6)


def test_dag_checks_inputs_and_weights():
    x = torch.randn(2, 3, 16, 16)
    ir, real, _ = _setup(CumsumNet, x)
    dag = DAGExecutor(partition(ir, is_op_supported), CPUBackend())
    with pytest.raises(RuntimeInputError, match="load_weights"):
        dag.execute(inputs={"x": x.numpy()})
    dag.load_weights(real.state_dict())
    with pytest.raises(RuntimeInputError, match=r"missing \['x'\]"):
        dag.execute(inputs={"y": x.numpy()})
    with pytest.raises(RuntimeInputError, match="must be float32"):
        dag.execute(inputs={"x": x.double().numpy()})
    assert dag.dispatch_count == sum(p.dispatch_count for p in dag.programs) > 0
