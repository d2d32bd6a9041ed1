"""The runtime: buffers, weights, the executor's checks, profiling, and every fast CPU kernel vs eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.compiled_program import TensorSpec
from npu_compiler.library import Target
from npu_program.kernels import all_kernels
from npu_runtime import Device, Executor, NPUBuffer, load_weights
from npu_runtime.backends.cpu_kernels import Binary, Conv2d, Gemm, MaxPool2d, Relu
from npu_runtime.device import RuntimeInputError
from npu_runtime.profile import DispatchTime
from torch_ir.weights import module_state

from ..helpers import assert_outputs_close, build_pair, randomize_batch_norm


def compile_pair(factory, *shapes, seed: int = 0, target="cpu"):
    meta, real = build_pair(factory, seed)
    randomize_batch_norm(real, seed + 1)
    args = tuple(torch.randn(*s, device="meta") for s in shapes)
    ir = torch_ir.extract_ir(meta, args, model_name=type(meta).__name__)
    return npu_compiler.compile(ir, target=target), real


def random_inputs(program, seed: int = 0) -> dict[str, np.ndarray]:
    gen = torch.Generator().manual_seed(seed)
    return {s.name: torch.randn(*s.shape, generator=gen).numpy() for s in program.input_specs}


def run_vs_eager(program, real: nn.Module, seed: int = 0) -> Executor:
    device = Device()
    executor = Executor(program, device)
    inputs = random_inputs(program, seed)
    outs = executor.run(inputs, weights=load_weights(module_state(real), program, device))
    with torch.no_grad():
        expected = real(*(torch.from_numpy(x) for x in inputs.values()))
    assert_outputs_close([torch.from_numpy(outs[s.name].to_numpy()) for s in program.output_specs], expected)
    return executor


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.fixture(scope="module")
def small():
    return compile_pair(Small, (1, 3, 6, 6))


# ------------------------------------------------------------------------------------ buffers


def test_buffer_round_trip_plain():
    device = Device()
    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    buf = NPUBuffer.from_numpy(array, device, spec=TensorSpec("x", [2, 3, 4], "float32"))
    np.testing.assert_array_equal(buf.to_numpy(), array)
    assert buf.data.is_contiguous()
    ints = NPUBuffer.from_numpy(np.array([[3, -1]], dtype=np.int64), device)
    assert ints.spec.dtype == "int64" and ints.to_numpy().tolist() == [[3, -1]]


def test_buffer_round_trip_nhwc():
    device = Device()
    array = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    buf = NPUBuffer.from_numpy(array, device, spec=TensorSpec("x", [2, 3, 4, 5], "float32", "NHWC"))
    assert buf.data.shape == (2, 3, 4, 5)
    assert buf.data.is_contiguous(memory_format=torch.channels_last) and not buf.data.is_contiguous()
    np.testing.assert_array_equal(buf.to_numpy(), array)
    assert buf.to_numpy().flags["C_CONTIGUOUS"]


def test_buffer_refuses_wrong_shape_or_dtype():
    device, spec = Device(), TensorSpec("pixels", [1, 3, 4, 4], "float32", "NHWC")
    with pytest.raises(RuntimeInputError, match=r"'pixels'.*float32\[1, 3, 4, 4\].*got float32\[1, 4, 4, 3\]"):
        NPUBuffer.from_numpy(np.zeros((1, 4, 4, 3), np.float32), device, spec=spec)
    with pytest.raises(RuntimeInputError, match=r"'pixels'.*got float64"):
        NPUBuffer.from_numpy(np.zeros((1, 3, 4, 4)), device, spec=spec)


# ------------------------------------------------------------------------------------ weights


def test_load_weights_reports_every_problem_at_once(small):
    program, real = small
    state = dict(module_state(real))
    del state["conv.weight"]
    state["fc.weight"] = torch.zeros(5, 3)
    state["bn.running_var"] = state["bn.running_var"].double()
    with pytest.raises(RuntimeInputError) as info:
        load_weights(state, program)
    message = str(info.value)
    assert "missing (1): conv.weight (float32[4, 3, 3, 3])" in message
    assert "fc.weight: shape [5, 3], the program expects [5, 4]" in message
    assert "bn.running_var: dtype float64, the program expects float32" in message
    assert "wrong shape/dtype (2)" in message


def test_load_weights_from_a_safetensors_file_lists_unused_keys(small, tmp_path):
    program, real = small
    state = dict(module_state(real))
    state["extra.weight"] = torch.ones(2)
    path = tmp_path / "small.safetensors"
    torch_ir.save_weights(state, path)
    weights = load_weights(path, program, Device())
    assert set(weights) == {w.name for w in program.weight_specs}
    assert "extra.weight" in weights.unused and "bn.num_batches_tracked" in weights.unused
    assert not set(weights.unused) & set(program.weight_keys.values())
    for slot, key in program.weight_keys.items():
        np.testing.assert_array_equal(weights[slot].to_numpy(), state[key].numpy())
    with pytest.raises(RuntimeInputError, match="does not exist"):
        load_weights(tmp_path / "nope.safetensors", program)


# ------------------------------------------------------------------------------------ executor checks


def test_run_checks_inputs_by_name(small):
    program, real = small
    device = Device()
    executor = Executor(program, device)
    weights = load_weights(module_state(real), program, device)
    good = np.zeros((1, 3, 6, 6), np.float32)
    with pytest.raises(RuntimeInputError, match=r"missing \['x'\]"):
        executor.run({}, weights=weights)
    with pytest.raises(RuntimeInputError, match=r"unexpected \['y'\]"):
        executor.run({"x": good, "y": good}, weights=weights)
    with pytest.raises(RuntimeInputError, match=r"input 'x'.*got float32\[1, 3, 6, 5\]"):
        executor.run({"x": np.zeros((1, 3, 6, 5), np.float32)}, weights=weights)
    with pytest.raises(RuntimeInputError, match=r"input 'x'.*got int64"):
        executor.run({"x": np.zeros((1, 3, 6, 6), np.int64)}, weights=weights)
    wrong_buffer = NPUBuffer.from_numpy(np.zeros((1, 3, 6, 5), np.float32), device)
    with pytest.raises(RuntimeInputError, match=r"input 'x'"):
        executor.run({"x": wrong_buffer}, weights=weights)


def test_run_without_weights_is_a_clear_error(small):
    program, _ = small
    with pytest.raises(RuntimeInputError, match=rf"{len(program.weight_specs)} weight slots and no weights"):
        Executor(program).run(random_inputs(program))


def test_program_for_another_target_is_refused():
    other = Target("other-npu", all_kernels(), channels_last=True)
    program, _ = compile_pair(Small, (1, 3, 6, 6), target=other)
    assert program.target == "other-npu"
    with pytest.raises(RuntimeInputError, match=r"compiled for target 'other-npu'.*target='cpu'"):
        Executor(program, Device())


def test_outputs_of_two_runs_are_independent(small):
    program, real = small
    device = Device()
    executor = Executor(program, device)
    weights = load_weights(module_state(real), program, device)
    first = executor.run(random_inputs(program, 1), weights=weights)["output"]
    kept = first.to_numpy().copy()
    second = executor.run(random_inputs(program, 2), weights=weights)["output"]
    np.testing.assert_array_equal(first.to_numpy(), kept)
    assert not np.allclose(second.to_numpy(), kept)
    with torch.no_grad():
        expected = real(torch.from_numpy(random_inputs(program, 1)["x"]))
    assert_outputs_close([torch.from_numpy(kept)], expected)


class HeavyConv(nn.Module):
    """One convolution (75 M multiply-adds) that costs far more than everything after it: a profile must say so."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(256, 128, 3, padding=1), nn.Linear(128, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


