"""Programs written before CONV's residual became an attribute still load and give the same numbers.

``tests/compiler/data/v1_3_conv_add_{cpu,webgpu}.npubin`` were compiled from :class:`ResidualBlocks` (weights in
``v1_3_conv_add.safetensors``) by the compiler of commit 552238f, whose kernel fusion made ``CONV_ADD``
dispatches: one written in place over its residual, one not (the residual is read again), one over its own input.
``v1_3_conv_add_outputs.safetensors`` holds the input ``x`` and what that build's runtime computed from it on each
backend (``y_cpu``, ``y_webgpu``). Reading such a file maps every ``CONV_ADD`` dispatch to ``CONV`` with
``has_residual`` (``npu_program.kernels.KERNEL_ALIASES``); the CPU numbers must stay bit-identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.compiled_program import CompiledProgram
from npu_runtime import Device, Executor, load_weights

DATA = Path(__file__).parent / "data"
INPUT_SHAPE = (1, 3, 8, 8)


def _conv_bn(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))


class ResidualBlocks(nn.Module):
    """Three residual adds a CONV took: in place (``h`` dies there), not in place (``a`` is read again, no
    activation) and over the convolution's own input."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.conv1, self.conv2 = _conv_bn(3, 8), _conv_bn(8, 8), _conv_bn(8, 8)
        self.conv3, self.conv4 = _conv_bn(8, 8), _conv_bn(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        a = torch.relu(self.conv2(torch.relu(self.conv1(h))) + h)
        b = self.conv3(a) + a
        c = b * a
        return torch.relu(self.conv4(c) + c)


def example_input() -> torch.Tensor:
    return torch.randn(*INPUT_SHAPE, generator=torch.Generator().manual_seed(0))


def _state() -> dict[str, torch.Tensor]:
    return load_file(DATA / "v1_3_conv_add.safetensors")


def _run(program: CompiledProgram, device: Device, x: torch.Tensor) -> torch.Tensor:
    weights = load_weights(_state(), program, device)
    out = Executor(program, device).run({program.input_specs[0].name: x.numpy()}, weights=weights)
    return torch.from_numpy(out[program.output_specs[0].name].to_numpy())


def _eager(x: torch.Tensor) -> torch.Tensor:
    model = ResidualBlocks().eval()
    model.load_state_dict(_state())
    with torch.no_grad():
        return model(x)


def test_an_old_file_s_conv_add_dispatches_read_as_convs_with_their_residual() -> None:
    program = CompiledProgram.load(DATA / "v1_3_conv_add_cpu.npubin")
    convs = [d for d in program.dispatches if d.kernel == "CONV"]
    assert "CONV_ADD" not in program.kernel_histogram() and len(convs) == 5
    residual = [d for d in convs if d.params.get("has_residual")]
    assert [d.params.get("activation") for d in residual] == ["relu", None, "relu"]
    assert [bool(d.params.get("inplace_residual")) for d in residual] == [True, False, False]


def test_an_old_cpu_file_gives_the_numbers_it_gave_and_a_new_compile_the_same() -> None:
    saved = load_file(DATA / "v1_3_conv_add_outputs.safetensors")
    x = saved["x"]
    old = _run(CompiledProgram.load(DATA / "v1_3_conv_add_cpu.npubin"), Device(), x)
    torch.testing.assert_close(old, saved["y_cpu"], rtol=0, atol=0)  # bit for bit
    torch.testing.assert_close(old, _eager(x), rtol=1e-5, atol=1e-5)
    with torch.device("meta"):
        meta = ResidualBlocks().eval()
    ir = torch_ir.extract_ir(meta, (torch.empty(INPUT_SHAPE, device="meta"),), model_name="ResidualBlocks")
    new = npu_compiler.compile(ir)
    assert new.kernel_histogram() == {"CONV": 5, "aten.mul.Tensor": 1}
    torch.testing.assert_close(_run(new, Device(), x), saved["y_cpu"], rtol=0, atol=0)


def test_an_old_webgpu_file_gives_the_numbers_it_gave() -> None:
    from npu_runtime.backends.webgpu import adapter_problem

    if adapter_problem() is not None:
        pytest.skip(f"no WebGPU adapter: {adapter_problem()}")
    saved = load_file(DATA / "v1_3_conv_add_outputs.safetensors")
    got = _run(CompiledProgram.load(DATA / "v1_3_conv_add_webgpu.npubin"), Device("webgpu"), saved["x"])
    # recorded on Mesa's lavapipe, where it is bit for bit; another adapter may round its f32 sums differently
    torch.testing.assert_close(got, saved["y_webgpu"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, _eager(saved["x"]), rtol=1e-5, atol=1e-5)
