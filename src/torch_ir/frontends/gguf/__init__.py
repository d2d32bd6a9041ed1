"""GGUF (llama.cpp's model format) in: a hardened reader, bit-exact block dequantization, the metadata as a
Hugging Face config, the tensor names as HF keys, and the tokenizer. See docs/gguf.md."""

from __future__ import annotations

from ...quant.blocks import (
    DEQUANTIZABLE,
    TYPES,
    GGMLType,
    block_bytes,
    dequantize,
    elements_per_block,
    ggml_type,
    spec_block,
)
from .config import (
    ARCHITECTURES,
    hf_config_dict,
    hf_name,
    hf_state_dict,
    hf_tensors,
    transformers_config,
    unpermute_qk,
)
from .reader import GGUFError, GGUFFile, GGUFTensor, TensorInfo, read_gguf
from .tokenizer import build_fast_tokenizer, build_tokenizer, token_ids

__all__ = [
    "ARCHITECTURES", "DEQUANTIZABLE", "TYPES", "GGMLType", "GGUFError", "GGUFFile", "GGUFTensor", "TensorInfo",
    "block_bytes", "build_fast_tokenizer", "build_tokenizer", "dequantize", "elements_per_block", "ggml_type",
    "hf_config_dict", "hf_name", "hf_state_dict", "hf_tensors", "read_gguf", "spec_block", "token_ids",
    "transformers_config", "unpermute_qk",
]
