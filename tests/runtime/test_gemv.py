"""The CPU backend's decode GEMM (``npu_runtime.backends.cpu_gemv``): the compiled kernel and its torch
fallback against float64 ``F.linear``, its conversions value by value against torch's, the checks that stand
between a tensor and a raw pointer, the thread policy, and the ``GEMM`` kernel running it for decode (the build
and its cache: ``test_gemv_build.py``)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import npu_compiler
from npu_compiler import CompileOptions
from npu_program.kernels import KernelTest
from npu_runtime import Device, Executor, NPUBuffer, load_weights
from npu_runtime.backends import cpu_gemv, cpu_gemv_build
from npu_runtime.backends.cpu_kernels import Gemm
from npu_runtime.device import new_tensor
from tests.kernels.test_kernel_table import make_inputs, one_node_ir
from torch_ir import IRExecutor

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: relative size of the output's rounding (half an ulp); fp32's is covered by the accumulation term
OUT_ROUNDING = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


@pytest.fixture
def portable(native, monkeypatch):
    """The portable C kernel instead of the AVX2 one (what a CPU without AVX2 runs)."""
    monkeypatch.setattr(cpu_gemv._kernel, "library", dataclasses.replace(native, isa=0))


def at_most(request: pytest.FixtureRequest, isa: str) -> None:
    """Calls run the ``isa`` kernel (``cpu_gemv.ISAS``) as a CPU without the better ones would; skipped where this
    CPU lacks it."""
    native, code = request.getfixturevalue("native"), cpu_gemv.ISAS[isa]
    if native.isa < code:
        pytest.skip(f"this CPU has no {isa}")
    request.getfixturevalue("monkeypatch").setattr(cpu_gemv._kernel, "library", dataclasses.replace(native, isa=code))


@pytest.fixture
def fallback(monkeypatch):
    """Every call through the torch path (what a machine without gcc runs)."""
    monkeypatch.setattr(cpu_gemv_build.NativeKernel, "enabled", True)
    monkeypatch.setattr(cpu_gemv._kernel, "library", None)
    monkeypatch.setattr(cpu_gemv._kernel, "failed", "no compiler (test)")
    monkeypatch.setattr(cpu_gemv._kernel, "warned", True)


def random(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check_against_float64(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                          residual: torch.Tensor | None = None, roundings: int = 1) -> None:
    """``y`` within fp32 accumulation error (relative to the sum of |terms|) and the output's rounding: once
    for the kernel; torch's path rounds ``x·Wᵀ``, then the sum with the bias, then with the residual."""
    want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    scale = F.linear(x.double().abs(), w.double().abs(), None if bias is None else bias.double().abs())
    if residual is not None:
        want, scale = want + residual.double(), scale + residual.double().abs()
    tol = (2e-6 + 1.2e-7 * x.shape[1]) * scale + OUT_ROUNDING[y.dtype] * (want.abs() + (roundings - 1) * scale)
    err = (y.double() - want).abs()
    assert y.dtype == x.dtype and y.shape == want.shape
    assert bool((err <= tol).all()), f"max error {(err / tol).max():.3g} x the tolerance"


SHAPES = [(1, 1), (7, 1), (5, 3), (4, 16), (37, 53), (9, 300), (130, 17), (64, 896)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9])
@pytest.mark.parametrize("path", ["avx512bf16", "avx512", "avx2", "portable", "torch"])
def test_matches_float64_linear(dtype, rows, path, request):
    roundings = 3 if path == "torch" else 1
    if path == "portable":
        request.getfixturevalue("portable")
    elif path == "torch":
        request.getfixturevalue("fallback")
    else:
        at_most(request, path)
    for i, (n, k) in enumerate(SHAPES):
        x, w, b, r = random((rows, k), dtype, i), random((n, k), dtype, i + 1), random((n,), dtype, i + 2), \
            random((rows, n), dtype, i + 3)
        check_against_float64(cpu_gemv.gemv(x, w), x, w, roundings=roundings)
        check_against_float64(cpu_gemv.gemv(x, w, b), x, w, b, roundings=roundings)
        check_against_float64(cpu_gemv.gemv(x, w, b, r), x, w, b, r, roundings=roundings)
        check_against_float64(cpu_gemv.gemv(x, w, residual=r), x, w, None, r, roundings=roundings)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "c"])
