"""A target that declares the NPU's kernels (issue 26, item 10): the ``[kernels] supported`` list of a hardware file
narrows the placement of ``partition`` (API and ``torch-ir partition --hw``), naming the description in each reason,
where the default ``cpu`` target, which has every kernel, would put the whole model on the "NPU"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from npu_compiler import get_target, is_op_supported, partition
from npu_compiler.costmodel.hardware import HardwareError, hardware_from_dict, load_hardware
from npu_compiler.costmodel.hardware_template import hardware_template
from npu_compiler.library import target_for_hardware
from npu_runtime import CPUBackend, DAGExecutor
from npu_tools.cli import main
from tests.helpers import build_pair
from torch_ir import extract_ir

from ..costmodel.test_costmodel import TOY


class ConvSoftmax(nn.Module):
    """conv -> flatten -> linear -> softmax: a contraction NPU has the first three's kernels, not the last's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(self.conv(x).flatten(1)), dim=-1)


X = torch.randn(2, 3, 6, 6)


def npu(path: Path, supported: list[str] | None) -> Path:
    """A hardware file of the toy NPU, with ``supported`` as its kernel list (None: no list)."""
    data = {**TOY, "name": "contraction NPU"}
    if supported is not None:
        data["kernels"] = {"supported": supported}
    path.write_text(hardware_template(hardware_from_dict(data, str(path))))
    return path


@pytest.fixture(scope="module")
def pair() -> tuple:
    meta, real = build_pair(ConvSoftmax)
    return extract_ir(meta, (X.to("meta"),), model_name="conv_softmax"), real


def test_a_gemm_and_conv_npu_puts_the_softmax_on_the_cpu_with_the_reason(pair: tuple, tmp_path: Path) -> None:
    ir, real = pair
    hw_file = npu(tmp_path / "gemm_conv.toml", ["GEMM", "CONV", "movement"])
    target = target_for_hardware(load_hardware(hw_file))
    plan = partition(ir, is_op_supported, target=target)
    by_op = {p.op: p for p in plan.placements}
    assert by_op["SOFTMAX"].device == "cpu"
    assert by_op["SOFTMAX"].reason == f"the NPU described in {hw_file} has no kernel for SOFTMAX"
    assert by_op["CONV"].device == by_op["GEMM"].device == "npu"
    assert [p.device for p in plan.partitions] == ["npu", "cpu"]
    assert plan.summary().startswith(f"placement of 'conv_softmax' on the NPU described in {hw_file}")
    assert plan.to_dict()["described_in"] == str(hw_file)
    # the default target has every kernel: the same graph is all "NPU"
    assert all(p.device == "npu" for p in partition(ir, is_op_supported).placements)
    # the plan runs: its NPU part on the CPU backend (the target keeps its name), equal to eager
    dag = DAGExecutor(plan, CPUBackend())
    dag.load_weights(real.state_dict())
    (out,) = dag.execute(inputs={"x": X.numpy()}).values()
    with torch.no_grad():
        np.testing.assert_allclose(out, real(X).numpy(), rtol=1e-4, atol=1e-5)


def test_the_partition_command_places_against_the_hardware_file(pair: tuple, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    ir, _ = pair
    source = tmp_path / "conv_softmax.json"
    ir.save(str(source))
    hw_file = npu(tmp_path / "gemm_conv.toml", ["GEMM", "CONV", "movement"])
    plan_file = tmp_path / "plan.json"
    assert main(["partition", str(source), "--hw", str(hw_file), "--json", str(plan_file)]) == 0
    out = capsys.readouterr().out
    assert f"softmax (SOFTMAX): the NPU described in {hw_file} has no kernel for SOFTMAX" in out
    assert json.loads(plan_file.read_text())["totals"]["cpu"]["nodes"] == 1
    # without --hw the default target says why everything is on the NPU, and how to describe one
    assert main(["partition", str(source)]) == 0
    assert "note: target 'cpu' has every kernel; --hw FILE" in capsys.readouterr().out
    # a description without a list narrows nothing, and says so
    assert main(["partition", str(source), "--hw", str(npu(tmp_path / "all.toml", None))]) == 0
    out = capsys.readouterr().out
    assert "CPU nodes and why" not in out and "declares no [kernels] list" in out


def test_a_kind_names_all_its_kernels_and_presets_name_themselves(pair: tuple, tmp_path: Path) -> None:
    ir, _ = pair
    hw = load_hardware(npu(tmp_path / "kinds.toml", ["contraction", "normalization", "movement"]))
    kernels = hw.kernel_names()
    assert kernels is not None and {"GEMM", "CONV", "SOFTMAX", "LAYER_NORM"} <= kernels and "ATTENTION" not in kernels
    assert all(p.device == "npu" for p in partition(ir, is_op_supported, target=target_for_hardware(hw)).placements)
    preset = load_hardware("tpu_v1")
    assert preset.described_in == "preset tpu_v1" and preset.kernels is None
    assert target_for_hardware(preset) is get_target("cpu")  # no list: the target as it is


def test_an_unknown_kernel_is_refused_by_name_with_the_closest_one() -> None:
    with pytest.raises(HardwareError, match=r'field "kernels.supported" names "SOFTMAXX", which is neither a kernel '
                                            r'nor a kernel kind .*did you mean "SOFTMAX"\?'):
        hardware_from_dict({**TOY, "kernels": {"supported": ["GEMM", "SOFTMAXX"]}}, "toy")
    with pytest.raises(HardwareError, match=r'field "kernels.supported" = "GEMM" must be a list'):
        hardware_from_dict({**TOY, "kernels": {"supported": "GEMM"}}, "toy")
    with pytest.raises(HardwareError, match=r'field "kernels.others" is not a known key'):
        hardware_from_dict({**TOY, "kernels": {"supported": [], "others": []}}, "toy")
    with pytest.raises(HardwareError, match="names 1, which is neither"):
        hardware_from_dict({**TOY, "kernels": {"supported": [1]}}, "toy")
