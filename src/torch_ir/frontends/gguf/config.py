"""A GGUF file's metadata as a Hugging Face config, and its tensor names as HF state-dict keys.

llama.cpp's converter (convert_hf_to_gguf.py, ``LlamaModel.modify_tensors``) reorders the rows of each
``q_proj``/``k_proj`` weight (and bias) of a Llama-family model, from HF's rotary layout (each head's first
half, then its second half) back to Meta's interleaved one::

    w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)

with ``n_head`` the key/value head count for ``k_proj``. :func:`unpermute_qk` undoes it. Qwen2's converter
does not permute. Mistral checkpoints are converted by the Llama path (architecture "llama"); a file that
names "mistral" is read the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch

from ...errors import IRValidationError
from ...limits import check_count
from ...quant.blocks import spec_block
from .reader import GGUFFile

#: architecture -> (HF model_type, HF class, whether Q/K rows are permuted)
ARCHITECTURES: dict[str, tuple[str, str, bool]] = {
    "llama": ("llama", "LlamaForCausalLM", True),
    "mistral": ("mistral", "MistralForCausalLM", True),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", False),
}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LAYER = re.compile(r"blk\.(0|[1-9][0-9]{0,5})\.([a-z_]+)\.(weight|bias)")


def _where(f: GGUFFile) -> str:
    return f"GGUF file {str(f.path)!r}"


def architecture(f: GGUFFile) -> str:
    """The file's ``general.architecture``, refused unless it is one of :data:`ARCHITECTURES`."""
    arch = f.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise IRValidationError(f"{_where(f)}: architecture {arch!r} (general.architecture) is not supported; "
                                f"supported: {', '.join(ARCHITECTURES)}")
    return arch


def _int(f: GGUFFile, key: str, default: int | None = None, *, limit: str = "max_dim") -> int:
    value = f.metadata.get(key, default)
    if value is None:
        raise IRValidationError(f"{_where(f)}: metadata {key!r} is missing; a {f.architecture} model needs it")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise IRValidationError(f"{_where(f)}: metadata {key!r} must be a positive integer, got {value!r}")
    return check_count(value, limit, f"{_where(f)}: metadata {key!r}")


def _float(f: GGUFFile, key: str, default: float) -> float:
    value = f.metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise IRValidationError(f"{_where(f)}: metadata {key!r} must be a finite number > 0, got {value!r}")
    return float(value)


def _vocab_size(f: GGUFFile, arch: str) -> int:
    if f"{arch}.vocab_size" in f.metadata:
        return _int(f, f"{arch}.vocab_size")
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    embd = f.tensors.get("token_embd.weight")
    if embd is None or len(embd.ne) != 2:
        raise IRValidationError(f"{_where(f)}: the vocabulary size is unknown: no {arch}.vocab_size, no "
                                f"tokenizer.ggml.tokens and no 2-D token_embd.weight")
    return embd.ne[1]


