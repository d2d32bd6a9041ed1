"""The WebGPU normalization, softmax, attention, rotary-embedding, KV-cache and embedding kernels
(``npu_runtime.backends.webgpu.transformer``) against their references, at the shapes their row loops,
reductions, blocked softmax and layouts could get wrong: long and odd rows, a middle softmax dim, NHWC
activations, grouped-query attention over a KV cache longer than the query, masks, 16-bit dtypes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import npu_compiler
from npu_compiler import CompileOptions
from npu_program.kernels import KERNELS, KernelTest
from npu_program.program import CompiledProgram, Dispatch, MemoryPlan, StateSpec, TensorSpec
from npu_runtime import Device, Executor, NPUBuffer, State, load_weights
from npu_runtime.backends.webgpu.transformer import kv_update
from npu_runtime.backends.webgpu.wgsl import Call, Shader
from npu_runtime.device import new_tensor
from tests.kernels.test_kernel_table import one_node_ir
from tests.webgpu.kernels import assert_kernel, needs_gpu
from torch_ir import IRExecutor

pytestmark = needs_gpu

BF16, F16 = torch.bfloat16, torch.float16


def rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def positive(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.rand(shape, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype)


def bools(*shape: int, seed: int = 2) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.4


def compile_one(name: str, values: list[torch.Tensor], params: dict[str, Any],
                weights: tuple[int, ...] = ()) -> CompiledProgram:
    test = KernelTest(tuple((tuple(v.shape), "*", "normal") for v in values), dict(params), weights)
    return npu_compiler.compile(one_node_ir(name, test, values), target="webgpu",
                                options=CompileOptions(normalize=False, fuse=False, public_output_names=False))


def run(program: CompiledProgram, values: list[torch.Tensor], weights: tuple[int, ...] = ()) -> list[torch.Tensor]:
    device = Device("webgpu")
    inputs = {s.name: NPUBuffer(new_tensor(device, s, values[int(s.name[2:])]), s, device) for s in program.input_specs}
    bound = load_weights({f"in{i}": values[i] for i in weights}, program, device)
    outputs = Executor(program, device).run(inputs, weights=bound)
    return [torch.from_numpy(outputs[s.name].to_numpy()) for s in program.output_specs]


def assert_nhwc(name: str, values: list[torch.Tensor], params: dict[str, Any], weights: tuple[int, ...] = (),
                nhwc: tuple[str, ...] = ("in0", "out0"), **tol: float) -> None:
    """The kernel with the 4-d tensors ``nhwc`` stored channels-last (as after a CONV on this target)."""
    program = compile_one(name, values, params, weights)
    for spec in [*program.tensors.values(), *program.input_specs, *program.output_specs]:
        if spec.name in nhwc:
            spec.layout = "NHWC"
    expected = IRExecutor(one_node_ir(name, KernelTest(tuple((tuple(v.shape), "*", "normal") for v in values),
                                                       dict(params), weights), values),
                          {f"in{i}": values[i] for i in weights}).run(
        [v for i, v in enumerate(values) if i not in weights])
    for got, want in zip(run(program, values, weights), expected):
        torch.testing.assert_close(got.to(want.dtype), want, equal_nan=True, **tol)


# -- normalizations -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("shape", "norm", "affine", "dtype"), [
    ((3, 4096), [4096], 2, torch.float32),
    ((2, 5, 7), [5, 7], 2, torch.float32),
    ((4, 33), [33], 0, torch.float32),
    ((4, 33), [33], 1, torch.float32),
    ((2, 5, 8), [8], 2, BF16),
    ((2, 5, 8), [8], 2, F16),
])
def test_layer_norm(shape, norm, affine, dtype):
    x = rand(*shape, dtype=dtype) * 3 + 5  # a large mean: a one-pass variance would lose it
    extra = [rand(*norm, dtype=dtype, seed=1), rand(*norm, dtype=dtype, seed=2)][:affine]
    assert_kernel("LAYER_NORM", [x, *extra], {"normalized_shape": norm, "eps": 1e-5},
                  weights=tuple(range(1, 1 + affine)), atol=1e-4)


@pytest.mark.parametrize("norm", [[5], [3, 4, 5]])
def test_layer_norm_nhwc(norm):
    x, w, b = rand(2, 3, 4, 5), rand(*norm, seed=1), rand(*norm, seed=2)
    assert_nhwc("LAYER_NORM", [x, w, b], {"normalized_shape": norm, "eps": 1e-5}, weights=(1, 2),
                rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("shape", "weight", "dtype"), [
    ((3, 4096), True, torch.float32), ((2, 7, 33), False, torch.float32), ((2, 5, 8), True, BF16),
    ((2, 5, 8), True, F16), ((65600, 2), True, torch.float32),  # more rows than one grid dimension holds
])
def test_rms_norm(shape, weight, dtype):
    values = [rand(*shape, dtype=dtype)] + ([rand(shape[-1], dtype=dtype, seed=1)] if weight else [])
    assert_kernel("RMS_NORM", values, {"eps": 1e-6}, weights=(1,) if weight else (), atol=1e-4)


def test_rms_norm_nhwc():
    assert_nhwc("RMS_NORM", [rand(1, 3, 4, 5), rand(5, seed=1)], {"eps": 1e-6}, weights=(1,), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("shape", "groups", "affine"), [((2, 8, 5, 7), 4, True), ((2, 8, 5, 7), 2, False),
                                                         ((1, 32, 3), 8, True), ((2, 4, 40, 40), 1, True)])
def test_group_norm(shape, groups, affine):
    c = shape[1]
    values = [rand(*shape) + 2] + ([rand(c, seed=1), rand(c, seed=2)] if affine else [])
    params = {"num_groups": groups, "eps": 1e-5} | ({} if affine else {"weight": None, "bias": None})
    assert_kernel("aten.group_norm.default", values, params, weights=(1, 2) if affine else (), atol=1e-4)


@pytest.mark.parametrize(("shape", "dtype"), [((2, 4, 5, 5), torch.float32), ((3, 6), torch.float32),
                                              ((2, 4, 3, 3), F16)])
def test_batch_norm(shape, dtype):
    c = shape[1]
    values = [rand(*shape, dtype=dtype), rand(c, dtype=dtype, seed=1), rand(c, dtype=dtype, seed=2),
              rand(c, dtype=dtype, seed=3), positive(c, dtype=dtype)]
    assert_kernel("BATCH_NORM", values, {"eps": 1e-5}, weights=(1, 2, 3, 4))


def test_batch_norm_nhwc():
    values = [rand(2, 5, 3, 4), rand(5, seed=1), rand(5, seed=2), rand(5, seed=3), positive(5)]
    assert_nhwc("BATCH_NORM", values, {"eps": 1e-5}, weights=(1, 2, 3, 4), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("shape", "size", "dtype"), [
    ((2, 7, 3, 5), 4, torch.float32), ((2, 7, 3, 5), 1, torch.float32), ((2, 5, 6), 3, torch.float32),
    ((1, 6, 4, 4), 5, F16),
])
def test_lrn(shape, size, dtype):
    assert_kernel("LRN", [rand(*shape, dtype=dtype)], {"size": size, "alpha": 0.1, "beta": 0.75, "k": 2.0})


def test_lrn_nhwc():
    assert_nhwc("LRN", [rand(1, 6, 3, 5)], {"size": 3, "alpha": 0.1, "beta": 0.75, "k": 1.0}, rtol=1e-5, atol=1e-5)


# -- softmax --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("shape", "dim", "scale", "dtype"), [
    ((3, 4096), -1, 1.0, torch.float32), ((3, 37, 5), 1, 0.3, torch.float32), ((4, 3, 2), 0, 2.0, torch.float32),
    ((2, 3, 300), -1, 0.5, F16), ((2, 3, 7), 2, 0.5, BF16), ((5,), 0, 1.0, torch.float32),
])
def test_softmax(shape, dim, scale, dtype):
    assert_kernel("SOFTMAX", [rand(*shape, dtype=dtype) * 4], {"dim": dim, "scale": scale})


def test_softmax_bool_mask_keeps_true_and_a_fully_masked_row_is_nan():
    mask = bools(3, 9)
    mask[1] = False
    assert_kernel("SOFTMAX", [rand(2, 3, 9), mask], {"dim": -1, "scale": 0.5})


def test_softmax_additive_mask_over_a_middle_dim():
    mask = rand(1, 6, 4)
    mask[0, 2, 1] = float("-inf")
    assert_kernel("SOFTMAX", [rand(2, 6, 4), mask], {"dim": 1, "scale": 1.0})


def test_softmax_over_nhwc_channels():
    assert_nhwc("SOFTMAX", [rand(2, 5, 3, 4)], {"dim": 1, "scale": 1.0}, rtol=1e-5, atol=1e-6)


# -- attention ------------------------------------------------------------------------------------------------

def qkv(b: int, h: int, hkv: int, t: int, s: int, d: int, dv: int | None = None,
        dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [rand(b, h, t, d, dtype=dtype), rand(b, hkv, s, d, dtype=dtype, seed=1),
            rand(b, hkv, s, dv or d, dtype=dtype, seed=2)]


@pytest.mark.parametrize("merge", [True, False])
def test_attention_decode_step_over_a_cache_gqa_4_to_1_with_a_bool_mask(merge):
    mask = bools(1, 1, 1, 37)
    assert_kernel("ATTENTION", [*qkv(1, 8, 2, 1, 37, 64), mask], {"scale": 0.125, "causal": False,
                                                                   "merge_heads": merge}, atol=1e-5)


def test_attention_causal_is_top_left_aligned_with_a_longer_cache():
    assert_kernel("ATTENTION", qkv(2, 2, 2, 3, 9, 16), {"scale": 0.25, "causal": True, "merge_heads": True})


def test_attention_fully_masked_row_is_zeros_and_float_mask_adds():
    mask = bools(2, 1, 3, 6)
    mask[0, 0, 1] = False
    assert_kernel("ATTENTION", [*qkv(2, 4, 1, 3, 6, 8), mask], {"scale": 0.5, "causal": True, "merge_heads": False})
    additive = rand(2, 1, 3, 6)
    additive[1, 0, 2, :4] = float("-inf")
    assert_kernel("ATTENTION", [*qkv(2, 4, 2, 3, 6, 8), additive], {"scale": 0.5, "causal": False,
                                                                     "merge_heads": True})


def test_attention_cache_longer_than_one_block():
    assert_kernel("ATTENTION", qkv(1, 2, 1, 1, 4500, 64), {"scale": 0.125, "causal": False, "merge_heads": True})


def test_attention_value_head_wider_than_the_workgroup():
    assert_kernel("ATTENTION", qkv(1, 2, 2, 2, 5, 8, dv=300), {"scale": 0.3, "causal": False, "merge_heads": True})


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_attention_16_bit(dtype):
    assert_kernel("ATTENTION", [*qkv(1, 4, 2, 2, 11, 64, dtype=dtype), bools(1, 1, 2, 11)],
                  {"scale": 0.125, "causal": False, "merge_heads": True})


def test_attn_score_causal_gqa_and_masks():
    assert_kernel("ATTN_SCORE", qkv(1, 4, 2, 3, 10, 16)[:2], {"scale": 0.25, "causal": True})
    mask = bools(1, 1, 3, 10)
    mask[0, 0, 0] = False
    assert_kernel("ATTN_SCORE", [*qkv(1, 4, 1, 3, 10, 16)[:2], mask], {"scale": 0.25, "causal": False})
    assert_kernel("ATTN_SCORE", [*qkv(2, 2, 2, 1, 600, 8)[:2], rand(2, 1, 1, 600)], {"scale": 0.5, "causal": False})


@pytest.mark.parametrize("merge", [True, False])
def test_attn_output_gqa(merge):
    p = torch.softmax(rand(2, 4, 3, 37), -1)
    assert_kernel("ATTN_OUTPUT", [p, rand(2, 2, 37, 20, seed=3)], {"merge_heads": merge})


def test_attn_output_long_rows_bf16():
    p = torch.softmax(rand(1, 2, 1, 700), -1).to(BF16)
    assert_kernel("ATTN_OUTPUT", [p, rand(1, 1, 700, 64, dtype=BF16, seed=3)], {"merge_heads": True})


# -- rope, kv cache, embedding -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("x", "cs", "dtype"), [((1, 2, 5, 64), (5, 64), torch.float32),
                                                ((2, 3, 4, 7), (1, 1, 4, 7), torch.float32),
                                                ((1, 2, 5, 8), (5, 8), BF16), ((1, 2, 5, 8), (1, 5, 8), F16)])
def test_rope(x, cs, dtype):
    assert_kernel("ROPE", [rand(*x, dtype=dtype), rand(*cs, dtype=dtype, seed=1), rand(*cs, dtype=dtype, seed=2)], {})


@pytest.mark.parametrize("dtype", [torch.float32, F16])
def test_rope_qk(dtype):
    values = [rand(2, 4, 3, 16, dtype=dtype), rand(2, 1, 3, 16, dtype=dtype, seed=1),
              rand(3, 16, dtype=dtype, seed=2), rand(3, 16, dtype=dtype, seed=3)]
    assert_kernel("ROPE_QK", values, {})


@pytest.mark.parametrize(("cache", "new", "dim", "dtype"), [
    ((1, 2, 8, 4), (1, 2, 3, 4), 2, torch.float32), ((2, 9, 3), (2, 2, 3), -2, F16),
    ((3, 5), (3, 2), 1, torch.bool), ((4, 6), (2, 6), 0, torch.int64), ((2, 7, 3), (2, 3, 3), 1, BF16),
])
def test_kv_update_copy_path(cache, new, dim, dtype):
    n = new[dim]
    pos = torch.randperm(cache[dim], generator=torch.Generator().manual_seed(4))[:n]
    if dtype == torch.bool:
        values = [bools(*cache), bools(*new, seed=5)]
    elif dtype == torch.int64:
        values = [torch.randint(-2**40, 2**40, cache), torch.randint(-2**40, 2**40, new)]  # both words matter
    else:
        values = [rand(*cache, dtype=dtype), rand(*new, dtype=dtype, seed=5)]
    assert_kernel("KV_UPDATE", [*values, pos], {"dim": dim})


def test_kv_update_skips_positions_outside_the_cache():
    cache, new = rand(1, 2, 6, 4), rand(1, 2, 2, 4, seed=5)
    program = compile_one("KV_UPDATE", [cache, new, torch.tensor([0, 1])], {"dim": 2})
    (got,) = run(program, [cache, new, torch.tensor([4, 6])])
    want = cache.clone()
    want[:, :, 4] = new[:, :, 0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_kv_update_in_place_on_a_state_slot():
    """A program whose KV_UPDATE writes its state slot in place (as a compiled LLM's does), then reads it."""
    new, pos, y = TensorSpec("new", [1, 2, 2, 4], "float32"), TensorSpec("pos", [2], "int64"), \
        TensorSpec("y", [1, 2, 8, 4], "float32")
    program = CompiledProgram(
        model_name="kv", target="webgpu", input_specs=[new, pos], output_specs=[y], weight_specs=[], weight_keys={},
        tensors={"new": new, "pos": pos, "y": y},
        dispatches=[Dispatch("KV_UPDATE", "write", ["kv", "new", "pos"], ["kv"], {"dim": 2}),
                    Dispatch("aten.neg.default", "read", ["kv"], ["y"])],
        memory=MemoryPlan(arena_bytes=768, offsets={"new": 0, "pos": 256, "y": 512}, no_reuse_bytes=768,
                          alignment=256),
        state_specs=[StateSpec("kv", [1, 2, 8, 4], "float32")])
    write = program.dispatches[0]
    call = Call(write, KERNELS["KV_UPDATE"], (program.state_specs[0].tensor_spec(), new, pos),
                (program.state_specs[0].tensor_spec(),), has_f16=False)
    assert isinstance(kv_update(call), Shader)  # the scatter alone: no copy of the cache
    device = Device("webgpu")
    state = State(program, device)
    executor = Executor(program, device)
    want = torch.zeros(1, 2, 8, 4)
    for step, at in enumerate(([0, 1], [5, 2])):
        values = rand(1, 2, 2, 4, seed=step)
        out = executor.run({"new": values.numpy(), "pos": np.array(at, dtype=np.int64)}, state=state)
        want[:, :, at] = values
        torch.testing.assert_close(torch.from_numpy(out["y"].to_numpy()), -want)
    torch.testing.assert_close(torch.from_numpy(state["kv"].to_numpy()), want)


@pytest.mark.parametrize("dtype", [torch.float32, BF16, torch.int32, torch.int64])
def test_embedding_as_the_reference(dtype):
    table = (rand(10, 5) * 100).to(dtype)
    if dtype == torch.int64:
        table = table * 2**35  # both words matter
    assert_kernel("EMBEDDING", [table, torch.tensor([[0, 9, 1], [5, 3, 4]])], {}, weights=(0,))
    # ONNX Gather's lookup: a negative id counts from the end
    assert_kernel("EMBEDDING", [table, torch.tensor([[0, 9, -1], [-10, -3, 4]])], {"negative_wraps": True},
                  weights=(0,))


@pytest.mark.parametrize(("params", "rows"), [({}, [9, 0, 3, 0]), ({"negative_wraps": True}, [9, 0, 3, 9])])
def test_embedding_clamps_an_id_that_skipped_the_host_check(params, rows):
    """An id outside the table that reaches the shader anyway (written straight into its arena slot, past the
    Executor's copy-in check) reads a row of the table, never past its buffer: a shader cannot raise."""
    table, ids = rand(10, 5), torch.tensor([[12, -11, 3, -1]])
    program = compile_one("EMBEDDING", [table, torch.zeros_like(ids)], params, weights=(0,))
    device = Device("webgpu")
    executor = Executor(program, device)
    executor.ensure_bound(load_weights({"in0": table}, program, device))
    device.backend.copy_in(executor.tensors[program.input_specs[0].name], ids.numpy())
    executor.run_steps()
    (got,) = executor.copy_out().values()
    torch.testing.assert_close(torch.from_numpy(got.to_numpy()), table[torch.tensor([rows])], rtol=0, atol=0)
