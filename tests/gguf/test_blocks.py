"""blocks.py against the llama.cpp project's own Python reference (``gguf.quants``): the type table's block
sizes, and dequantization equal bit for bit on random blocks and on blocks gguf quantized from floats."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as ref_dequantize
from gguf.quants import quantize as ref_quantize

from torch_ir.errors import IRValidationError
from torch_ir.frontends.gguf import DEQUANTIZABLE, TYPES, block_bytes, dequantize, elements_per_block, spec_block
from torch_ir.limits import limits
from torch_ir.quant.spec import BLOCKS

# where each block type keeps its fp16 scales (and mins): random bytes there could be inf/NaN, which would
# make the comparison meaningless, so the tests write finite fp16 values at these offsets
SCALE_OFFSETS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def test_type_table_matches_gguf() -> None:
    assert {t.name for t in TYPES.values()} == {q.name for q in gguf.GGMLQuantizationType}
    for q in gguf.GGMLQuantizationType:
        elems, nbytes = gguf.GGML_QUANT_SIZES[q]
        assert TYPES[int(q)].name == q.name
        assert (elements_per_block(int(q)), block_bytes(q.name)) == (elems, nbytes), q.name


def test_spec_block_names_match_quant_spec() -> None:
    assert {spec_block(name) for name in ("Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K")} == set(BLOCKS)
    for name, elems in BLOCKS.items():
        assert elements_per_block(name.upper()) == elems


def _random_blocks(name: str, n_blocks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    nbytes = block_bytes(name)
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    for off in SCALE_OFFSETS[name]:
        # finite scales of every magnitude fp16 has, subnormals and negatives included
        scales = (rng.standard_normal(n_blocks) * np.exp2(rng.integers(-24, 15, n_blocks))).astype(np.float16)
        scales[~np.isfinite(scales)] = np.float16(1.0)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw


@pytest.mark.parametrize("name", DEQUANTIZABLE)
def test_random_blocks_bit_exact(name: str) -> None:
    qtype = gguf.GGMLQuantizationType[name]
    elems = elements_per_block(name)
    raw = _random_blocks(name, 96, seed=len(name) + elems).reshape(3, -1)  # 3 rows of 32 blocks
    expected = ref_dequantize(raw, qtype)
    assert np.isfinite(expected).all()
    got = dequantize(torch.from_numpy(raw), name, expected.shape)
    assert got.dtype == torch.float32 and tuple(got.shape) == expected.shape
    assert torch.equal(got, torch.from_numpy(expected))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0"])
def test_quantized_floats_bit_exact(name: str) -> None:
    qtype = gguf.GGMLQuantizationType[name]
    x = np.random.default_rng(7).standard_normal((8, 4, 128)).astype(np.float32) * 3
    x[0, 0, :32] = 0  # an all-zero block: scale 0
    raw = ref_quantize(x, qtype)
    expected = ref_dequantize(raw, qtype)
    got = dequantize(torch.from_numpy(raw), name, x.shape)
    assert torch.equal(got, torch.from_numpy(expected))


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_plain_types(name: str) -> None:
    qtype = gguf.GGMLQuantizationType[name]
    x = np.random.default_rng(3).standard_normal((5, 6)).astype(np.float32)
    raw = ref_quantize(x, qtype)
    expected = ref_dequantize(raw, qtype)
    got = dequantize(torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8)), name, x.shape)
    assert torch.equal(got, torch.from_numpy(expected))


def test_bad_arguments_are_refused() -> None:
    raw = torch.zeros(34, dtype=torch.uint8)
    with pytest.raises(IRValidationError, match="innermost dimension must be a multiple of 32"):
        dequantize(raw, "Q8_0", (2, 16))
    with pytest.raises(IRValidationError, match="34 bytes given, 2 blocks of 34 bytes need 68"):
        dequantize(raw, "Q8_0", (64,))
    with pytest.raises(IRValidationError, match="IQ2_XXS blocks cannot be dequantized yet"):
        dequantize(torch.zeros(66, dtype=torch.uint8), "IQ2_XXS", (256,))
    with pytest.raises(IRValidationError, match="not a known type"):
        dequantize(raw, 99, (32,))
    with limits(max_alloc_bytes=1000), pytest.raises(Exception, match="over the .* limit"):
        dequantize(raw, "Q8_0", (1 << 20, 32))
