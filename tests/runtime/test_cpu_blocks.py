"""Block-quantized weight slots on the CPU backend (``npu_runtime.backends.cpu_blocks``): the linear kernels read the
GGUF blocks, EMBEDDING dequantizes the rows it gathers, any other kernel gets the slot dequantized at bind time.
References: the ``gguf`` package's ``dequantize`` and float64 products."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from npu_program.program import Dispatch, TensorSpec, block_of
from npu_runtime.backends.cpu_blocks import BlockLinear, Dequantized
from npu_runtime.backends.cpu_kernels import make_kernel
from torch_ir.quant.spec import BLOCK_BYTES, BLOCK_CODES, BLOCKS, QuantSpec

GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q5_0": gguf.GGMLQuantizationType.Q5_0, "q6_K": gguf.GGMLQuantizationType.Q6_K}


def _blocks(layout: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks uint8 [n, row bytes], their values float64 [n, k] by the gguf package) of random weights, quantized
    by the gguf package's own quantizer; Q6_K, which it cannot quantize, as random bytes with a finite fp16 d."""
    rng = np.random.default_rng(seed)
    if layout == "q6_K":
        raw = rng.integers(0, 256, size=(n, k // 256, 210), dtype=np.uint8)
        raw[..., 208:210] = (rng.standard_normal((n, k // 256, 1)) * 0.002).astype(np.float16).view(np.uint8)
        raw = raw.reshape(n, -1)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), GGML[layout])
    values = gguf.quants.dequantize(raw, GGML[layout]).astype(np.float64)
    return torch.from_numpy(np.ascontiguousarray(raw)), torch.from_numpy(values)


def _spec(name: str, shape: list[int], layout: str | None = None, dtype: str = "float32") -> TensorSpec:
    quant = QuantSpec(BLOCK_CODES[layout], block=layout) if layout else None
    return TensorSpec(name, shape, dtype, quant=quant)


def _bound(x: torch.Tensor, w: torch.Tensor, k: int) -> torch.Tensor:
    """Higham's bound on an fp32 dot product of length k, with room for the summation order: 2·k·u·Σ|x·w|."""
    return 2 * k * 2.0 ** -24 * (x.abs().double() @ w.abs().t()) + 1e-30


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_mixed_parts_with_bias_and_residual_match_the_dequantized_weights(rows: int) -> None:
    k = 128
    (q, qv), (k8, kv), (v, vv) = _blocks("q4_0", 64, k, 1), _blocks("q8_0", 32, k, 2), _blocks("q8_0", 32, k, 3)
    f = torch.randn(16, k, generator=torch.Generator().manual_seed(12))  # a float part beside the blocks
    bias = torch.randn(144, generator=torch.Generator().manual_seed(4))
    linear = BlockLinear([(q, "q4_0"), (k8, "q8_0"), (v, "q8_0"), (f, None)], bias)
    assert [p.n for p in linear.parts] == [64, 64, 16]  # k and v, both q8_0, are one GEMV
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(5))
    residual = torch.randn(rows, 144, generator=torch.Generator().manual_seed(6))
    out = torch.empty(rows, 144)
    linear(x, out, residual)
    w = torch.cat([qv, kv, vv, f.double()])
    want = x.double() @ w.t() + bias.double() + residual.double()
    assert torch.all((out.double() - want).abs() <= _bound(x, w, k) + 1e-6 * want.abs())


def test_bf16_activations_are_computed_in_fp32_and_rounded_once() -> None:
    raw, values = _blocks("q8_0", 48, 64, 7)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(8)).bfloat16()
    out = torch.empty(2, 48, dtype=torch.bfloat16)
    BlockLinear([(raw, "q8_0")], None)(x, out)
    want = (x.double() @ values.t()).float()
    assert torch.all((out.float() - want).abs() <= want.abs() * 2 ** -8 + 1e-6)  # one bf16 rounding


def test_embedding_reads_only_the_rows_it_gathers_exactly() -> None:
    raw, values = _blocks("q4_0", 40, 64, 9)
    table, ids = _spec("table", [40, 64], "q4_0"), TensorSpec("ids", [1, 5], "int64")
    dispatch = Dispatch("EMBEDDING", "emb", ["table", "ids"], ["y"])
    specs = {"table": table, "ids": ids, "y": TensorSpec("y", [1, 5, 64], "float32")}
    kernel = make_kernel(dispatch, specs, {"table"})
    assert type(kernel).__name__ == "BlockEmbedding"
    out = torch.empty(1, 5, 64)
    index = torch.tensor([[3, 0, 39, 3, 17]])
    kernel.run([raw, index], [out])
    assert torch.equal(out[0], values[index[0]].float())
    with pytest.raises(IndexError, match="id 40 is outside the table of 40 rows"):
        kernel.run([raw, torch.tensor([[1, 40, 2, 2, 2]])], [out])


def test_a_kernel_without_block_reads_gets_the_weight_dequantized_at_bind() -> None:
    raw, values = _blocks("q8_0", 16, 32, 10)
    # GEMM with trans_b=False reads w as [K, N]: not how blocks lie, so the linear kernel refuses it
    dispatch = Dispatch("GEMM", "g", ["x", "w"], ["y"], params={"trans_b": False})
    specs = {"x": TensorSpec("x", [4, 16], "float32"), "w": _spec("w", [16, 32], "q8_0"),
             "y": TensorSpec("y", [4, 32], "float32")}
    kernel = make_kernel(dispatch, specs, {"w"})
    assert isinstance(kernel, Dequantized)
    kernel.prepare({"w": raw})
    x, out = torch.randn(4, 16, generator=torch.Generator().manual_seed(11)), torch.empty(4, 32)
    kernel.run([x, raw], [out])
    assert torch.allclose(out.double(), x.double() @ values, rtol=1e-5, atol=1e-5)


def test_block_tables_agree() -> None:
    from npu_runtime.backends.cpu_qgemv import QTYPES

    assert set(BLOCKS) == set(BLOCK_BYTES) == set(BLOCK_CODES) == set(QTYPES)  # every layout has a native GEMV
    assert block_of(_spec("w", [2, 32], "q8_0")) == "q8_0" and block_of(TensorSpec("w", [2, 32], "float32")) is None
    assert _spec("w", [2, 64], "q4_0").storage == ("uint8", [2, 36]) and _spec("w", [2, 64], "q4_0").nbytes == 72


def test_the_prefill_and_decode_kernels_share_one_concatenation_of_the_same_weights() -> None:
    from npu_runtime.backends.cpu_blocks import stacked

    a, b = torch.randn(3, 4), torch.randn(2, 4)
    first = stacked([a, b])
    assert stacked([a, b]) is first and torch.equal(first, torch.cat([a, b]))
    assert stacked([b, a]) is not first and stacked([a]) is a


@pytest.mark.parametrize("layouts", [("q4_0",), ("q8_0",), ("q5_0",), ("q6_K",), ("q4_0", "q8_0"), ("q5_0", "q8_0"),
                                     ("q8_0", "q6_K"), ("q6_K", None)])
@pytest.mark.parametrize(("rows", "prefill"), [(3, None), (16, "native"), (16, "rounded"), (16, None)])
def test_int8_activations_compute_the_ops_reference(monkeypatch, layouts: tuple[str | None, ...], rows: int,
                                                    prefill: str | None) -> None:
    """``x_int8_group=32``: the block kernels' integer dot products (x quantized by the kernel: decode rows, and a
    prefill's where they run faster or are forced) and the float path's product with the int8-rounded x (a float
    part; the other prefill calls) give the GEMM reference's value on the dequantized weights. Unforced, a
    prefill's calls try both (a fresh policy: two calls each first)."""
    from npu_runtime.backends import cpu_blocks
    from npu_runtime.backends.cpu_gemv import _PathPolicy
    from npu_runtime.backends.cpu_qgemv import PREFILL_ROWS
    from torch_ir.ops.npu import gemm

    monkeypatch.setattr(cpu_blocks, "INT8_PREFILL", prefill)
    monkeypatch.setattr(cpu_blocks, "_INT8_PATHS", policy := _PathPolicy())
    k = 256
    floats = torch.randn(48, k, generator=torch.Generator().manual_seed(22))  # a float part: given the rounded x
    parts = [_blocks(layout, 48, k, 20 + i) if layout else (floats, floats.double())
             for i, layout in enumerate(layouts)]
    linear = BlockLinear([(raw, layout) for (raw, _), layout in zip(parts, layouts)], None, int8=True)
    assert [p.int8 for p in linear.parts] == [layout is not None for layout in layouts]
    if rows < PREFILL_ROWS or prefill is not None:
        native = [p.native_int8(rows) for p in linear.parts]
        assert native == [layout is not None and (rows < PREFILL_ROWS or prefill == "native") for layout in layouts]
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(21))
    out = torch.empty(rows, 48 * len(layouts))
    w = torch.cat([values for _, values in parts]).float()
    want = gemm(x.double(), w.double(), x_int8_group=32)  # the op's reference, in float64
    xq = gemm(x, w, x_int8_group=32)  # the same in float32: the rounding of x is decided in x's own type
    assert torch.allclose(want.float(), xq, rtol=1e-4, atol=1e-4)
    bound = _bound(x, w.double(), k) * 4 + 1e-6 * want.abs()  # the kernel sums per group, then across groups
    for _ in range(5 if rows >= PREFILL_ROWS and prefill is None else 1):
        out.fill_(float("nan"))
        linear(x, out)
        assert torch.all((out.double() - xq.double()).abs() <= bound)
    tried = {choice for _, choice in policy.samples}
    assert tried == ({True, False} if rows >= PREFILL_ROWS and prefill is None and any(layouts) else set())
    monkeypatch.setattr(cpu_blocks, "INT8_PREFILL", "int8")
    with pytest.raises(ValueError, match="INT8_PREFILL = 'int8' is not None, 'native' or 'rounded'"):
        linear(x, out)
    assert (out - gemm(x, w)).abs().max() > 0  # and it is not the float product
