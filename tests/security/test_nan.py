"""NaN stays NaN: the runtime's fused kernels must not turn a NaN weight or input into finite numbers
(oneDNN's clamping post-ops map NaN to 0), because the reference and eager show NaN. The WebGPU backend's
cases are in tests/webgpu/test_contraction.py (the fused activations' WGSL forms)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from npu_runtime import Device, Executor, load_weights
from npu_runtime.backends.cpu_kernels import Gemm
from torch_ir.weights import module_state

from ..runtime.test_runtime import ACTIVATIONS, ConvAct, LinearAct, Residual, Small, compile_pair


def run_both(program, real, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    device = Device()
    out = Executor(program, device).run(inputs, weights=load_weights(module_state(real), program, device))
    with torch.no_grad():
        expected = real(*(torch.from_numpy(x) for x in inputs.values())).numpy()
    return out["output"].to_numpy(), expected


def assert_same_nans_and_close(ours: np.ndarray, expected: np.ndarray) -> None:
    assert np.isnan(expected).any(), "the case must produce NaN in eager"
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_allclose(ours[finite], expected[finite], rtol=1e-4, atol=1e-4)


def inputs_with_nan(program) -> dict[str, np.ndarray]:
    spec = program.input_specs[0]
    x = torch.randn(*spec.shape, generator=torch.Generator().manual_seed(0)).numpy()
    x[0, 0, 2, 3] = np.nan
    return {spec.name: x}


@pytest.mark.parametrize("act", ["relu", "relu6", "silu", "none"])
def test_conv_propagates_nan_from_the_input(act):
    program, real = compile_pair(lambda: ConvAct(ACTIVATIONS[act][0](), True, True), (1, 3, 9, 9))
    assert [d.kernel for d in program.dispatches] == ["CONV"]
    assert_same_nans_and_close(*run_both(program, real, inputs_with_nan(program)))


def test_a_nan_weight_gives_nan_logits_as_in_eager():
    """Which border pixels are NaN differs (oneDNN skips padded taps, eager multiplies NaN by the zero
    padding), but the logits of a model are NaN in both: never finite numbers from a broken weight."""
    program, real = compile_pair(Small, (1, 3, 6, 6))
    with torch.no_grad():
        real.conv.weight[1, 0, 1, 1] = float("nan")
    spec = program.input_specs[0]
    clean = {spec.name: torch.randn(*spec.shape, generator=torch.Generator().manual_seed(1)).numpy()}
    ours, expected = run_both(program, real, clean)
    assert np.isnan(expected).all() and np.isnan(ours).all()


@pytest.mark.parametrize("act", ["relu", "none"])
@pytest.mark.parametrize("reuse", [False, True], ids=["inplace", "not_inplace"])
def test_conv_add_propagates_nan(act, reuse):
    program, real = compile_pair(lambda: Residual(ACTIVATIONS[act][0](), reuse), (1, 3, 8, 8))
    assert any(d.kernel == "CONV" and d.params.get("has_residual") for d in program.dispatches)
    assert_same_nans_and_close(*run_both(program, real, inputs_with_nan(program)))


@pytest.mark.parametrize("act", ["relu", "relu6", "silu", "gelu"])
def test_gemm_with_a_fused_activation_propagates_nan(act):
    program, real = compile_pair(lambda: LinearAct(True, ACTIVATIONS[act][0]()), (3, 4, 16))
    (dispatch,) = program.dispatches
    assert dispatch.kernel == "GEMM" and dispatch.params["activation"] == act
    spec = program.input_specs[0]
    x = torch.randn(*spec.shape, generator=torch.Generator().manual_seed(0)).numpy()
    x[0, 1, 3] = np.nan
    device = Device()
    executor = Executor(program, device)
    assert isinstance(executor.kernels[0], Gemm)  # the fast kernel, not the reference
    out = executor.run({spec.name: x}, weights=load_weights(module_state(real), program, device))
    with torch.no_grad():
        expected = real(torch.from_numpy(x)).numpy()
    assert_same_nans_and_close(out["output"].to_numpy(), expected)