@pytest.fixture
def one_thread():
    """PyTorch on one thread for the test: on a loaded machine each parallel op waits milliseconds for its
    worker threads to be scheduled, which would drown what the kernels themselves cost."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_profile(one_thread):
    program, real = compile_pair(HeavyConv, (1, 256, 16, 16))
    executor = Executor(program)
    profile = executor.profile(random_inputs(program), load_weights(module_state(real), program), runs=5, warmup=1)
    # every dispatch appears once, in program order, under its kernel and node, with a time it really took
    assert [(d.index, d.kernel, d.node) for d in profile.dispatches] == \
        [(i, d.kernel, d.node) for i, d in enumerate(program.dispatches)]
    assert all(isinstance(d, DispatchTime) and d.median_us > 0 for d in profile.dispatches)
    # per kernel kind: counts and totals are those of its dispatches, shares add up to one
    rows = profile.by_kernel()
    for kernel, count, total_us, _ in rows:
        mine = [d.median_us for d in profile.dispatches if d.kernel == kernel]
        assert count == len(mine) and total_us == pytest.approx(sum(mine))
    all_us = sum(d.median_us for d in profile.dispatches)
    assert sum(total for _, _, total, _ in rows) == pytest.approx(all_us)
    assert sum(share for *_, share in rows) == pytest.approx(1.0)
    assert [total for _, _, total, _ in rows] == sorted((total for _, _, total, _ in rows), reverse=True)
    # what it measures is the model: the 75 MMAC convolution dominates, and the dispatches add up to
    # about a whole run (timed separately, without per-dispatch timers)
    (slowest, count, _, share), *_ = rows
    assert slowest == "CONV" and count == 1 and share > 0.5, profile.table()
    assert 0.25 < all_us / (profile.run_ms * 1e3) < 4, profile.table()
    table = profile.table()
    assert all(d.kernel in table and d.node in table for d in program.dispatches)
    with pytest.raises(ValueError, match="runs"):
        executor.profile(random_inputs(program), runs=0)


# ------------------------------------------------------------------------------------ fast kernels vs eager


class ConvAct(nn.Module):
    def __init__(self, act: nn.Module, bias: bool, bn: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(8) if bn else nn.Identity()
        self.act = act

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


ACTIVATIONS = {"none": (nn.Identity, None), "relu": (nn.ReLU, "relu"), "relu6": (nn.ReLU6, "relu6"),
               "silu": (nn.SiLU, "silu"), "gelu": (nn.GELU, "gelu")}


@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize(("bias", "bn"), [(True, False), (False, False), (False, True), (True, True)])
def test_conv_kernel(act, bias, bn):
    module, expected_activation = ACTIVATIONS[act]
    program, real = compile_pair(lambda: ConvAct(module(), bias, bn), (2, 3, 9, 9))
    (dispatch,) = program.dispatches
    assert dispatch.kernel == "CONV" and dispatch.params.get("activation") == expected_activation
    assert bool(dispatch.params.get("has_bias")) == bias and (dispatch.params.get("bn_eps") is not None) == bn
    executor = run_vs_eager(program, real)
    assert isinstance(executor.kernels[0], Conv2d)


class Residual(nn.Module):
    """stem -> h; act(bn(conv2(relu(conv1(h)))) + h) [* h when the residual is read again]."""

    def __init__(self, act: nn.Module, reuse: bool):
        super().__init__()
        self.stem, self.conv1 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.conv2, self.bn = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.act, self.reuse = act, reuse

    def forward(self, x):
        h = self.stem(x)
        y = self.act(self.bn(self.conv2(torch.relu(self.conv1(h)))) + h)
        return y * h if self.reuse else y


@pytest.mark.parametrize("act", ["none", "relu"])
@pytest.mark.parametrize("reuse", [False, True], ids=["inplace", "not_inplace"])
def test_conv_add_kernel(act, reuse):
    program, real = compile_pair(lambda: Residual(ACTIVATIONS[act][0](), reuse), (1, 3, 8, 8))
    (index, fused), = [(i, d) for i, d in enumerate(program.dispatches) if d.params.get("has_residual")]
    assert fused.kernel == "CONV"
    assert fused.params.get("activation") == ACTIVATIONS[act][1]
    assert bool(fused.params.get("inplace_residual")) == (not reuse)
    executor = run_vs_eager(program, real)
    assert isinstance(executor.kernels[index], Conv2d) and executor.kernels[index].inplace == (not reuse)


class LinearAct(nn.Module):
    def __init__(self, bias: bool, act: nn.Module):
        super().__init__()
        self.fc, self.act = nn.Linear(16, 8, bias=bias), act

    def forward(self, x):
        return self.act(self.fc(x))


class MatmulAct(nn.Module):
    """``x @ W`` with W stored [K, N]: a GEMM with trans_b=False."""

    def __init__(self, bias: bool, act: nn.Module):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))
        self.b = nn.Parameter(torch.randn(8)) if bias else None
        self.act = act

    def forward(self, x):
        y = x @ self.w
        return self.act(y + self.b if self.b is not None else y)


@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("trans_b", [True, False], ids=["trans_b", "no_trans_b"])
def test_gemm_kernel(trans_b, bias, act):
    module, expected_activation = ACTIVATIONS[act]
    factory = LinearAct if trans_b else MatmulAct
    program, real = compile_pair(lambda: factory(bias, module()), (3, 4, 16))
    (dispatch,) = program.dispatches
    assert dispatch.kernel == "GEMM" and bool(dispatch.params.get("trans_b", True)) == trans_b
    assert dispatch.params["has_bias"] == bias and dispatch.params.get("activation") == expected_activation
    executor = run_vs_eager(program, real)
    assert isinstance(executor.kernels[0], Gemm)


class PoolAddRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, y):
        p = nn.functional.max_pool2d(self.conv(x), 3, stride=2, padding=1)
        return torch.relu(p + y)


def test_max_pool_add_relu_kernels():
    program, real = compile_pair(PoolAddRelu, (2, 3, 10, 10), (2, 4, 5, 5))
    assert [d.kernel for d in program.dispatches] == \
        ["CONV", "aten.max_pool2d.default", "aten.add.Tensor", "aten.relu.default"]
    executor = run_vs_eager(program, real)
    assert [type(k) for k in executor.kernels] == [Conv2d, MaxPool2d, Binary, Relu]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("case", ["relu_bn", "silu_bias", "residual_inplace", "residual_reused"])
def test_a_half_convolution_without_half_instructions_runs_widened(precision, case, monkeypatch):
    """Where the CPU has no bf16/fp16 instructions (forced here), a half CONV runs oneDNN's float32 convolution on
    float32 weights packed once and x widened per call, rounded once as it is stored: within the half type's
    tolerance of the float model, and of torch's own half convolution (the reference, what ran before)."""
    from npu_compiler import CompileOptions
    from npu_runtime.backends import cpu_kernels

    factory = {"relu_bn": lambda: ConvAct(nn.ReLU(), False, True), "silu_bias": lambda: ConvAct(nn.SiLU(), True, False),
               "residual_inplace": lambda: Residual(nn.ReLU(), False),
               "residual_reused": lambda: Residual(nn.Identity(), True)}[case]
    meta, real = build_pair(factory, 0)
    randomize_batch_norm(real, 1)
    shape = (2, 3, 9, 9)
    ir = torch_ir.extract_ir(meta, (torch.randn(*shape, device="meta"),), model_name=case)
    program = npu_compiler.compile(ir, target="cpu", options=CompileOptions(precision=precision))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]

    def run() -> tuple[torch.Tensor, Executor]:
        device = Device()
        executor = Executor(program, device)
        outs = executor.run({program.input_specs[0].name: x.numpy()},
                            weights=load_weights(module_state(real), program, device))
        return torch.from_numpy(outs[program.output_specs[0].name].to_numpy()).float(), executor

    monkeypatch.setattr(cpu_kernels, "_conv_dtypes", lambda: frozenset({"float32"}))
    widened, executor = run()
    convs = [k for k in executor.kernels if isinstance(k, Conv2d)]
    assert convs and all(k.widen for k in convs)
    monkeypatch.setattr(Conv2d, "accepts", classmethod(lambda cls, *a: False))
    reference, executor = run()
    assert not any(isinstance(k, Conv2d) for k in executor.kernels)
    with torch.no_grad():
        expected = real(x.to(half).float())
    tol = {"bf16": dict(rtol=3e-2, atol=3e-2), "fp16": dict(rtol=4e-3, atol=4e-3)}[precision]
    torch.testing.assert_close(widened, expected, **tol)
    torch.testing.assert_close(widened, reference, **tol)
