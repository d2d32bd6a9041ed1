"""Tiny seeded Qwen2- and Llama-shaped checkpoints written to GGUF the way llama.cpp's converter writes them
(its metadata keys, tensor names, and for Llama its Q/K row permutation), read back: the config equals the
source's, every tensor equals the source (F32) or gguf's own dequantization of gguf's quantization, and a
model built from the file computes the source's logits exactly."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

from torch_ir.errors import IRValidationError, LimitExceededError
from torch_ir.frontends.gguf import hf_config_dict, hf_name, hf_state_dict, read_gguf, transformers_config

from .writer import write_gguf

LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in effect."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(key: str) -> str:
    if key in GLOBAL_NAMES:
        return GLOBAL_NAMES[key]
    _, _, layer, rest = key.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_NAMES[module]}.{kind}"


def rope_theta(config: transformers.PretrainedConfig) -> float:
    """transformers 5 keeps it in rope_parameters, 4 as an attribute."""
    params = getattr(config, "rope_parameters", None)
    return params["rope_theta"] if params else config.rope_theta


def make_model(arch: str, **sizes: int) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=96, max_position_embeddings=256, rms_norm_eps=1e-6)
    common.update(sizes)
    if arch == "llama":
        config = transformers.LlamaConfig(**common, rope_theta=500000.0, tie_word_embeddings=False)
        return transformers.LlamaForCausalLM(config).eval()
    config = transformers.Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True)
    return transformers.Qwen2ForCausalLM(config).eval()


def write_model(model: transformers.PreTrainedModel, arch: str, path: Path, quant: dict[str, str]) -> Path:
    c = model.config
    tensors: dict[str, tuple[np.ndarray, str]] = {}
    for key, value in model.state_dict().items():
        if key == "lm_head.weight" and c.tie_word_embeddings:
            continue
        w = value.detach().numpy().astype(np.float32)
        if arch == "llama" and ".q_proj." in key:
            w = llama_cpp_permute(w, c.num_attention_heads, c.num_attention_heads)
        if arch == "llama" and ".k_proj." in key:
            w = llama_cpp_permute(w, c.num_attention_heads, c.num_key_value_heads)
        name = gguf_name(key)
        tensors[name] = (w, next((t for k, t in quant.items() if k in name and w.ndim == 2), "F32"))

    def fill(w: gguf.GGUFWriter) -> None:
        w.add_context_length(c.max_position_embeddings)
        w.add_embedding_length(c.hidden_size)
        w.add_block_count(c.num_hidden_layers)
        w.add_feed_forward_length(c.intermediate_size)
        w.add_head_count(c.num_attention_heads)
        w.add_head_count_kv(c.num_key_value_heads)
        w.add_rope_freq_base(rope_theta(c))
        w.add_layer_norm_rms_eps(c.rms_norm_eps)
        w.add_vocab_size(c.vocab_size)

    return write_gguf(path, arch, tensors, fill)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_config_and_exact_logits(tmp_path: Path, arch: str) -> None:
    model = make_model(arch)
    f = read_gguf(write_model(model, arch, tmp_path / f"{arch}.gguf", {}))
    got = hf_config_dict(f)
    src = model.config
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings"):
        assert got[key] == getattr(src, key), key
    assert got["rope_theta"] == rope_theta(src)
    # GGUF stores the epsilon as float32, so it comes back as the float32 nearest the source's
    assert got["rms_norm_eps"] == float(np.float32(src.rms_norm_eps))
    config = transformers_config(f)
    assert type(config) is type(src) and rope_theta(config) == rope_theta(src)
    rebuilt = type(model)(config).eval()
    missing, unexpected = rebuilt.load_state_dict(hf_state_dict(f), strict=False)
    assert unexpected == [] and missing == (["lm_head.weight"] if src.tie_word_embeddings else [])
    ids = torch.randint(0, src.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(rebuilt(ids).logits, model(ids).logits)


def test_quantized_tensors(tmp_path: Path) -> None:
    model = make_model("llama")
    quant = {"attn_q": "Q8_0", "attn_k": "Q4_0", "ffn_up": "Q8_0", "ffn_down": "Q4_0"}
    f = read_gguf(write_model(model, "llama", tmp_path / "q.gguf", quant))
    sd = hf_state_dict(f)
    for key, value in model.state_dict().items():
        kind = next((t for k, t in quant.items() if k in gguf_name(key) and value.ndim == 2), "F32")
        w = value.numpy()
        if kind != "F32":
            # blocks run along rows, and llama.cpp's permutation moves whole rows: quantizing the permuted
            # weight and un-permuting equals quantizing the source weight
            qtype = gguf.GGMLQuantizationType[kind]
            w = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)
        assert torch.equal(sd[key], torch.from_numpy(w)), key


def test_unknown_architecture_and_names(tmp_path: Path) -> None:
    f = read_gguf(write_gguf(tmp_path / "g.gguf", "gemma3", {}))
    with pytest.raises(IRValidationError, match="architecture 'gemma3'.*supported: llama, mistral, qwen2"):
        hf_config_dict(f)
    with pytest.raises(IRValidationError, match="'blk.0.attn_qkv.weight' has no Hugging Face name"):
        hf_name("blk.0.attn_qkv.weight")
    with pytest.raises(IRValidationError, match="names layer 5, but the model has 2 layers"):
        hf_name("blk.5.attn_q.weight", 2)
    assert hf_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj.weight"


def test_missing_and_hostile_metadata(tmp_path: Path) -> None:
    def fill(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(64)
        w.add_block_count(100_000)
        w.add_head_count(4)

    f = read_gguf(write_gguf(tmp_path / "h.gguf", "qwen2", {}, fill))
    with pytest.raises(LimitExceededError, match="qwen2.block_count. is 100000, over the 1024 limit"):
        hf_config_dict(f)
