"""The kernel test table: every kernel × dtype × backend of the kernel table, run from its record
(example inputs, parameters, tolerance) as a compiled one-dispatch program, against the op's reference
implementation run by ``IRExecutor`` (as JAX's op records do). A kernel without a record fails here.

Where a backend's implementation *is* the reference (``impls={"cpu": REFERENCE}``), the comparison cannot
find a numerical fault: the same function runs on both sides. Those cases are kept apart as plumbing tests
(compile, arena placement, weight binding and copy-out around the kernel). The reference functions themselves
are checked against eager torch by the pass tests (tests/passes: every rewrite's result, run through the NPU
ops' references, is compared with the ATen graph it replaced)."""

from __future__ import annotations

import re

import pytest
import torch

import npu_compiler
from npu_compiler import CompileOptions
from npu_compiler.errors import CompileError
from npu_compiler.library import unsupported_reason
from npu_program.kernels import KERNELS, REFERENCE, KernelTest, all_kernels
from npu_runtime import Device, Executor, NPUBuffer, load_weights
from npu_runtime.backends.webgpu import adapter_problem
from npu_runtime.device import new_tensor
from torch_ir import IRExecutor
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.ops.registry import bind_kernel
from torch_ir.ops.values import dtype_from_name, dtype_name
from torch_ir.verify import default_tolerance

ALL_CASES = [(name, i, dtype, backend) for name in sorted(all_kernels())
             for i, test in enumerate(KERNELS[name].tests) for dtype in test.dtypes for backend in KERNELS[name].impls]
CASES = [c for c in ALL_CASES if KERNELS[c[0]].impls[c[3]] != REFERENCE]  # a kernel of its own vs the reference
PLUMBING = [c for c in ALL_CASES if KERNELS[c[0]].impls[c[3]] == REFERENCE]  # the reference on both sides


def _ids(cases: list[tuple[str, int, str, str]]) -> list[str]:
    return [f"{n}-{i}-{d}-{b}" if i else f"{n}-{d}-{b}" for n, i, d, b in cases]


def test_every_kernel_has_a_test_record():
    missing = sorted(name for name in all_kernels() if KERNELS[name].test is None)
    assert not missing, f"kernels without a test record (add test=t(...) to their KernelDef): {missing}"


def make_inputs(test: KernelTest, dtype: str, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    values = []
    for shape, kind, how in test.inputs:
        torch_dtype = dtype_from_name(dtype if kind == "*" else kind)
        if how == "bool":
            values.append(torch.rand(shape, generator=gen) > 0.5)
        elif how.startswith("index:"):
            values.append(torch.randint(0, int(how.split(":")[1]), shape, generator=gen, dtype=torch_dtype))
        elif how.startswith("positions:"):
            values.append(torch.randperm(int(how.split(":")[1]), generator=gen)[:shape[0]].to(torch_dtype))
        elif how == "positive":
            values.append((torch.rand(shape, generator=gen) + 0.5).to(torch_dtype))
        elif torch_dtype.is_floating_point:
            values.append(torch.randn(shape, generator=gen).to(torch_dtype))
        else:
            values.append(torch.randint(-8, 8, shape, generator=gen, dtype=torch_dtype))
    return values


def one_node_ir(name: str, test: KernelTest, values: list[torch.Tensor]) -> NPU_IR:
    metas = [TensorMeta(f"in{i}", list(v.shape), dtype_name(v.dtype),
                     role="weight" if i in test.weights else "input") for i, v in enumerate(values)]
    probe = OpNode("probe", name, metas, [], dict(test.params))
    outs = bind_kernel(probe, torch.device("cpu"))(values, {})
    out_metas = [TensorMeta(f"out{i}", list(o.shape), dtype_name(o.dtype)) for i, o in enumerate(outs)]
    return NPU_IR(model_name=f"kernel_{name}", graph_inputs=[m for m in metas if m.role == "input"],
                  graph_outputs=out_metas, weights=[m for m in metas if m.role == "weight"],
                  nodes=[OpNode("k0", name, metas, out_metas, dict(test.params))])


@pytest.mark.parametrize(("name", "index", "dtype", "backend"), CASES, ids=_ids(CASES))
def test_kernel_against_its_reference(name, index, dtype, backend):
    run_case(name, index, dtype, backend)


@pytest.mark.parametrize(("name", "index", "dtype", "backend"), PLUMBING, ids=_ids(PLUMBING))
def test_plumbing_around_a_reference_kernel(name, index, dtype, backend):
    run_case(name, index, dtype, backend)


def run_case(name: str, index: int, dtype: str, backend: str) -> None:
    if backend == "webgpu" and (problem := adapter_problem()) is not None:
        pytest.skip(f"no WebGPU adapter: {problem}")
    test = KERNELS[name].tests[index]
    values = make_inputs(test, dtype)
    ir = one_node_ir(name, test, values)
    expected = IRExecutor(ir, {f"in{i}": values[i] for i in test.weights}).run(
        [v for i, v in enumerate(values) if i not in test.weights])
    options = CompileOptions(normalize=False, fuse=False, public_output_names=False)
    refused = unsupported_reason(ir.nodes[0], backend)
    if refused is not None:  # a record's case the target declares it cannot run (a 4-bit code on WebGPU)
        with pytest.raises(CompileError, match=re.escape(refused)):
            npu_compiler.compile(ir, target=backend, options=options)
        return
    program = npu_compiler.compile(ir, target=backend, options=options)
    if KERNELS[name].view and not program.dispatches:
        pass  # a view of a contiguous input is an alias: the copy-out reads it
    else:
        assert [d.kernel for d in program.dispatches] == [name]
    device = Device(backend)
    inputs = {spec.name: NPUBuffer(new_tensor(device, spec, values[int(spec.name[2:])]), spec, device)
              for spec in program.input_specs}
    weights = load_weights({f"in{i}": values[i] for i in test.weights}, program, device)
    outputs = Executor(program, device).run(inputs, weights=weights)
    for spec, want in zip(program.output_specs, expected):
        got = outputs[spec.name].to_numpy()
        rtol, atol = default_tolerance(want.dtype)
        torch.testing.assert_close(torch.from_numpy(got).to(want.dtype), want, rtol=max(rtol, test.rtol),
                                   atol=max(atol, test.atol), equal_nan=True)

