"""The prefill GEMM of ``gemm_tiles.c`` (``cpu_gemv.Gemv.tiled_mm``): fp32 / bf16 / fp16 weights widened to fp32 as
they are packed, fp32 products and sums, the bias added, one rounding; run where AVX2 is the CPU's best kernel (here
forced there with ``at_most``, so that an AVX-512 machine tests it too). Against float64 products: bit-exact where
the arithmetic is exact (every edge of the 4 x 24 blocks and the 256-deep panels, every rounding of the output,
ties included), within fp32's summation bound elsewhere, and the same bits on one thread or two."""

from __future__ import annotations

import pytest
import torch

from npu_runtime.backends import cpu_gemv
from tests.runtime.test_gemv import at_most

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: per dtype: integers this wide are exact in it, and the largest |sum| kept within its range
EXACT_INTS = {torch.float32: (1 << 10, 1 << 23), torch.bfloat16: (1 << 7, 1 << 30), torch.float16: (1 << 4, 1 << 14)}
#: M, N, K crossing the blocks' edges: 4 rows, 24 columns (8 packed at a time), 256 of K, 8 of K packed at a time
SHAPES = [(1, 1, 1), (3, 7, 7), (4, 8, 8), (5, 9, 9), (6, 16, 15), (7, 23, 16), (8, 24, 17), (9, 25, 255),
          (13, 47, 256), (37, 49, 257), (128, 64, 513), (12, 300, 96)]


@pytest.fixture
def avx2(request):
    at_most(request, "avx2")


def ints(shape: tuple[int, ...], bound: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    return torch.randint(-bound, bound + 1, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_exact_where_the_arithmetic_is(avx2, dtype, m, n, k, bias):
    """Integers whose products and sums fp32 holds exactly: the output is the exact sum rounded once to the dtype
    (ties to even: sums past the dtype's significand land on them), every element, bit for bit."""
    width, limit = EXACT_INTS[dtype]
    g = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    bound = max(1, min(width, int((limit / k) ** 0.5)))
    x, w = ints((m, k), bound, dtype, g), ints((n, k), bound, dtype, g)
    b = ints((n,), bound, dtype, g) if bias else None
    out = torch.full((m, n), float("nan"), dtype=dtype)
    assert cpu_gemv.Gemv(w, b).tiled_mm(x, out)
    exact = x.double() @ w.double().t() + (b.double() if bias else 0)
    assert exact.abs().max() < 2 ** 24  # so fp32 held every partial sum
    assert torch.equal(out, exact.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(37, 45, 257), (128, 200, 896), (9, 40, 4864)])
def test_within_the_fp32_sums_bound(avx2, dtype, m, n, k):
    """Random values: within one rounding of the dtype plus fp32's summation bound of the float64 product, and the
    same bits on one thread as on two (each sum's order does not depend on the threads)."""
    g = torch.Generator().manual_seed(k)
    x, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((m, k), (n, k), (n,)))
    out = torch.empty(m, n, dtype=dtype)
    gemv = cpu_gemv.Gemv(w, b)
    assert gemv.tiled_mm(x, out, threads=2)
    exact = x.double() @ w.double().t() + b.double()
    sums = (k + 1) * 2.0 ** -24 * (x.double().abs() @ w.double().abs().t() + b.double().abs())
    rounding = exact.abs() * torch.finfo(dtype).eps / 2 + torch.finfo(dtype).smallest_normal
    assert ((out.double() - exact).abs() <= sums * (1 + torch.finfo(dtype).eps) + rounding).all()
    one = torch.empty_like(out)
    assert gemv.tiled_mm(x, one, threads=1)
    assert torch.equal(one, out)


def test_inf_and_nan_as_the_product_gives_them(avx2):
    """An inf of x spreads through its row as the float64 product's does (inf, or NaN where it meets inf of the
    other sign); the padded rows and columns of the blocks add nothing to the others."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(7, 20, generator=g), torch.randn(17, 20, generator=g)
    x[2, 5] = float("inf")
    w[4, 5], w[9, 6] = 0.0, float("-inf")
    out = torch.empty(7, 17)
    assert cpu_gemv.Gemv(w).tiled_mm(x, out)
    exact = x.double() @ w.double().t()
    assert torch.equal(out.isnan(), exact.isnan()) and torch.equal(out.isinf(), exact.isinf())
    finite = exact.isfinite()
    assert torch.allclose(out.double()[finite], exact[finite], rtol=1e-5, atol=1e-5)


def test_where_it_does_not_run(native, request):
    """Nothing written, False: x or out of another dtype than W, and a CPU whose best kernel is not AVX2 (AVX-512's
    own GEMMs are twice as wide; without AVX2 there is no kernel)."""
    w = torch.randn(16, 8)
    out = torch.full((7, 16), 5.0)
    gemv = cpu_gemv.Gemv(w)
    at_most(request, "avx2")
    assert not gemv.tiled_mm(torch.randn(7, 8, dtype=torch.bfloat16), out)
    assert not gemv.tiled_mm(torch.randn(7, 8), out.to(torch.float16))
    at_most(request, "c")
    assert not gemv.tiled_mm(torch.randn(7, 8), out)
    assert (out == 5.0).all()


def test_a_prefill_gemm_runs_it(avx2, monkeypatch):
    """The CPU backend's contraction (``_Linear``) takes it for a prefill's rows, and the residual is added after."""
    from npu_runtime.backends.cpu_kernels import _Linear

    calls = []
    real = cpu_gemv.Gemv.tiled_mm
    monkeypatch.setattr(cpu_gemv.Gemv, "tiled_mm", lambda self, x, out: calls.append(x.shape) or real(self, x, out))
    g = torch.Generator().manual_seed(0)
    w, x = ints((24, 32), 8, torch.bfloat16, g), ints((10, 32), 8, torch.bfloat16, g)
    res = ints((10, 24), 8, torch.bfloat16, g)
    out = torch.empty(10, 24, dtype=torch.bfloat16)
    _Linear(w, None)(x, out, residual=res)
    assert calls == [(10, 32)]
    assert torch.equal(out, (x.double() @ w.double().t()).to(torch.bfloat16) + res)


def test_the_panel_width_is_the_kernels(native):
    """``cpu_gemv.TILES_PANEL``, by which ``cpu_qgemv`` cuts its tiles, is the C kernel's ``TG_NR``."""
    assert native.lib.gemm_tiles_panel() == cpu_gemv.TILES_PANEL
