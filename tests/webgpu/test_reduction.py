"""The WebGPU reductions, pooling and resampling kernels (``npu_runtime.backends.webgpu.reduction``) against
torch's ops: several and negative dims, keepdim, long rows (many loop strides per invocation), NaN, ties of
arg-extremes (the first index wins), pooling windows with padding, dilation and ceil_mode (NHWC on this
target), adaptive pooling to non-dividing sizes, resampling up and down by size and by factor."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.webgpu.kernels import assert_kernel, needs_gpu
from tests.webgpu.test_movement import assert_after_nhwc


def data(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, generator=gen, dtype=dtype)
    return torch.randn(shape, generator=gen).to(dtype)


def ties(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values from {0, 1, 2}: every extreme is tied many times."""
    return torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(3)).to(dtype)


def with_nan(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[[1, -3]] = float("nan")
    return x


FLOATS = [torch.float32, torch.bfloat16]

REDUCE: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("aten.mean.dim", (2, 3, 4, 5), {"dim": [1, 3], "keepdim": True}),
    ("aten.mean.dim", (3, 5, 7), {"dim": [-1, 0], "keepdim": False}),
    ("aten.mean.dim", (2, 3, 5), {"dim": None, "keepdim": False}),
    ("aten.sum.dim_IntList", (3, 5000), {"dim": [-1]}),
    ("aten.sum.dim_IntList", (7, 3, 5), {"dim": [0, 2], "keepdim": True}),
    ("aten.sum.dim_IntList", (4, 6), {"dim": []}),
    ("aten.sum.default", (5, 7, 3), {}),
    ("aten.amax.default", (4, 33, 5), {"dim": [0, 2], "keepdim": True}),
    ("aten.amax.default", (3, 300), {"dim": [-1]}),
    ("aten.amin.default", (5, 6, 7), {"dim": [1]}),
    ("aten.amin.default", (3, 4), {"dim": []}),
]


@needs_gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(("name", "shape", "params"), REDUCE, ids=[f"{c[0][5:]}-{i}" for i, c in enumerate(REDUCE)])
def test_reduce(name: str, shape: tuple[int, ...], params: dict[str, Any], dtype: torch.dtype) -> None:
    atol = 1e-3 if name.startswith("aten.sum") and dtype == torch.float32 else 1e-5  # 5000 terms summed
    assert_kernel(name, [data(shape, dtype)], params, atol=atol, rtol=1e-4)


@needs_gpu
def test_float16() -> None:
    x = data((3, 5, 7), torch.float16)
    assert_kernel("aten.mean.dim", [x], {"dim": [0, 2]})
    assert_kernel("aten.amax.default", [x], {"dim": [1], "keepdim": True})
    assert_kernel("aten.max.dim", [x], {"dim": -1})
    assert_kernel("aten.cumsum.default", [x], {"dim": 2})
    assert_kernel("aten.max_pool2d.default", [x], {"kernel_size": [2, 2], "stride": [2, 2], "ceil_mode": True})
    assert_kernel("aten.upsample_bilinear2d.vec", [x[None]], {"output_size": [7, 9], "align_corners": False,
                                                              "scale_factors": None})


@needs_gpu
def test_reduce_integers_dtypes_and_nan() -> None:
    assert_kernel("aten.sum.dim_IntList", [data((3, 5), torch.int64)], {"dim": [0]})
    assert_kernel("aten.sum.default", [data((3, 5), torch.bool)], {})
    assert_kernel("aten.amax.default", [data((3, 5), torch.int32)], {"dim": [-1]})
    assert_kernel("aten.amin.default", [data((3, 7), torch.int64)], {"dim": [0, 1]})
    assert_kernel("aten.sum.dim_IntList", [data((3, 5), torch.bfloat16)], {"dim": [1], "dtype": {"dtype": "float32"}})
    assert_kernel("aten.mean.dim", [data((3, 5), torch.int32)], {"dim": [1], "dtype": {"dtype": "float32"}})
    assert_kernel("aten.amax.default", [with_nan(data((4, 9)))], {"dim": [1]})
    assert_kernel("aten.amin.default", [with_nan(data((4, 9)))], {"dim": [0]})


