"""Run one kernel of the table on the WebGPU backend against its reference, at any shapes and parameters
(the kernel test table runs each record's own example; these tests add the shapes a GPU kernel's tiling,
vectorized loads or layouts could get wrong)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

import npu_compiler
from npu_compiler import CompileOptions
from npu_program.kernels import KernelTest
from npu_runtime import Device, Executor, NPUBuffer, load_weights
from npu_runtime.backends.webgpu import adapter_problem
from npu_runtime.device import new_tensor
from tests.kernels.test_kernel_table import one_node_ir
from torch_ir import IRExecutor
from torch_ir.verify import default_tolerance

#: Skips a test on a machine without a WebGPU adapter (with the reason), never fails it.
needs_gpu = pytest.mark.skipif(adapter_problem() is not None, reason=f"no WebGPU adapter: {adapter_problem()}")


def run_kernel(name: str, values: Sequence[torch.Tensor], params: dict[str, Any], weights: Sequence[int] = (),
               backend: str = "webgpu") -> tuple[list[torch.Tensor], list[torch.Tensor], Any]:
    """(got, expected, program): kernel ``name`` compiled alone for ``backend`` and run on ``values`` (inputs at
    positions ``weights`` are weight slots), and the op's reference on the same values."""
    test = KernelTest(tuple((tuple(v.shape), "*", "normal") for v in values), dict(params), tuple(weights))
    ir = one_node_ir(name, test, list(values))
    expected = IRExecutor(ir, {f"in{i}": values[i] for i in weights}).run(
        [v for i, v in enumerate(values) if i not in weights])
    program = npu_compiler.compile(ir, target=backend,
                                   options=CompileOptions(normalize=False, fuse=False, public_output_names=False))
    device = Device(backend)
    inputs = {spec.name: NPUBuffer(new_tensor(device, spec, values[int(spec.name[2:])]), spec, device)
              for spec in program.input_specs}
    bound = load_weights({f"in{i}": values[i] for i in weights}, program, device)
    outputs = Executor(program, device).run(inputs, weights=bound)
    got = [torch.from_numpy(outputs[spec.name].to_numpy()).to(want.dtype)
           for spec, want in zip(program.output_specs, expected)]
    return got, list(expected), program


def assert_kernel(name: str, values: Sequence[torch.Tensor], params: dict[str, Any], weights: Sequence[int] = (),
                  rtol: float = 1e-5, atol: float = 1e-5) -> Any:
    """``run_kernel`` on WebGPU, every output within the dtype's tolerance (at least ``rtol``/``atol``)."""
    got, expected, program = run_kernel(name, values, params, weights)
    for g, want in zip(got, expected):
        r, a = default_tolerance(want.dtype)
        torch.testing.assert_close(g, want, rtol=max(r, rtol), atol=max(a, atol), equal_nan=True)
    return program