def test_every_tail_of_n_and_k(native, dtype, isa):
    """K around the 16- and 32-wide blocks (the scalar tails of AVX2 and AVX-512) and N around the 8/4-row
    blocks and the chunks, 1 to 8 rows of x, two threads; ``isa=`` caps the kernel per call."""
    if native.isa < cpu_gemv.ISAS[isa]:
        pytest.skip(f"this CPU has no {isa}")
    for k in [0, 1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65]:
        for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 17]:
            rows = 1 + (k + n) % 8
            x, w, b = random((rows, k), dtype, k), random((n, k), dtype, n), random((n,), dtype, n + k)
            check_against_float64(cpu_gemv.Gemv(w, b)(x, isa=isa), x, w, b)
    x, w = random((2, 4099), dtype, 1), random((1001, 4099), dtype, 2)  # many chunks of 16 rows, a tail of 9
    check_against_float64(cpu_gemv.Gemv(w)(x, threads=2, isa=isa), x, w)


@pytest.mark.parametrize("isa", ["c", "avx2", "avx512"])
def test_fp16_x_residual_and_y_convert_as_torch(native, isa):
    """fp16 x, residual and y (F16C in the x86 kernels, plain C in the portable one) where the sums are exact: y =
    x[0] * w[:, 0] + residual with x one-hot. Every fp16 pattern as the residual (w = 0: y must be it, -0 made
    +0), then fp32 values rounded to fp16 (x = 1, residual 0): each fp16 value and each midpoint of two neighbours
    (a tie), the subnormals and the overflow to inf included, against torch's rounding."""
    if native.isa < cpu_gemv.ISAS[isa]:
        pytest.skip(f"this CPU has no {isa}")
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(1, -1)
    n, finite = every.shape[1], every.isfinite().reshape(-1)
    x = torch.zeros(1, 16, dtype=torch.float16)
    x[0, 0] = 1.0
    y = cpu_gemv.Gemv(torch.zeros(n, 16))(x, residual=every, threads=2, isa=isa)
    want, nan = (torch.zeros(1, n) + every.float()).half(), every.isnan()  # -0 + +0 sums are +0
    assert torch.equal(y.isnan(), nan)
    assert torch.equal(y[~nan].view(torch.int16), want[~nan].view(torch.int16))
    values = every.reshape(-1)[finite].float().sort().values
    targets = torch.cat([values, (values[1:] + values[:-1]) / 2, torch.tensor([65519.0, 65520.0, 1e6, -1e6])])
    w = torch.zeros(targets.numel(), 16)
    w[:, 0] = targets
    y = cpu_gemv.Gemv(w)(x, threads=2, isa=isa)
    assert torch.equal(y.reshape(-1).view(torch.int16), (targets + 0.0).half().view(torch.int16))


@pytest.mark.slow
def test_the_isa_cap_is_checked_and_named(native, tmp_path):
    x, w = random((1, 40), torch.bfloat16, 0), random((9, 40), torch.bfloat16, 1)
    with pytest.raises(ValueError, match="isa 'avx1024' is not one of c, avx2, avx512, avx512bf16"):
        cpu_gemv.Gemv(w)(x, isa="avx1024")
    code = "from npu_runtime.backends import cpu_gemv; print(cpu_gemv.native_status())"
    for isa, name in [("avx2", "AVX2/FMA"), ("c", "portable C")]:
        env = {**os.environ, "TORCH_IR_GEMV_ISA": isa}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        assert out.startswith(f"native {name}" if native.isa >= cpu_gemv.ISAS[isa] else "native ")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_thread_count_does_not_change_a_bit(native, dtype):
    """Threads take whole rows, so each output is the same sum whatever the split."""
    x, w, b = random((1, 1536), dtype, 0), random((4000, 1536), dtype, 1), random((4000,), dtype, 2)
    plan = cpu_gemv.Gemv(w, b)
    one = plan(x, threads=1)
    for threads in (2, 3, 8):
        assert torch.equal(plan(x, threads=threads), one)


def test_mixed_dtypes_accumulate_in_float32(native):
    """bf16 weights with an fp32 activation, bias and output, and the other way round."""
    x, w, b = random((2, 70), torch.float32, 0), random((33, 70), torch.bfloat16, 1), random((33,), torch.float32, 2)
    out = torch.empty(2, 33)
    cpu_gemv.Gemv(w, b)(x, out=out)
    check_against_float64(out, x, w, b)
    xh, out16 = x.to(torch.float16), torch.empty(2, 33, dtype=torch.float16)
    cpu_gemv.Gemv(w.float(), b.to(torch.bfloat16))(xh, out=out16)
    check_against_float64(out16, xh, w.float(), b.to(torch.bfloat16))


