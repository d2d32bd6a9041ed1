"""Writing GGUF files in tests with the llama.cpp project's own writer (``gguf.GGUFWriter``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np


def write_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, str]],
               fill: Callable[[gguf.GGUFWriter], Any] | None = None, alignment: int | None = None) -> Path:
    """Write ``tensors`` (name -> (float32 array in torch order, GGML type name)) quantized by gguf itself,
    after the metadata ``fill`` adds; returns ``path``."""
    w = gguf.GGUFWriter(path, arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    if fill is not None:
        fill(w)
    for name, (array, type_name) in tensors.items():
        qtype = gguf.GGMLQuantizationType[type_name]
        if type_name == "F32":
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(array.astype(np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