def hf_config_dict(f: GGUFFile) -> dict[str, Any]:
    """The file's model as a Hugging Face ``config.json`` dict (llama, mistral or qwen2)."""
    arch = architecture(f)
    model_type, cls, _ = ARCHITECTURES[arch]
    if "rope_freqs.weight" in f.tensors or f.metadata.get(f"{arch}.rope.scaling.type", "none") != "none":
        raise IRValidationError(f"{_where(f)}: rope scaling (rope_freqs.weight or {arch}.rope.scaling.type) is "
                                f"not supported yet; without it the model's positions would be wrong")
    hidden = _int(f, f"{arch}.embedding_length")
    heads = _int(f, f"{arch}.attention.head_count")
    config: dict[str, Any] = {
        "model_type": model_type, "architectures": [cls],
        "hidden_size": hidden,
        "num_hidden_layers": _int(f, f"{arch}.block_count", limit="max_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": _int(f, f"{arch}.attention.head_count_kv", heads),
        "intermediate_size": _int(f, f"{arch}.feed_forward_length"),
        "max_position_embeddings": _int(f, f"{arch}.context_length"),
        "rope_theta": _float(f, f"{arch}.rope.freq_base", 10000.0),
        "rms_norm_eps": _float(f, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        "vocab_size": _vocab_size(f, arch),
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "hidden_act": "silu",
    }
    head_dim = _int(f, f"{arch}.attention.key_length", hidden // heads)
    if head_dim != hidden // heads:
        config["head_dim"] = head_dim
    for key, hf in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id")):
        if isinstance(f.metadata.get(key), int):
            config[hf] = f.metadata[key]
    if arch == "mistral" and f"{arch}.attention.sliding_window" in f.metadata:
        config["sliding_window"] = _int(f, f"{arch}.attention.sliding_window")
    return config


def transformers_config(f: GGUFFile) -> Any:
    """:func:`hf_config_dict` as a ``transformers`` config object (``LlamaConfig``, ``Qwen2Config``, ...)."""
    import transformers

    config = dict(hf_config_dict(f))
    return transformers.AutoConfig.for_model(config.pop("model_type"), **config)


def hf_name(name: str, n_layers: int | None = None) -> str:
    """The HF state-dict key of GGUF tensor ``name`` (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); refuses a name it does not know or a layer past ``n_layers``."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _LAYER.fullmatch(name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise IRValidationError(f"GGUF tensor {name!r} has no Hugging Face name: known are "
                                f"{', '.join(_GLOBAL_NAMES)} and blk.N.{{{', '.join(_LAYER_NAMES)}}}.weight/bias")
    layer = int(match.group(1))
    if n_layers is not None and layer >= n_layers:
        raise IRValidationError(f"GGUF tensor {name!r} names layer {layer}, but the model has {n_layers} layers")
    return f"model.layers.{layer}.{_LAYER_NAMES[match.group(2)]}.{match.group(3)}"


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (module docstring) for a weight or bias of ``n_head`` heads.
    Only rows move, so it applies to raw quantized blocks too (a row's blocks stay together)."""
    rows = w.shape[0]
    if n_head <= 0 or rows % (2 * n_head):
        raise IRValidationError(f"a Q/K tensor of {rows} rows cannot be split into {n_head} heads of two halves")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def hf_state_dict(f: GGUFFile) -> dict[str, torch.Tensor]:
    """Every tensor of the file dequantized to float32, under its HF name, Q/K rows in HF's order."""
    return hf_tensors(f)[0]


def hf_tensors(f: GGUFFile, keep: Iterable[str] = ()) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of the file under its HF name, Q/K rows in HF's order, and the block layout of each kept one.

    A 2-D tensor whose block layout is in ``keep`` (``QuantSpec.block`` names: ``q8_0``, ``q4_K``, ...) stays its
    raw blocks, ``uint8 [rows, row bytes]`` (a read-only view of the file unless its rows were un-permuted);
    every other tensor is dequantized to float32. Returns (tensors, {key: block layout of a kept tensor})."""
    keep = set(keep)
    config = hf_config_dict(f)
    _, _, permuted = ARCHITECTURES[architecture(f)]
    heads = {"self_attn.q_proj": config["num_attention_heads"], "self_attn.k_proj": config["num_key_value_heads"]}
    out: dict[str, torch.Tensor] = {}
    layouts: dict[str, str] = {}
    for name, info in f.tensors.items():
        key = hf_name(name, config["num_hidden_layers"])
        block = spec_block(info.type) if info.type.block > 1 else None
        if block in keep and len(info.shape) == 2:
            value, layouts[key] = f.tensor(name).data, block
        else:
            value = f.dequantize(name)
        proj = key.rsplit(".", 1)[0].split(".", 3)[-1]
        if permuted and proj in heads:
            value = unpermute_qk(value, heads[proj])  # rows only: a raw row of blocks moves whole
        out[key] = value
    return out, layouts


__all__ = ["ARCHITECTURES", "architecture", "hf_config_dict", "hf_name", "hf_state_dict", "hf_tensors",
           "transformers_config", "unpermute_qk"]