@needs_gpu
@pytest.mark.parametrize("ord_", [2, 1, 3.0, 0.5, 0, {"float": "inf"}, {"float": "-inf"}], ids=str)
def test_vector_norm(ord_: Any) -> None:
    x = data((3, 4, 37))
    x[0, 0, :5] = 0.0  # zeros count for ord 0
    assert_kernel("aten.linalg_vector_norm.default", [x], {"ord": ord_, "dim": [-1], "keepdim": True}, rtol=1e-4)
    assert_kernel("aten.linalg_vector_norm.default", [x], {"ord": ord_, "dim": [0, 2], "keepdim": False}, rtol=1e-4)
    assert_kernel("aten.linalg_vector_norm.default", [x.bfloat16()], {"ord": ord_, "dim": None, "keepdim": False})


ARG: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("aten.argmax.default", (2, 7), {"dim": -1}),
    ("aten.argmax.default", (5, 3, 4), {"dim": 1, "keepdim": True}),
    ("aten.argmax.default", (3, 1000), {"dim": None}),
    ("aten.argmax.default", (3, 4), {"dim": None, "keepdim": True}),
    ("aten.max.dim", (2, 5, 3), {"dim": 1, "keepdim": False}),
    ("aten.max.dim", (4, 700), {"dim": -1, "keepdim": True}),
    ("aten.min.dim", (2, 5, 3), {"dim": -3, "keepdim": False}),
    ("aten.min.dim", (4, 300), {"dim": 1, "keepdim": False}),
]


@needs_gpu
@pytest.mark.parametrize("values", ["normal", "ties", "nan"])
@pytest.mark.parametrize(("name", "shape", "params"), ARG, ids=[f"{c[0][5:]}-{i}" for i, c in enumerate(ARG)])
def test_arg_reduce(name: str, shape: tuple[int, ...], params: dict[str, Any], values: str) -> None:
    x = {"normal": data(shape), "ties": ties(shape), "nan": with_nan(ties(shape))}[values]
    assert_kernel(name, [x], params)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64, torch.int32], ids=str)
def test_arg_reduce_dtypes(dtype: torch.dtype) -> None:
    assert_kernel("aten.argmax.default", [ties((4, 9), dtype)], {"dim": 0})
    assert_kernel("aten.max.dim", [ties((4, 9), dtype)], {"dim": 1})
    assert_kernel("aten.min.dim", [data((4, 9), dtype)], {"dim": -1, "keepdim": True})


@needs_gpu
def test_cumsum() -> None:
    assert_kernel("aten.cumsum.default", [data((3, 4, 5))], {"dim": 0})
    assert_kernel("aten.cumsum.default", [data((3, 300))], {"dim": -1}, atol=1e-4)
    assert_kernel("aten.cumsum.default", [data((3, 7), torch.bfloat16)], {"dim": 1})
    assert_kernel("aten.cumsum.default", [data((3, 7), torch.int64)], {"dim": 1})
    assert_kernel("aten.cumsum.default", [data((5, 2), torch.bool)], {"dim": 0})
    assert_kernel("aten.cumsum.default", [data((5, 2), torch.int32)], {"dim": 0, "dtype": {"dtype": "float32"}})


NHWC: list[tuple[str, dict[str, Any]]] = [
    ("aten.mean.dim", {"dim": [2, 3], "keepdim": True}),
    ("aten.mean.dim", {"dim": [-1, -2], "keepdim": False}),
    ("aten.amax.default", {"dim": [1]}),
    ("aten.linalg_vector_norm.default", {"ord": 2, "dim": [1], "keepdim": True}),
    ("aten.sum.default", {}),
    ("aten.argmax.default", {"dim": 1, "keepdim": False}),
    ("aten.max.dim", {"dim": -1, "keepdim": True}),
    ("aten.cumsum.default", {"dim": 1}),
]


