"""The WebGPU backend's own contract: buffers in every dtype and layout, one submission per run, host
dispatches mid-run, state, profiling, the CLI's --backend, and the errors a user meets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import npu_compiler
import torch_ir
from npu_compiler import CompileOptions
from npu_program.program import TensorSpec
from npu_runtime import (
    Device,
    Executor,
    MetalBackend,
    NoAdapterError,
    NPUBuffer,
    RuntimeInputError,
    State,
    load_weights,
)
from npu_runtime.backends.webgpu.gpu import get_gpu

from .kernels import needs_gpu

pytestmark = needs_gpu


@pytest.fixture(scope="module")
def device() -> Device:
    return Device("webgpu")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"])
def test_buffers_round_trip_every_dtype(device, dtype):
    torch_dtype = getattr(torch, dtype)
    values = (torch.randn(3, 5) * 40).to(torch_dtype) if dtype != "bool" else torch.rand(3, 5) > 0.5
    array = values.float().numpy() if dtype == "bfloat16" else values.numpy()
    buf = NPUBuffer.from_numpy(array, device, spec=TensorSpec("x", [3, 5], dtype))
    np.testing.assert_array_equal(buf.to_numpy(), array)


def test_nhwc_buffers_hold_logical_nchw_values(device):
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    spec = TensorSpec("x", [2, 3, 4, 5], "float32", "NHWC")
    buf = NPUBuffer.from_numpy(x, device, spec=spec)
    np.testing.assert_array_equal(buf.to_numpy(), x)
    raw = device.backend.download(buf.data, TensorSpec("x", [2 * 4 * 5 * 3], "float32"))  # the bytes, as stored
    np.testing.assert_array_equal(raw, x.transpose(0, 2, 3, 1).reshape(-1))


def small_mlp() -> tuple[torch.nn.Module, torch.Tensor, torch_ir.NPU_IR]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8), torch.nn.Softmax(-1))
    x = torch.randn(4, 16)
    return model.eval(), x, torch_ir.extract_ir(model, (x,), model_name="mlp", allow_real_weights=True)


def test_a_run_is_one_submission(device):
    model, x, ir = small_mlp()
    program = npu_compiler.compile(ir, target="webgpu")
    assert program.dispatch_count >= 3
    executor = Executor(program, device)
    weights = load_weights(model.state_dict(), program, device)
    before = device.backend.dispatch_submissions
    out = executor.run({ir.graph_inputs[0].name: x.numpy()}, weights=weights)
    assert device.backend.dispatch_submissions == before + 1
    with torch.no_grad():
        np.testing.assert_allclose(next(iter(out.values())).to_numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_program_for_another_target_is_refused_with_the_fix(device):
    _, _, ir = small_mlp()
    with pytest.raises(RuntimeInputError, match="target='webgpu'"):
        Executor(npu_compiler.compile(ir, target="cpu"), device)


def test_host_dispatches_run_mid_run(device):
    """``compile(fallback="cpu")`` puts an op the target lacks (topk) on the host inside the program: the run is
    submitted up to it, its inputs read back, the reference run, its output uploaded, and recording goes on."""
    class Top(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.topk(torch.relu(x) * 2.0, 3, dim=-1).values + 1.0

    x = torch.randn(2, 9)
    ir = torch_ir.extract_ir(Top(), (x,), model_name="top")
    program = npu_compiler.compile(ir, target="webgpu", fallback="cpu")
    assert any(d.host for d in program.dispatches) and any(not d.host for d in program.dispatches)
    out = Executor(program, device).run({ir.graph_inputs[0].name: x.numpy()})
    np.testing.assert_allclose(next(iter(out.values())).to_numpy(), Top()(x).numpy(), rtol=1e-6)


def test_state_lives_on_the_gpu_and_resets(device):
    from npu_program.program import StateSpec

    state = State([StateSpec("cache", [2, 8], "float32", shared_key="layers.0.k")], device)
    buf = state["layers.0.k"]
    device.backend.copy_in(buf.data, np.ones((2, 8), np.float32))
    assert buf.to_numpy().sum() == 16
    state.reset()
    assert buf.to_numpy().sum() == 0


def test_profile_reports_encode_time_per_dispatch(device):
    model, x, ir = small_mlp()
    program = npu_compiler.compile(ir, target="webgpu", options=CompileOptions(public_output_names=False))
    executor = Executor(program, device)
    profile = executor.profile({ir.graph_inputs[0].name: x.numpy()}, load_weights(model.state_dict(), program,
                                                                                    device), runs=2)
    assert profile.encode_us_per_dispatch is not None and profile.encode_us_per_dispatch > 0
    assert all(d.encode_us is not None for d in profile.dispatches)
    assert (profile.gpu_ms is not None) == device.backend.can_timestamp
    assert "encode:" in profile.table() and "webgpu" in profile.table().lower()


def test_metal_backend_names_the_portable_one_where_there_is_no_metal():
    if get_gpu().backend_type == "Metal":
        assert MetalBackend().target == "webgpu"
        return
    with pytest.raises(NoAdapterError, match="WebGPUBackend"):
        MetalBackend()


def test_cli_compile_run_profile_on_webgpu(tmp_path, capsys):
    from npu_tools.cli import main

    model, x, ir = small_mlp()
    ir.save(tmp_path / "mlp.json")
    torch_ir.save_weights(model.state_dict(), tmp_path / "mlp.safetensors")
    assert main(["compile", str(tmp_path / "mlp.json"), "--target", "webgpu", "-o", str(tmp_path / "mlp.npubin")]) == 0
    np.save(tmp_path / "x.npy", x.numpy())
    name = ir.graph_inputs[0].name
    common = [str(tmp_path / "mlp.npubin"), "--weights", str(tmp_path / "mlp.safetensors"),
              "--input", f"{name}={tmp_path / 'x.npy'}", "--backend", "webgpu"]
    assert main(["run", *common, "-o", str(tmp_path / "out.npz")]) == 0
    got = next(iter(np.load(tmp_path / "out.npz").values()))
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert main(["profile", *common, "--runs", "2"]) == 0
    assert "encode:" in capsys.readouterr().out
    assert main(["run", *common[:-1], "cpu"]) != 0  # a webgpu program on the CPU backend: refused with the fix
    assert "--backend webgpu" in capsys.readouterr().err


def test_a_tensor_larger_than_one_binding_is_refused_by_name(device):
    limit = device.backend.gpu.limits["max-storage-buffer-binding-size"]
    if limit > 1 << 30:
        pytest.skip(f"this adapter binds {limit} bytes: a test tensor that large is too costly")
    rows = limit // (4 * 1024) + 1  # a float32 [rows, 1024] weight one row larger than a binding
    with torch.device("meta"):
        model = torch.nn.Linear(1024, rows, bias=False)
    ir = torch_ir.extract_ir(model, (torch.empty(1, 1024, device="meta"),), model_name="wide")
    program = npu_compiler.compile(ir, target="webgpu")
    with pytest.raises(RuntimeInputError, match=r"binds at most \d+ bytes.*CPU backend"):
        Executor(program, device)  # refused before any weight is allocated
