"""Dispatches that read only weights and constants run once, when the weights are bound (weight-time folding):
a weight-norm, a constant-filled weight. Their results keep their arena bytes; every run reads them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import npu_compiler
from npu_program.npubin import NpubinError
from npu_runtime import Device, Executor, load_weights
from torch_ir.weights import module_state

from ..helpers import assert_outputs_close, build_pair
from .test_compile import extract


class WeightNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.utils.parametrizations.weight_norm(nn.Linear(8, 4))
        self.register_buffer("offset", torch.zeros(4))

    def forward(self, x):
        return torch.relu(self.fc(x)) + torch.full((4,), 0.5, device=x.device) + torch.zeros_like(self.offset)


def _compile():
    meta, real = build_pair(WeightNormed)
    return npu_compiler.compile(extract(meta, (3, 8))), real


def _run(executor: Executor, real: nn.Module, x: torch.Tensor, device: Device) -> torch.Tensor:
    weights = load_weights(module_state(real), executor.program, device)
    out = executor.run({executor.program.input_specs[0].name: x.numpy()}, weights=weights)
    return torch.from_numpy(out["output"].to_numpy())


def test_weight_norm_runs_at_bind_and_rebinding_recomputes_it(tmp_path):
    program, real = _compile()
    at_bind = [d.kernel for d in program.dispatches if d.at_bind]
    assert "aten._weight_norm.default" in at_bind
    assert not any(d.at_bind for d in program.dispatches if d.kernel == "GEMM")  # it reads the input
    assert "bind time:" in program.summary()
    path = tmp_path / "wn.npubin"
    program.save(path)
    loaded = npu_compiler.CompiledProgram.load(path)
    assert [d.at_bind for d in loaded.dispatches] == [d.at_bind for d in program.dispatches]

    device = Device()
    executor = Executor(loaded, device)
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_outputs_close([_run(executor, real, x, device)], real(x))
        assert_outputs_close([_run(executor, real, x * 2, device)], real(x * 2))  # a second run reads the same bytes
        other = build_pair(WeightNormed, seed=5)[1]
        assert_outputs_close([_run(executor, other, x, device)], other(x))  # new weights: recomputed at bind


def test_bind_time_outputs_keep_their_bytes():
    program, _ = _compile()
    pinned = set(program.bind_outputs)
    offsets, sizes = program.memory.offsets, {n: s.nbytes for n, s in program.tensors.items()}
    for name in pinned & set(offsets):
        start, end = offsets[name], offsets[name] + sizes[name]
        for other, offset in offsets.items():
            if other != name:
                assert offset + sizes[other] <= start or offset >= end, (name, other)


def test_a_bind_time_dispatch_reading_an_input_is_refused(tmp_path):
    program, _ = _compile()
    gemm = next(i for i, d in enumerate(program.dispatches) if d.kernel == "GEMM")
    program.dispatches[gemm] = dataclasses.replace(program.dispatches[gemm], at_bind=True)
    path = tmp_path / "bad.npubin"
    program.save(path)
    with pytest.raises(NpubinError, match="runs at bind time but reads"):
        npu_compiler.CompiledProgram.load(path)


def test_a_plan_reusing_bind_time_bytes_is_refused(tmp_path):
    program, _ = _compile()
    pinned = program.bind_outputs[0]
    victim = next(n for n in program.memory.offsets if n not in program.bind_outputs
                  and program.tensors[n].nbytes <= program.tensors[pinned].nbytes)
    program.memory.offsets[victim] = program.memory.offsets[pinned]
    path = tmp_path / "overlap.npubin"
    program.save(path)
    with pytest.raises(NpubinError, match="memory plan is invalid"):
        npu_compiler.CompiledProgram.load(path)