@needs_gpu
@pytest.mark.parametrize(("name", "params"), NHWC, ids=[f"{c[0][5:]}-{i}" for i, c in enumerate(NHWC)])
def test_nhwc_input(name: str, params: dict[str, Any]) -> None:
    """Reductions of an NHWC activation (a convolution's or pooling's output on this target)."""
    assert_after_nhwc(name, [data((2, 5, 3, 7))], params, rtol=1e-5, atol=1e-5)


POOL: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("aten.max_pool2d.default", (1, 3, 8, 8), {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
    ("aten.max_pool2d.default", (2, 5, 9, 7), {"kernel_size": [3, 2], "stride": [2, 2], "padding": [1, 0],
                                               "ceil_mode": True}),
    ("aten.max_pool2d.default", (1, 2, 11, 10), {"kernel_size": [3], "padding": [1],
                                                 "dilation": [2, 1], "ceil_mode": True}),
    ("aten.max_pool2d.default", (3, 9, 9), {"kernel_size": [2, 2], "stride": [1, 1]}),
    ("aten.avg_pool2d.default", (1, 3, 8, 8), {"kernel_size": [2, 2], "stride": [2, 2]}),
    ("aten.avg_pool2d.default", (2, 3, 9, 7), {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1],
                                               "ceil_mode": True, "count_include_pad": True}),
    ("aten.avg_pool2d.default", (2, 3, 9, 7), {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1],
                                               "ceil_mode": True, "count_include_pad": False}),
    ("aten.avg_pool2d.default", (1, 4, 7, 10), {"kernel_size": [2, 4], "stride": [3, 2], "padding": [1, 2],
                                                "divisor_override": 5}),
    ("aten.avg_pool2d.default", (4, 5, 5), {"kernel_size": [3, 3], "ceil_mode": True}),
]


@needs_gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(("name", "shape", "params"), POOL, ids=[f"{c[0][5:]}-{i}" for i, c in enumerate(POOL)])
def test_pool2d(name: str, shape: tuple[int, ...], params: dict[str, Any], dtype: torch.dtype) -> None:
    assert_kernel(name, [data(shape, dtype)], params)


@needs_gpu
def test_max_pool_nan() -> None:
    assert_kernel("aten.max_pool2d.default", [with_nan(data((1, 2, 6, 6)))], {"kernel_size": [2, 2], "stride": [2, 2]})


@needs_gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(("shape", "size"), [((1, 3, 7, 9), [3, 4]), ((2, 2, 5, 5), [1, 1]),
                                              ((1, 2, 4, 5), [5, 7]), ((3, 10, 6), [4, 6])])
def test_adaptive_avg_pool2d(shape: tuple[int, ...], size: list[int], dtype: torch.dtype) -> None:
    assert_kernel("aten.adaptive_avg_pool2d.default", [data(shape, dtype)], {"output_size": size})


UPSAMPLE: list[dict[str, Any]] = [
    {"output_size": None, "scale_factors": [2.0, 1.5]},
    {"output_size": None, "scale_factors": [1.2, 0.7]},
    {"output_size": None, "scale_factors": [2.0, 3.0]},
    {"output_size": None, "scale_factors": [0.5, 2.5]},
    {"output_size": [7, 13], "scale_factors": None},
    {"output_size": [3, 4], "scale_factors": None},
    {"output_size": [9, 1], "scale_factors": None},
]


@needs_gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bilinear_align"])
@pytest.mark.parametrize("params", UPSAMPLE, ids=[str(i) for i in range(len(UPSAMPLE))])
def test_upsample(params: dict[str, Any], mode: str, dtype: torch.dtype) -> None:
    x = data((1, 3, 4, 6), dtype)
    if mode == "nearest":
        assert_kernel("aten.upsample_nearest2d.vec", [x], params)
    else:
        assert_kernel("aten.upsample_bilinear2d.vec", [x], {**params, "align_corners": mode == "bilinear_align"},
                      atol=1e-5, rtol=1e-5)
