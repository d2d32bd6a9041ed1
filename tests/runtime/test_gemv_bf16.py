"""The GEMV's AVX512-BF16 kernel (``vdpbf16ps`` in ``gemv.c``): taken for bf16 weights when every x is exactly a bf16
number, and then within the fp32 tolerance of float64 ``F.linear`` like the widening kernels; never when its flush
of subnormal inputs and results to zero (DAZ/FTZ) could act, nor for fp32 x that is not bf16: those calls give
the widening AVX-512 kernel's bits."""

from __future__ import annotations

import pytest
import torch

from npu_runtime.backends import cpu_gemv
from tests.runtime.test_gemv import check_against_float64, random


@pytest.fixture(scope="module")
def bf16_cpu(native):
    if native.isa < cpu_gemv.ISAS["avx512bf16"]:
        pytest.skip("this CPU has no AVX512-BF16")
    return native


def both(w: torch.Tensor, x: torch.Tensor, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """The output of the AVX512-BF16 kernel's call and of the widening AVX-512 kernel, fp32."""
    plan = cpu_gemv.Gemv(w)
    return (plan(x, out=torch.empty(x.shape[0], w.shape[0]), isa="avx512bf16", **kw),
            plan(x, out=torch.empty(x.shape[0], w.shape[0]), isa="avx512", **kw))


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_bf16_x_takes_vdpbf16ps_within_the_tolerance(bf16_cpu, x_dtype, rows):
    """bf16 x, or fp32 x holding bf16 values: the dot-product kernel runs (its sums differ from the widening
    kernel's in their order, so in low bits) and stays within the tolerance, K with a tail of 1-31 too."""
    for k in (896, 1536, 61, 31):
        w, x = random((300, k), torch.bfloat16, k), random((rows, k), torch.bfloat16, k + 1).to(x_dtype)
        dp, widened = both(w, x)
        check_against_float64(dp.to(x_dtype), x, w)
        if k >= 896:
            assert not torch.equal(dp, widened)  # another kernel ran


def test_x_that_is_not_bf16_gives_the_widening_kernels_bits(bf16_cpu):
    w, x = random((200, 896), torch.bfloat16, 0), random((2, 896), torch.float32, 1)
    dp, widened = both(w, x)
    assert torch.equal(dp, widened)
    x16 = random((2, 896), torch.float16, 2)  # fp16 x: 11 significant bits, mostly not bf16
    plan = cpu_gemv.Gemv(w)
    assert torch.equal(plan(x16, isa="avx512bf16"), plan(x16, isa="avx512"))


@pytest.mark.parametrize("case", ["subnormal x", "subnormal weight", "tiny products"])
def test_where_daz_or_ftz_could_act_the_widening_kernel_runs(bf16_cpu, case):
    """vdpbf16ps reads a subnormal input as 0 and flushes a subnormal result to 0: a subnormal x or weight, or x
    and weights whose products could come near 2^-126, take the widening kernel (its bits; within the tolerance,
    where vdpbf16ps would give 0 for the all-subnormal row)."""
    w, x = random((64, 896), torch.bfloat16, 3), random((1, 896), torch.bfloat16, 4)
    if case == "subnormal x":
        x[0, 5] = 2.0**-130
        x[0, 100:] = 0
        x[0, 101] = 2.0**-127
    elif case == "subnormal weight":
        w[7, :] = 2.0**-128 * torch.sign(w[7, :])  # a row of subnormals only
    else:
        x[0, 9] = 2.0**-70  # times a weight of ~2^-45: ~2^-115
        w[3, 9] = 2.0**-45
    dp, widened = both(w, x)
    assert torch.equal(dp, widened)
    check_against_float64(dp.to(torch.bfloat16), x, w)
    if case == "subnormal weight":
        assert dp[0, 7] != 0


def test_small_products_above_the_bound_stay_exact_and_nan_inf_propagate(bf16_cpu):
    """Products of ~2^-108 (just above the bound of 2^-110): the dot-product kernel, and no flush to zero in it;
    NaN and inf weights as in the widening kernels."""
    x = torch.full((1, 64), 2.0**-54, dtype=torch.bfloat16)
    w = random((16, 64), torch.bfloat16, 5).abs() * 2.0**-54 + 2.0**-54
    dp, _ = both(w, x)
    check_against_float64(dp.to(torch.bfloat16), x, w)
    assert bool((dp > 0).all())
    w2, ones = torch.ones(8, 40, dtype=torch.bfloat16), torch.ones(1, 40)
    w2[1, 3], w2[2, 39], w2[3, 0], w2[4, 5] = float("nan"), float("nan"), float("inf"), -float("inf")
    y = cpu_gemv.Gemv(w2)(ones, out=torch.empty(1, 8), isa="avx512bf16")[0]
    assert y[1].isnan() and y[2].isnan() and y[3] == float("inf") and y[4] == -float("inf") and y[0] == 40


def test_the_weight_is_scanned_once(bf16_cpu, monkeypatch):
    w, x = random((40, 64), torch.bfloat16, 6), random((1, 64), torch.bfloat16, 7)
    plan = cpu_gemv.Gemv(w)
    plan(x, isa="avx512")
    assert plan._wmin < 0  # no scan for a kernel that does not need it
    plan(x, isa="avx512bf16")
    first = plan._wmin
    assert first > 0
    plan(x, isa="avx512bf16")
    assert plan._wmin == first


#: a half dtype's ulp at 1 and its smallest positive (subnormal) step
HALF_STEPS = {torch.bfloat16: (2.0 ** -7, 2.0 ** -133), torch.float16: (2.0 ** -10, 2.0 ** -24)}


@pytest.mark.parametrize("dtype", list(HALF_STEPS))
@pytest.mark.parametrize(("n", "k", "m", "bias"), [(300, 96, 37, True), (1000, 256, 16, False), (5, 8960, 9, True)])
def test_a_half_prefill_widened_tile_by_tile_rounds_once(monkeypatch, dtype, n, k, m, bias):
    """Where the CPU has no dot products of the dtype, many rows of bf16 or fp16 x multiply fp32 tiles of the widened
    weight (``Gemv.widened_mm``; N = 300 and 1000 span several tiles of 128 rows or more, K = 8960 one of 5 rows):
    fp32 sums, the bias added, one rounding. Against the float64 product rounded once to the dtype: equal, or one
    step away where fp32's order of sums lands on the other side of a rounding boundary, plus the fp32 sums' own
    error where terms cancel (fp16's steps are fine enough to see it), as PyTorch's own half GEMM."""
    monkeypatch.setattr(cpu_gemv, "_half_dot_products", lambda dtype: False)
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    x = torch.randn(m, k, generator=g).to(dtype)
    out = torch.full((m, n), float("nan"), dtype=dtype)
    assert cpu_gemv.Gemv(w, b).widened_mm(x, out)
    exact = x.double() @ w.double().t() + (b.double() if bias else 0)
    want = exact.to(dtype)
    ulp, tiny = HALF_STEPS[dtype]
    step = (want.float().abs() * ulp).clamp_min(tiny)  # one step of the dtype or less
    sums = (k + 1) * 2.0 ** -24 * (x.double().abs() @ w.double().abs().t() + (b.double().abs() if bias else 0))
    assert ((out.double() - want.double()).abs() <= step.double() + sums).all()
    torch_half = torch.addmm(b, x, w.t()) if bias else torch.mm(x, w.t())
    assert (out == want).float().mean() >= (torch_half == want).float().mean() - 0.01


def test_the_widened_tiles_leave_half_cpus_and_other_dtypes_to_pytorch(monkeypatch):
    """A CPU with dot products of the dtype (bf16: AVX512-BF16 or AMX; fp16: AVX512-FP16 or AMX-FP16) runs PyTorch's
    half GEMM (it uses them); fp32 x, and a weight of another dtype than x, are not widened: False, nothing written."""
    w, x = torch.randn(40, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    out = torch.zeros(8, 40, dtype=torch.bfloat16)
    monkeypatch.setattr(cpu_gemv, "_half_dot_products", lambda dtype: True)
    assert not cpu_gemv.Gemv(w).widened_mm(x, out)
    assert not cpu_gemv.Gemv(w.half()).widened_mm(x.half(), out.half())
    monkeypatch.setattr(cpu_gemv, "_half_dot_products", lambda dtype: False)
    assert not cpu_gemv.Gemv(w.float()).widened_mm(x.float(), out.float())
    assert not cpu_gemv.Gemv(w.half()).widened_mm(x, out)
    assert not out.any()


def test_which_cpus_have_half_dot_products(monkeypatch):
    """bf16 by the CPU's AVX512-BF16 or AMX (``_bf16_dot_products``), fp16 by PyTorch's own check for oneDNN's fp16
    (the one that routes its fp16 GEMM there)."""
    monkeypatch.setattr(cpu_gemv, "_bf16_dot_products", lambda: True)
    assert cpu_gemv._half_dot_products(torch.bfloat16)
    monkeypatch.setattr(cpu_gemv, "_bf16_dot_products", lambda: False)
    assert not cpu_gemv._half_dot_products(torch.bfloat16)
    assert cpu_gemv._half_dot_products(torch.float16) == torch.ops.mkldnn._is_mkldnn_fp16_supported()
