"""The WebGPU data-movement kernels (``npu_runtime.backends.webgpu.movement``) against torch's ops: odd sizes,
negative dims and indices, torch's slice clamping, every pad mode, several outputs, float32, bfloat16 and
int64 (with values past 32 bits: movement must keep both words), views that are dispatched (of a weight) and
NHWC inputs (the output of a pooling on this channels-last target)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

import npu_compiler
from npu_compiler import CompileOptions
from npu_runtime import Device, Executor, NPUBuffer
from npu_runtime.device import new_tensor
from tests.webgpu.kernels import assert_kernel, needs_gpu, run_kernel
from torch_ir import IRExecutor
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.ops.registry import bind_kernel
from torch_ir.ops.values import dtype_name

DTYPES = [torch.float32, torch.bfloat16, torch.int64]


def data(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Random values of ``dtype``; int64 ones reach past 32 bits (both words must move)."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype == torch.int64:
        return torch.randint(-2**40, 2**40, shape, generator=gen, dtype=torch.int64)
    if not dtype.is_floating_point:
        low, high = {torch.int8: (-128, 128), torch.uint8: (0, 256)}.get(dtype, (-1000, 1000))
        return torch.randint(low, high, shape, generator=gen, dtype=dtype)
    return torch.randn(shape, generator=gen).to(dtype)


def ix(shape: tuple[int, ...], low: int, high: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed))


# (kernel, input shapes (the first in the dtype under test, the others as given), params)
CASES: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("aten.clone.default", [(3, 5, 7)], {}),
    ("aten.contiguous.default", [(1, 257)], {}),
    ("aten.permute.default", [(3, 1, 5, 7)], {"dims": [3, 1, 0, 2]}),
    ("aten.permute.default", [(2, 3, 4)], {"dims": [-1, 0, 1]}),
    ("aten.expand.default", [(1, 3, 1)], {"size": [2, 3, 5]}),
    ("aten.expand.default", [(3, 1)], {"size": [2, 3, 257]}),
    ("aten.slice.Tensor", [(4, 9)], {"dim": 1, "start": 1, "end": 8, "step": 3}),
    ("aten.slice.Tensor", [(5, 3)], {"dim": -2, "start": -3, "end": None, "step": 1}),
    ("aten.slice.Tensor", [(5, 3)], {"dim": 0, "start": None, "end": sys.maxsize, "step": 2}),
    ("aten.slice.Tensor", [(7, 3)], {"dim": 0, "start": -100, "end": 100, "step": 4}),
    ("aten.slice.Tensor", [(5, 3)], {"dim": 0, "start": 4, "end": 2, "step": 1}),
    ("aten.select.int", [(4, 6, 3)], {"dim": 1, "index": -1}),
    ("aten.select.int", [(4, 6, 3)], {"dim": -3, "index": 2}),
    ("aten.cat.default", [(2, 3), (2, 1), (2, 5)], {"tensors": [0, 1, 2], "dim": -1}),
    ("aten.cat.default", [(1, 3), (4, 3)], {"tensors": [1, 0, 1], "dim": 0}),
    ("aten.repeat.default", [(2, 3)], {"repeats": [2, 1, 3]}),
    ("aten.repeat.default", [(1, 5)], {"repeats": [3, 2]}),
    ("aten.pad.default", [(3, 7)], {"pad": [-1, 2], "mode": "constant", "value": 2.0}),
    ("aten.pad.default", [(2, 3, 4)], {"pad": [1, 0, 0, 2, 1, 1], "mode": "constant", "value": None}),
    ("aten.split_with_sizes.default", [(2, 7, 3)], {"split_sizes": [2, 4, 1], "dim": 1}),
    ("aten.split_with_sizes.default", [(7, 5)], {"split_sizes": [3, 0, 4], "dim": -2}),
    ("aten.unbind.int", [(3, 2, 4)], {"dim": 0}),
    ("aten.unbind.int", [(3, 2, 5)], {"dim": -1}),
    ("aten.roll.default", [(2, 5, 6)], {"shifts": [1, -2], "dims": [1, 2]}),
    ("aten.roll.default", [(3, 5)], {"shifts": [4], "dims": []}),
    ("aten.roll.default", [(3, 5)], {"shifts": [7, 2], "dims": [-1, 1]}),
    ("aten.flip.default", [(2, 5, 6)], {"dims": [0, -1]}),
    ("aten.repeat_interleave.self_int", [(2, 3, 4)], {"repeats": 2, "dim": 1}),
    ("aten.repeat_interleave.self_int", [(2, 3)], {"repeats": 3, "dim": -1}),
    ("aten.repeat_interleave.self_int", [(2, 3)], {"repeats": 2, "dim": None}),
    ("aten.copy.default", [(2, 3, 4), (3, 1)], {}),
    ("aten.slice_scatter.default", [(4, 6), (4, 2)], {"dim": 1, "start": 1, "end": 5, "step": 2}),
    ("aten.slice_scatter.default", [(5, 3), (3, 3)], {"dim": 0, "start": -3, "end": None, "step": 1}),
    ("aten.select_scatter.default", [(4, 6), (6,)], {"dim": 0, "index": -1}),
    ("aten.select_scatter.default", [(4, 6, 2), (4, 2)], {"dim": -2, "index": 2}),
]


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "shapes", "params"), CASES, ids=[f"{c[0][5:]}-{i}" for i, c in enumerate(CASES)])
def test_movement(name: str, shapes: list[tuple[int, ...]], params: dict[str, Any], dtype: torch.dtype) -> None:
    assert_kernel(name, [data(s, dtype, seed=k) for k, s in enumerate(shapes)], params)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.int32, torch.bool, torch.uint8, torch.int8], ids=str)
def test_sub_word_and_other_dtypes(dtype: torch.dtype) -> None:
    """8- and 16-bit elements share words with their neighbours (stored with atomics): odd sizes and offsets."""
    for name, shapes, params in [c for c in CASES if c[0] in {
            "aten.permute.default", "aten.cat.default", "aten.split_with_sizes.default", "aten.roll.default",
            "aten.select_scatter.default"}]:
        assert_kernel(name, [data(s, dtype, seed=k) for k, s in enumerate(shapes)], params)
    assert_kernel("aten.pad.default", [data((3, 7), dtype)], {"pad": [-1, 2], "mode": "constant", "value": 1.0})


# views are dispatched (rather than aliased) when their input is a weight
VIEWS = [
    ("aten.reshape.default", (3, 5, 7), {"shape": [5, 21]}),
    ("aten.view.default", (2, 3, 4), {"size": [4, -1]}),
    ("aten._unsafe_view.default", (3, 5), {"size": [15]}),
    ("aten.unsqueeze.default", (2, 3), {"dim": -1}),
    ("aten.squeeze.dims", (2, 1, 3, 1), {"dim": [1, -1]}),
    ("aten.squeeze.default", (1, 3, 1), {}),
    ("aten.flatten.using_ints", (2, 3, 4, 5), {"start_dim": 1, "end_dim": 2}),
    ("aten.unflatten.int", (2, 12), {"dim": -1, "sizes": [3, -1]}),
]


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "shape", "params"), VIEWS, ids=[v[0][5:] for v in VIEWS])
def test_dispatched_view(name: str, shape: tuple[int, ...], params: dict[str, Any], dtype: torch.dtype) -> None:
    program = assert_kernel(name, [data(shape, dtype)], params, weights=(0,))
    assert [d.kernel for d in program.dispatches] == [name]


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_modes(mode: str, dtype: torch.dtype) -> None:
    params = {"pad": [2, 1, 0, 3], "mode": mode, "value": -1.5 if mode == "constant" else None}
    assert_kernel("aten.pad.default", [data((2, 3, 5, 4), dtype)], params)
    assert_kernel("aten.pad.default", [data((2, 5, 6), dtype)], {"pad": [3, 2], "mode": mode, "value": None})


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_index_tensor(dtype: torch.dtype) -> None:
    x = data((5, 4, 3), dtype)
    assert_kernel("aten.index.Tensor", [x, ix((2, 3), -5, 5)], {"indices": [1]})
    assert_kernel("aten.index.Tensor", [x, ix((6,), -4, 4)], {"indices": [None, 1]})
    # adjacent index tensors broadcast in place; separated ones put their shape first
    assert_kernel("aten.index.Tensor", [x, ix((2, 1), 0, 5), ix((3,), -4, 4, seed=2)], {"indices": [1, 2]})
    assert_kernel("aten.index.Tensor", [x, ix((2, 1), 0, 5), ix((3,), -3, 3, seed=2)], {"indices": [1, None, 2]})
    assert_kernel("aten.index.Tensor", [x, ix((7,), 0, 3).to(torch.int32)], {"indices": [None, None, 1]})


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gathers(dtype: torch.dtype) -> None:
    x = data((3, 5), dtype)
    assert_kernel("aten.gather.default", [x, ix((3, 4), 0, 5)], {"dim": -1})
    assert_kernel("aten.gather.default", [x, ix((2, 5), 0, 3)], {"dim": 0})
    assert_kernel("aten.index_select.default", [x, ix((6,), 0, 5)], {"dim": 1})
    assert_kernel("aten.index_select.default", [x, ix((4,), 0, 3).to(torch.int32)], {"dim": -2})


@needs_gpu
def test_out_of_range_indices_clamp() -> None:
    """torch raises on an index outside the dim; the kernel clamps it (never reading another tensor's memory):
    the program compiled for valid indices, run again on invalid ones (int64 past 32 bits included)."""
    x = data((5, 4))
    _, _, program = run_kernel("aten.index_select.default", [x, ix((5,), 0, 5)], {"dim": 0})
    bad = torch.tensor([7, -1, 2**40, -2**40, 4])
    device = Device("webgpu")
    values = [x, bad]
    inputs = {spec.name: NPUBuffer(new_tensor(device, spec, values[int(spec.name[2:])]), spec, device)
              for spec in program.input_specs}
    got = Executor(program, device).run(inputs)[program.output_specs[0].name].to_numpy()
    torch.testing.assert_close(torch.from_numpy(got), x[[4, 4, 4, 0, 4]], rtol=0, atol=0)


@needs_gpu
def test_cat_legacy_empty_and_mixed_dtypes() -> None:
    assert_kernel("aten.cat.default", [data((2, 3)), torch.zeros(0), data((1, 3), seed=2)],
                  {"tensors": [0, 1, 2], "dim": 0})
    assert_kernel("aten.cat.default", [data((2, 3)), data((2, 2), torch.int64)], {"tensors": [0, 1], "dim": 1})
    assert_kernel("aten.cat.default", [data((2, 3), torch.bool), data((1, 3), torch.bool)],
                  {"tensors": [0, 1], "dim": 0})


@needs_gpu
def test_copy_converts() -> None:
    assert_kernel("aten.copy.default", [data((2, 3)), data((3,), torch.int64)], {})
    assert_kernel("aten.copy.default", [data((2, 3), torch.int32), data((2, 3)) * 10], {})
    assert_kernel("aten.copy.default", [data((4, 3), torch.bool), torch.tensor([0.0, 0.5, -2.0])], {})
    assert_kernel("aten.copy.default", [data((4, 3), torch.bfloat16), data((4, 1))], {})


@needs_gpu
@pytest.mark.parametrize(("size", "value", "dtype"), [
    ([3, 5], 1.5, "float32"), ([7], -2.25, "bfloat16"), ([2, 3], 2**40 + 3, "int64"), ([5], -7, "int64"),
    ([3, 3], True, "bool"), ([4], -3, "int32"), ([], 4.0, "float32"), ([3], {"float": "-inf"}, "float32"),
    ([300], 2.0, "float16")])
def test_full(size: list[int], value: Any, dtype: str) -> None:
    assert_kernel("aten.full.default", [], {"size": size, "fill_value": value, "dtype": {"dtype": dtype}})


# -- NHWC inputs: an identity max pool makes its output NHWC on this target, the kernel then reads it -----------

def assert_after_nhwc(name: str, values: list[torch.Tensor], params: dict[str, Any], rtol: float = 0.0,
                      atol: float = 0.0) -> None:
    """Kernel ``name`` on ``values``, its first input read from an NHWC activation (an identity pooling's)."""
    metas = [TensorMeta(f"in{i}", list(v.shape), dtype_name(v.dtype), role="input") for i, v in enumerate(values)]
    pooled = TensorMeta("pooled", list(values[0].shape), dtype_name(values[0].dtype))
    probe = OpNode("probe", name, metas, [], dict(params))
    outs = [TensorMeta(f"out{i}", list(o.shape), dtype_name(o.dtype))
            for i, o in enumerate(bind_kernel(probe, torch.device("cpu"))(values, {}))]
    nodes = [OpNode("pool", "aten.max_pool2d.default", metas[:1], [pooled], {"kernel_size": [1, 1], "stride": [1, 1]}),
             OpNode("k0", name, [pooled, *metas[1:]], outs, dict(params))]
    ir = NPU_IR(model_name="nhwc", graph_inputs=metas, graph_outputs=outs, weights=[], nodes=nodes)
    expected = IRExecutor(ir, {}).run(list(values))
    program = npu_compiler.compile(ir, target="webgpu",
                                   options=CompileOptions(normalize=False, fuse=False, public_output_names=False))
    assert program.tensors["pooled"].layout == "NHWC"
    assert [d.kernel for d in program.dispatches] == ["aten.max_pool2d.default", name]
    device = Device("webgpu")
    inputs = {spec.name: NPUBuffer(new_tensor(device, spec, values[int(spec.name[2:])]), spec, device)
              for spec in program.input_specs}
    got = Executor(program, device).run(inputs)
    for spec, want in zip(program.output_specs, expected):
        torch.testing.assert_close(torch.from_numpy(got[spec.name].to_numpy()).to(want.dtype), want, rtol=rtol,
                                   atol=atol)


NHWC_CASES: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("aten.flatten.using_ints", [(2, 3, 4, 5)], {"start_dim": 1}),
    ("aten.view.default", [(2, 3, 4, 5)], {"size": [6, 20]}),
    ("aten.permute.default", [(2, 3, 4, 5)], {"dims": [0, 2, 3, 1]}),
    ("aten.slice.Tensor", [(1, 5, 4, 3)], {"dim": 1, "start": 1, "end": 4, "step": 2}),
    ("aten.select.int", [(2, 3, 4, 5)], {"dim": -1, "index": 3}),
    ("aten.cat.default", [(1, 3, 4, 5), (1, 2, 4, 5)], {"tensors": [0, 1], "dim": 1}),
    ("aten.split_with_sizes.default", [(1, 5, 2, 3)], {"split_sizes": [2, 3], "dim": 1}),
    ("aten.pad.default", [(1, 3, 4, 5)], {"pad": [1, 1, 2, 0], "mode": "reflect", "value": None}),
    ("aten.flip.default", [(1, 3, 4, 5)], {"dims": [1, 2]}),
    ("aten.index_select.default", [(1, 5, 2, 3), "index"], {"dim": 1}),
]


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("name", "shapes", "params"), NHWC_CASES, ids=[c[0][5:] for c in NHWC_CASES])
def test_nhwc_input(name: str, shapes: list[Any], params: dict[str, Any], dtype: torch.dtype) -> None:
    values = [ix((4,), 0, 5) if s == "index" else data(s, dtype, seed=k) for k, s in enumerate(shapes)]
    assert_after_nhwc(name, values, params)
