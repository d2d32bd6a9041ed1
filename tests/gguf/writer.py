"""Writing GGUF files in tests with the llama.cpp project's own writer (``gguf.GGUFWriter``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

#: Byte offsets of the fp16 super-block scales of the k-quants gguf's Python package cannot quantize to (Q4_K: d, dmin;
#: Q6_K: d), which :func:`random_k_blocks` sets to small values so that the weights are of a trained model's size.
K_QUANT_SCALES = {"Q4_K": (0, 2), "Q6_K": (208,)}


def random_k_blocks(shape: tuple[int, ...], type_name: str, seed: int) -> np.ndarray:
    """Random ``type_name`` blocks for a tensor of ``shape`` (the array's values are not used: gguf has no k-quant
    quantizer), codes and sub-block scales random, super-block scales ~1e-3 so the weights are O(0.01-0.1);
    tests compare against these blocks dequantized by gguf, the reference."""
    elems, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    n_blocks = int(np.prod(shape)) // elems
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    for off in K_QUANT_SCALES[type_name]:
        scales = (rng.uniform(0.2, 1.0, n_blocks) * 2e-3).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(*shape[:-1], shape[-1] // elems * nbytes)


def write_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, str]],
               fill: Callable[[gguf.GGUFWriter], Any] | None = None, alignment: int | None = None) -> Path:
    """Write ``tensors`` (name -> (float32 array in torch order, GGML type name)) quantized by gguf itself,
    after the metadata ``fill`` adds; returns ``path``."""
    w = gguf.GGUFWriter(path, arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    if fill is not None:
        fill(w)
    for i, (name, (array, type_name)) in enumerate(tensors.items()):
        qtype = gguf.GGMLQuantizationType[type_name]
        if type_name == "F32":
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
        elif type_name in K_QUANT_SCALES:
            w.add_tensor(name, random_k_blocks(array.shape, type_name, seed=i), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(array.astype(np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