@pytest.mark.parametrize("k", [1, 16, 32], ids=["scalar", "vector", "vector32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_every_16_bit_weight_widens_exactly(native, dtype, k):
    """W holds all 65536 bit patterns, x is a one-hot: y is the widened weight, equal to torch's widening
    (NaN as NaN). K=1 takes the scalar tail, K=16 the vector loads (AVX-512: its tail), K=32 AVX-512's loop."""
    w = torch.zeros(65536, k, dtype=dtype)
    w[:, 0] = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)
    x = torch.zeros(1, k)
    x[0, 0] = 1.0
    y = cpu_gemv.Gemv(w)(x, out=torch.empty(1, 65536))[0]
    want = w[:, 0].float()
    nan = want.isnan()
    assert torch.equal(y.isnan(), nan)
    assert torch.equal(y[~nan], want[~nan])  # by value: the fp32 sum starts at +0, so -0.0 comes out as +0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_the_output_rounds_to_nearest_even_like_torch(native, dtype):
    """y = 1·w for fp32 w of every magnitude (subnormal to overflow, ties, inf, NaN) rounded to the output
    dtype: the same values as torch's ``.to(dtype)``."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=gen, dtype=torch.int64).to(torch.int32)
    ties = (torch.randint(0, 2**16, (20_000,), generator=gen, dtype=torch.int32) << 16) | 0x8000  # bf16 ties
    f16_ties = torch.tensor([2.0**-24 * 0.5, 2.0**-24 * 1.5, 2049.0, 2051.0, 65504.0, 65520.0, 65519.0, -65520.0])
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 3.4e38])
    w = torch.cat([bits.view(torch.float32), ties.view(torch.float32), f16_ties, special]).reshape(-1, 1)
    y = cpu_gemv.Gemv(w)(torch.ones(1, 1), out=torch.empty(1, w.shape[0], dtype=dtype))[0]
    want = w[:, 0].to(dtype)
    nan = want.isnan()
    assert torch.equal(y.isnan(), nan)
    assert torch.equal(y[~nan], want[~nan])  # equal values are equal bits, but for the sign of 0


def test_nan_and_inf_propagate(native):
    x, w = torch.ones(1, 40), torch.ones(8, 40, dtype=torch.bfloat16)
    w[1, 3], w[2, 39], w[3, 0], w[4, 5] = float("nan"), float("nan"), float("inf"), -float("inf")
    y = cpu_gemv.Gemv(w)(x, out=torch.empty(1, 8))[0]
    assert y[1].isnan() and y[2].isnan() and y[3] == float("inf") and y[4] == -float("inf") and y[0] == 40


def test_an_in_place_residual_add(native):
    x, w, b = random((3, 50), torch.bfloat16, 0), random((20, 50), torch.bfloat16, 1), random((20,), torch.bfloat16, 2)
    r = random((3, 20), torch.bfloat16, 3)
    out = r.clone()
    cpu_gemv.Gemv(w, b)(x, out=out, residual=out)
    check_against_float64(out, x, w, b, r)


def test_bad_tensors_are_refused_before_any_pointer_is_used(native):
    x, w = torch.randn(2, 8), torch.randn(5, 8)
    plan = cpu_gemv.Gemv(w)
    with pytest.raises(ValueError, match="contiguous"):
        cpu_gemv.Gemv(torch.randn(8, 5).t())
    with pytest.raises(ValueError, match="x must be contiguous"):
        plan(torch.randn(8, 2).t())
    with pytest.raises(ValueError, match="out must be contiguous"):
        plan(x, out=torch.empty(5, 2).t())
    with pytest.raises(ValueError, match="expected"):
        plan(torch.randn(2, 9))
    with pytest.raises(ValueError, match="expected"):
        plan(x, out=torch.empty(2, 6))
    with pytest.raises(ValueError, match="expected"):
        cpu_gemv.Gemv(w, torch.randn(6))
    with pytest.raises(ValueError, match="expected"):
        plan(x, residual=torch.randn(1, 5))
    with pytest.raises(TypeError, match="float32/bfloat16/float16"):
        plan(x.double())
    with pytest.raises(TypeError, match="float32/bfloat16/float16"):
        cpu_gemv.Gemv(w.to(torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        plan(torch.randn(8))
    with pytest.raises(TypeError, match="must be a tensor"):
        plan(x, out=[0.0] * 10)
    # a view past the end of a storage that was shrunk under it: its pointer would be dangling
    base = torch.randn(20)
    view = base[10:].view(2, 5)
    base.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="beyond what its storage holds"):
        plan(x, residual=view)


def test_overlapping_outputs_are_refused(native):
    buf = torch.randn(40)
    x, w = buf[:16].view(2, 8), torch.randn(5, 8)
    plan = cpu_gemv.Gemv(w)
    with pytest.raises(ValueError, match="out overlaps x"):
        plan(x, out=buf[10:20].view(2, 5))
    with pytest.raises(ValueError, match="out overlaps weight"):
        cpu_gemv.Gemv(w[:2].reshape(2, 8))(x, out=w.view(-1)[:4].view(2, 2))
    with pytest.raises(ValueError, match="residual overlaps out"):
        plan(x, out=buf[20:30].view(2, 5), residual=buf[21:31].view(2, 5))


def test_the_fallback_warns_once_and_still_computes(monkeypatch):
    monkeypatch.setattr(cpu_gemv._kernel, "library", None)
    monkeypatch.setattr(cpu_gemv._kernel, "failed", "no C compiler (gcc) on PATH")
    monkeypatch.setattr(cpu_gemv._kernel, "warned", False)
    monkeypatch.setattr(cpu_gemv_build.NativeKernel, "enabled", True)
    x, w = random((1, 30), torch.bfloat16, 0), random((7, 30), torch.bfloat16, 1)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        check_against_float64(cpu_gemv.gemv(x, w), x, w)
    assert cpu_gemv.native_status().startswith("torch (native GEMV unavailable: no C compiler")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_against_float64(cpu_gemv.gemv(x, w), x, w)  # no second warning


def test_set_native_enabled_switches_to_torch_without_a_warning(native, monkeypatch):
    monkeypatch.setattr(cpu_gemv_build.NativeKernel, "enabled", True)
    calls = []
    original = cpu_gemv.torch_gemv
    monkeypatch.setattr(cpu_gemv, "torch_gemv", lambda *a: (calls.append(1), original(*a))[1])
    assert cpu_gemv.native_available()
    previous = cpu_gemv.set_native_enabled(False)
    try:
        assert previous is True and not cpu_gemv.native_available()
        assert cpu_gemv.native_status().startswith("torch (native GEMV disabled")
        x, w = random((1, 30), torch.float32, 0), random((7, 30), torch.float32, 1)
        check_against_float64(cpu_gemv.gemv(x, w), x, w)
        assert calls == [1]
    finally:
        cpu_gemv.set_native_enabled(previous)


def test_the_environment_variable_disables_the_kernel(tmp_path):
    code = "from npu_runtime.backends import cpu_gemv; print(cpu_gemv.native_status())"
    env = {**os.environ, "TORCH_IR_NATIVE_GEMV": "0", "TORCH_IR_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.startswith("torch (native GEMV disabled")
    assert not any(tmp_path.iterdir())  # nothing was built


def test_the_thread_policy_runs_the_faster_choice_and_probes_the_other(monkeypatch):
    clock = [0]
    monkeypatch.setattr(cpu_gemv.time, "perf_counter_ns", lambda: clock[0])
    policy, size = cpu_gemv._ThreadPolicy(), 1 << 20

    def run(ns_one: int, ns_two: int, calls: int) -> list[int]:
        picked = []
        for _ in range(calls):
            threads = policy.pick(size, 2)
            policy.record(size, threads, ns_one if threads == 1 else ns_two)
            picked.append(threads)
            clock[0] += 1_000_000  # a call every ms
        return picked

    first = run(100_000, 60_000, 6)
    assert sorted(first) == [1, 1, 1, 2, 2, 2]  # three samples of each before choosing
    quiet = run(100_000, 60_000, 1000)  # two threads faster: one thread tried at 0.2 s, then 0.6 s (backing off)
    assert quiet.count(1) == 2
    busy = run(100_000, 5_000_000, 3000)  # a neighbour: a two-thread call stalls; one such call switches
    assert busy[0] == 2 and busy[1:].count(2) <= 3  # then two threads are tried rarely (0.4 s, 1.2 s, ...)
    again = run(100_000, 60_000, 3000)  # quiet again: back to two threads within the longest interval (1.6 s)
    assert again[-1000:].count(2) >= 999
    assert cpu_gemv._ThreadPolicy().pick(size, 2) in (1, 2)


# ----------------------------------------------------------------------------------- the GEMM kernel


def run_gemm(x_shape: str, dtype: str, params: dict, bias: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A one-GEMM program on the CPU backend, and the reference's output."""
    k = int(x_shape.split(",")[-1])
    w_shape = f"24,{k}" if params.get("trans_b", True) else f"{k},24"
    shapes = [x_shape, w_shape, "24"][: 3 if bias else 2]
    test = KernelTest(inputs=tuple((tuple(int(d) for d in s.split(",")), "*", "normal") for s in shapes),
                      params={**params, "has_bias": bias}, weights=(1, 2) if bias else (1,), dtypes=(dtype,))
    values = make_inputs(test, dtype)
    ir = one_node_ir("GEMM", test, values)
    expected = IRExecutor(ir, {f"in{i}": values[i] for i in test.weights}).run([values[0]])[0]
    program = npu_compiler.compile(ir, target="cpu", options=CompileOptions(normalize=False, fuse=False,
                                                                              public_output_names=False))
    assert [d.kernel for d in program.dispatches] == ["GEMM"]
    device = Device("cpu")
    inputs = {spec.name: NPUBuffer(new_tensor(device, spec, values[0]), spec, device) for spec in program.input_specs}
    weights = load_weights({f"in{i}": values[i] for i in test.weights}, program, device)
    out = Executor(program, device).run(inputs, weights=weights)
    got = next(iter(out.values())).to_numpy()
    return torch.from_numpy(got).to(expected.dtype), expected


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(("x_shape", "gemv_calls"), [("1,1,96", 1), ("1,4,37", 1), ("2,3,96", 0), ("1,1,1", 1)])
def test_the_gemm_kernel_runs_decode_through_the_gemv(dtype, x_shape, gemv_calls, monkeypatch):
    calls = []
    original = cpu_gemv.Gemv.__call__
    monkeypatch.setattr(cpu_gemv.Gemv, "__call__",
                        lambda self, *a, **kw: (calls.append(1), original(self, *a, **kw))[1])
    for params, bias in [({"trans_b": True, "activation": None}, True),
                         ({"trans_b": False, "activation": "gelu"}, True),
                         ({"trans_b": True, "activation": "relu"}, False)]:
        got, want = run_gemm(x_shape, dtype, params, bias)
        rtol = {"float32": 1e-5, "bfloat16": 1.6e-2, "float16": 2e-3}[dtype]
        torch.testing.assert_close(got, want, rtol=rtol, atol=rtol)
    assert len(calls) == 3 * gemv_calls


def test_gemm_accepts_one_float_dtype_only():
    from npu_program.program import Dispatch, TensorSpec

    def specs(x: str, w: str, y: str) -> dict[str, TensorSpec]:
        return {"x": TensorSpec("x", [1, 8], x), "w": TensorSpec("w", [4, 8], w), "y": TensorSpec("y", [1, 4], y)}

    d = Dispatch("GEMM", "n0", ["x", "w"], ["y"], {"trans_b": True})
    for dtype in ("float32", "bfloat16", "float16"):
        assert Gemm.accepts(d, specs(dtype, dtype, dtype), {"w"})
    assert not Gemm.accepts(d, specs("float32", "bfloat16", "float32"), {"w"})
    assert not Gemm.accepts(d, specs("int32", "int32", "int32"), {"w"})
    assert not Gemm.accepts(d, specs("float32", "float32", "float32"), set())  # W must be a weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (True, True)])
def test_prefill_rows_match_float64_linear(dtype, bias, residual):
    """Past ``GEMV_ROWS`` rows the contraction kernels multiply with oneDNN (fp32) or torch (bf16): within the dtype's
    rounding of a K-long fp32 sum of the float64 result, bias and residual included."""
    from npu_runtime.backends.cpu_kernels import GEMV_ROWS, _Linear

    g = torch.Generator().manual_seed(7)
    m, k, n = 4 * GEMV_ROWS + 3, 384, 200
    x, w = (torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype))
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    r = torch.randn(m, n, generator=g).to(dtype) if residual else None
    out = torch.empty(m, n, dtype=dtype)
    _Linear(w, b)(x, out, r)
    want = x.double() @ w.double().t() + (b.double() if bias else 0) + (r.double() if residual else 0)
    eps = torch.finfo(dtype).eps
    bound = 4 * eps * float((x.double().abs() @ w.double().abs().t()).max()) + 2 * eps * float(want.abs().max())
    assert float((out.double() - want).abs().max()) <= bound
