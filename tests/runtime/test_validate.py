"""``Executor(validate=True)`` and the executor's step hook."""

from __future__ import annotations

import numpy as np
import pytest

from npu_runtime import Device, Executor, load_weights
from npu_runtime.backends.cpu_kernels import Conv2d, Gemm
from npu_runtime.validate import ValidationError
from torch_ir.weights import module_state

from .test_runtime import Residual, Small, compile_pair, random_inputs, run_vs_eager


@pytest.mark.parametrize("factory", [Small, lambda: Residual(__import__("torch").nn.ReLU(), False)],
                         ids=["small", "residual"])
def test_a_correct_program_validates_and_gives_the_same_outputs(factory):
    program, real = compile_pair(factory, (1, 3, 8, 8))
    plain = run_vs_eager(program, real)
    device = Device()
    checked = Executor(program, device, validate=True)
    inputs, weights = random_inputs(program), load_weights(module_state(real), program, device)
    ours = checked.run(inputs, weights=weights)["output"].to_numpy()
    np.testing.assert_array_equal(ours, plain.run(inputs, weights=weights)["output"].to_numpy())


def test_a_wrong_kernel_is_named_at_its_dispatch(monkeypatch):
    program, real = compile_pair(Small, (1, 3, 8, 8))
    original = Gemm.run

    def off_by_a_little(self, inputs, outputs):
        original(self, inputs, outputs)
        outputs[0].add_(1e-2)

    monkeypatch.setattr(Gemm, "run", off_by_a_little)
    device = Device()
    executor = Executor(program, device, validate=True)
    index = next(i for i, d in enumerate(program.dispatches) if d.kernel == "GEMM")
    with pytest.raises(ValidationError, match=rf"dispatch {index} \(GEMM\).*IR node .*differs from the reference"):
        executor.run(random_inputs(program), weights=load_weights(module_state(real), program, device))
    # without validation the same fault goes unnoticed until someone compares the model's output
    Executor(program, device).run(random_inputs(program), weights=load_weights(module_state(real), program, device))


def test_a_wrong_conv_stops_before_later_dispatches(monkeypatch):
    program, real = compile_pair(Small, (1, 3, 8, 8))
    monkeypatch.setattr(Conv2d, "run", lambda self, ins, outs: outs[0].zero_())
    ran = []
    original = Gemm.run
    monkeypatch.setattr(Gemm, "run", lambda self, ins, outs: (ran.append(1), original(self, ins, outs)))
    device = Device()
    with pytest.raises(ValidationError, match=r"dispatch 0 \(CONV\)"):
        Executor(program, device, validate=True).run(random_inputs(program),
                                                     weights=load_weights(module_state(real), program, device))
    assert not ran


def test_profile_times_every_dispatch_through_the_hook():
    program, real = compile_pair(Small, (1, 3, 8, 8))
    device = Device()
    executor = Executor(program, device)
    profile = executor.profile(random_inputs(program), load_weights(module_state(real), program, device), runs=3)
    assert [d.kernel for d in profile.dispatches] == [d.kernel for d in program.dispatches]
    assert all(d.median_us > 0 for d in profile.dispatches)
    assert sum(n for _, n, _, _ in profile.by_kernel()) == program.dispatch_count
