"""GGML tensor types: bytes per block, and bit-exact dequantization of the common block layouts in torch.

A GGUF tensor of a block type stores its innermost dimension (GGUF's ``ne[0]``) as consecutive blocks of
``elements_per_block(t)`` values packed into ``block_bytes(t)`` bytes. :func:`dequantize` unpacks them with
the same float32 operations, in the same order, as ggml's reference (``gguf.quants.dequantize``): the fp16
scales widen exactly, each product or difference rounds once, so the results are equal bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import IRValidationError
from ..limits import check_alloc

QK_K = 256  # elements of a k-quant super-block


@dataclass(frozen=True)
class GGMLType:
    """One GGML tensor type as GGUF numbers it (``ggml_type`` in ggml.h)."""

    id: int
    name: str
    block: int  # elements per block
    nbytes: int  # bytes per block


def _types() -> dict[int, GGMLType]:
    # ggml.h's ggml_type, with each block's size; ids 4, 5 (Q4_2, Q4_3) and 31-33 were removed upstream
    rows = [
        (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20), (6, "Q5_0", 32, 22),
        (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40), (10, "Q2_K", QK_K, 84),
        (11, "Q3_K", QK_K, 110), (12, "Q4_K", QK_K, 144), (13, "Q5_K", QK_K, 176), (14, "Q6_K", QK_K, 210),
        (15, "Q8_K", QK_K, 292), (16, "IQ2_XXS", QK_K, 66), (17, "IQ2_XS", QK_K, 74), (18, "IQ3_XXS", QK_K, 98),
        (19, "IQ1_S", QK_K, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", QK_K, 110), (22, "IQ2_S", QK_K, 82),
        (23, "IQ4_XS", QK_K, 136), (24, "I8", 1, 1), (25, "I16", 1, 2), (26, "I32", 1, 4), (27, "I64", 1, 8),
        (28, "F64", 1, 8), (29, "IQ1_M", QK_K, 56), (30, "BF16", 1, 2), (34, "TQ1_0", QK_K, 54),
        (35, "TQ2_0", QK_K, 66),
    ]
    return {i: GGMLType(i, name, block, nbytes) for i, name, block, nbytes in rows}


#: Every GGML type a GGUF file may name, by id.
TYPES: dict[int, GGMLType] = _types()
_BY_NAME = {t.name: t for t in TYPES.values()}

#: Plain (one element per "block") types and the torch dtype each is read as.
PLAIN_DTYPES: dict[str, torch.dtype] = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
}


def ggml_type(t: int | str | GGMLType) -> GGMLType:
    """The :class:`GGMLType` for an id (8), a name ("Q8_0", any case) or a type."""
    if isinstance(t, GGMLType):
        return t
    found = TYPES.get(t) if isinstance(t, int) else _BY_NAME.get(t) or _BY_NAME.get(str(t).upper())
    if found is None:
        known = ", ".join(f"{x.name}={x.id}" for x in TYPES.values())
        raise IRValidationError(f"GGML type {t!r} is not a known type; known: {known}")
    return found


def block_bytes(t: int | str | GGMLType) -> int:
    """Bytes of one block of type ``t`` (34 for Q8_0)."""
    return ggml_type(t).nbytes


def elements_per_block(t: int | str | GGMLType) -> int:
    """Elements in one block of type ``t`` (32 for Q8_0, 256 for the k-quants)."""
    return ggml_type(t).block


def spec_block(t: int | str | GGMLType) -> str:
    """The name ``torch_ir.quant.spec.QuantSpec.block`` uses for a block type ("q4_K" for Q4_K)."""
    name = ggml_type(t).name
    return name[:-1].lower() + "K" if name.endswith("_K") else name.lower()


def _field(blocks: torch.Tensor, start: int, stop: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Bytes [start, stop) of every block, reinterpreted as ``dtype`` (contiguous first: a field at an odd
    offset cannot be viewed in place as a wider type)."""
    return blocks[:, start:stop].contiguous().view(dtype)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at ``start`` of each block, widened (exactly) to float32, as a column."""
    return _field(blocks, start, start + 2, torch.float16).to(torch.float32)


def _nibbles(packed: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """Split (n, groups * width) bytes into (n, groups, 2, width): low nibbles, then high nibbles."""
    n = packed.shape[0]
    packed = packed.reshape(n, groups, 1, width)
    shifts = torch.tensor([0, 4], dtype=torch.uint8).reshape(1, 1, 2, 1)
    return (packed >> shifts) & 0x0F


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return _field(b, 2, 34, torch.int8).to(torch.float32) * _f16(b, 0)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(_field(b, 2, 18), 1, 16).reshape(b.shape[0], 32).to(torch.int8) - 8
    return _f16(b, 0) * q.to(torch.float32)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(_field(b, 4, 20), 1, 16).reshape(b.shape[0], 32).to(torch.float32)
    return _f16(b, 0) * q + _f16(b, 2)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    qh = _field(b, 2, 6).to(torch.int64)
    high = qh[:, 0] | (qh[:, 1] << 8) | (qh[:, 2] << 16) | (qh[:, 3] << 24)  # little-endian uint32
    high = ((high.reshape(n, 1) >> torch.arange(32)) & 1).to(torch.uint8)
    low = _nibbles(_field(b, 6, 22), 1, 16).reshape(n, 32)
    q = (low | (high << 4)).to(torch.int8) - 16
    return _f16(b, 0) * q.to(torch.float32)


def _q4_k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and 8 six-bit mins packed in a Q4_K/Q5_K block's 12 bytes (ggml's
    get_scale_min_k4): bytes 0-3 hold scales 0-3 (low 6 bits), 4-7 mins 0-3, 8-11 the low 4 bits of
    scales/mins 4-7, whose high 2 bits are the top bits of bytes 0-3 / 4-7."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _q4_k_scales(_field(b, 4, 16))
    d = (_f16(b, 0) * sc.to(torch.float32)).reshape(n, 8, 1)
    dm = (_f16(b, 2) * mn.to(torch.float32)).reshape(n, 8, 1)
    q = _nibbles(_field(b, 16, 144), 4, 32).reshape(n, 8, 32).to(torch.float32)
    return (d * q - dm).reshape(n, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = _nibbles(_field(b, 0, 128), 2, 64).reshape(n, 8, 32)  # low 4 bits
    qh = _field(b, 128, 192).reshape(n, 2, 1, 32)
    qh = ((qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)) & 0x03).reshape(n, 8, 32)
    q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(n, 16, 16).to(torch.float32)
    scales = _field(b, 192, 208, torch.int8).to(torch.float32)
    d = (_f16(b, 208) * scales).reshape(n, 16, 1)
    return (d * q).reshape(n, QK_K)


_DEQUANT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q4_K": _q4_k, "Q6_K": _q6_k,
}

#: The block types :func:`dequantize` unpacks.
DEQUANTIZABLE: tuple[str, ...] = tuple(_DEQUANT)


def dequantize_rows(raw: torch.Tensor, t: int | str | GGMLType) -> torch.Tensor:
    """A 2-D block tensor, ``uint8 [rows, row bytes]`` (whole blocks per row, as GGUF stores a weight), as float32
    ``[rows, row bytes / block bytes · elements]``."""
    gt = ggml_type(t)
    if raw.dim() != 2 or raw.shape[1] % gt.nbytes:
        raise IRValidationError(f"a {gt.name} tensor's rows are whole blocks of {gt.nbytes} bytes; got "
                                f"{list(raw.shape)}")
    return dequantize(raw, gt, (raw.shape[0], raw.shape[1] // gt.nbytes * gt.block))


def dequantize(raw: torch.Tensor, t: int | str | GGMLType, shape: Sequence[int]) -> torch.Tensor:
    """The float32 values of a tensor of logical (torch-order) ``shape`` stored as GGML type ``t`` in ``raw``
    (uint8 bytes of any shape for a block type; the values themselves for F32/F16/BF16)."""
    gt = ggml_type(t)
    shape = tuple(int(d) for d in shape)
    numel = 1
    for d in shape:
        numel *= d
    what = f"dequantizing a {gt.name} tensor of shape {list(shape)}"
    check_alloc(numel * 4, what)
    if gt.name in PLAIN_DTYPES and raw.dtype != torch.uint8:
        if raw.numel() != numel:
            raise IRValidationError(f"{what}: it holds {raw.numel()} values, the shape needs {numel}")
        return raw.to(torch.float32, copy=True).reshape(shape)  # a new tensor: views of the file are read-only
    if gt.name in PLAIN_DTYPES:
        return dequantize(raw.contiguous().view(PLAIN_DTYPES[gt.name]), gt, shape)
    fn = _DEQUANT.get(gt.name)
    if fn is None:
        raise IRValidationError(f"{what}: {gt.name} blocks cannot be dequantized yet; supported: "
                                f"{', '.join(DEQUANTIZABLE)} and the plain types {', '.join(PLAIN_DTYPES)}")
    if raw.dtype != torch.uint8:
        raise IRValidationError(f"{what}: the raw blocks must be a uint8 tensor, got {raw.dtype}")
    if (shape and shape[-1] % gt.block) or numel % gt.block:
        raise IRValidationError(f"{what}: the innermost dimension must be a multiple of {gt.block} (a block)")
    n_blocks = numel // gt.block
    if raw.numel() != n_blocks * gt.nbytes:
        raise IRValidationError(f"{what}: {raw.numel()} bytes given, {n_blocks} blocks of {gt.nbytes} bytes "
                                f"need {n_blocks * gt.nbytes}")
    return fn(raw.reshape(n_blocks, gt.nbytes)).reshape(shape)


__all__ = ["DEQUANTIZABLE", "PLAIN_DTYPES", "QK_K", "TYPES", "GGMLType", "block_bytes", "dequantize",
           "elements_per_block", "ggml_type", "spec_block"]
