"""The models of the compile-coverage sweep: the built-in zoo, transformers architectures, ONNX CNNs.

transformers entries are ``npu_tools.zoo.ZooEntry`` objects that are not registered in the zoo: tiny
configs (hidden 16-64, 1-2 layers, 32x32 or 64x64 images, 8 tokens) with seeded random weights, so
nothing is downloaded and the same ``build("meta")`` / ``build("cpu")`` / ``example_inputs()`` flow
as the zoo's applies. Batch norms get random statistics (fresh ones are the identity, which would
hide a wrong folding). transformers is imported inside the factories only.

The ONNX entries are the nine classic CNNs that ship with the ``onnx`` package, as "light" models
(``onnx/backend/test/data/light``): their weights are ``ConstantOfShape`` nodes that fill every
tensor with 0.02, so every logit is the same and the softmax output is uniform whatever the graph
computes. ``randomized_light_model`` replaces each such node by a seeded random initializer of the
same name and shape, and makes the logits (the final softmax's input) a second output: random
weights often saturate the softmax into a one-hot vector, which would hide an error in the logits.
The graph is otherwise unchanged; weights too large to fold at import
(``torch_ir.limits.max_fold_bytes``, e.g. VGG-19's 4096x25088 fc6) stay ``ConstantOfShape``, so the
imported graph is the one the shipped file gives.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from npu_tools.zoo import Inputs, ZooEntry, get_model, list_models

VOCAB = 128
TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}  # inside the tiny vocabulary
HF = ("transformers",)
ONNX_CNNS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
             "squeezenet", "vgg19", "zfnet512")


# -- building blocks -------------------------------------------------------------------------------------

def randomize_norm_stats(model: nn.Module) -> nn.Module:
    """Random running statistics and affine parameters for every batch norm (frozen ones included)."""
    with torch.no_grad():
        for m in model.modules():
            mean, var = getattr(m, "running_mean", None), getattr(m, "running_var", None)
            if not isinstance(mean, torch.Tensor) or not isinstance(var, torch.Tensor):
                continue
            mean.uniform_(-0.5, 0.5)
            var.uniform_(0.5, 1.5)
            if isinstance(getattr(m, "weight", None), torch.Tensor):
                m.weight.uniform_(0.5, 1.5)
            if isinstance(getattr(m, "bias", None), torch.Tensor):
                m.bias.uniform_(-0.2, 0.2)
    return model


def hf_factory(model_cls: str, config_cls: str, *, norm_stats: bool = False,
               **config: Any) -> Callable[[], nn.Module]:
    """A factory building ``transformers.<model_cls>(transformers.<config_cls>(**config))``."""
    def factory() -> nn.Module:
        import transformers

        built = config.copy()
        for key, value in built.items():  # nested configs given as (config class name, kwargs)
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
                built[key] = getattr(transformers, value[0])(**value[1])
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**built))
        # a parameter made with the legacy torch.Tensor(size) constructor (wav2vec2's masked_spec_embed)
        # ignores the torch.device context: put it where the rest of the model is
        model = model.to(torch.get_default_device())
        return randomize_norm_stats(model) if norm_stats else model

    return factory


def images(size: int = 32, batch: int = 2) -> Callable[[torch.Generator], Inputs]:
    return lambda g: ((), {"pixel_values": torch.randn(batch, 3, size, size, generator=g)})


def text(g: torch.Generator, batch: int = 2, seq: int = 8) -> Inputs:
    """Random tokens with the second row right-padded, so that the attention mask matters."""
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, seq - 3:] = 0
    return (), {"input_ids": ids, "attention_mask": mask}


def waveform(samples: int = 400, batch: int = 2) -> Callable[[torch.Generator], Inputs]:
    return lambda g: ((), {"input_values": torch.randn(batch, samples, generator=g)})


def text_and_image(g: torch.Generator) -> Inputs:
    _, kwargs = text(g)
    return (), {**kwargs, "pixel_values": torch.randn(2, 3, 32, 32, generator=g)}


def entry(name: str, category: str, model_cls: str, inputs: Callable[[torch.Generator], Inputs], *,
          config_cls: str | None = None, norm_stats: bool = False, **config: Any) -> ZooEntry:
    config_cls = config_cls or re.sub(r"(Model|For[A-Z][A-Za-z]*)$", "", model_cls) + "Config"
    return ZooEntry(name, category, f"{model_cls} from a tiny {config_cls}",
                    hf_factory(model_cls, config_cls, norm_stats=norm_stats, **config), inputs, requires=HF)


# -- configs ---------------------------------------------------------------------------------------------

VIT = dict(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=4)
ENCODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=64)
DECODER = dict(ENCODER, num_key_value_heads=2, use_cache=False, **TOKENS)
HEAD_DIM = dict(head_dim=16)
AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
             conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
             vocab_size=VOCAB)
SMALL_RESNET = ("ResNetConfig", dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                     layer_type="basic", out_features=["stage4"]))
DETR = dict(use_timm_backbone=False, backbone_config=SMALL_RESNET, d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
            num_queries=8, num_labels=5)
CLASSES = dict(num_labels=10)

VISION = [
    entry("convnext", "vision", "ConvNextForImageClassification", images(), num_stages=2, hidden_sizes=[16, 32],
          depths=[1, 1], **CLASSES),
    entry("convnextv2", "vision", "ConvNextV2ForImageClassification", images(), num_stages=2, hidden_sizes=[16, 32],
          depths=[1, 1], **CLASSES),
    entry("deit", "vision", "DeiTForImageClassification", images(), **VIT, **CLASSES),
    entry("beit", "vision", "BeitForImageClassification", images(), use_relative_position_bias=True, **VIT,
          **CLASSES),
    entry("data2vec_vision", "vision", "Data2VecVisionForImageClassification", images(),
          use_relative_position_bias=True, **VIT, **CLASSES),
    entry("dinov2", "vision", "Dinov2ForImageClassification", images(), image_size=32, patch_size=8, hidden_size=64,
          num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, **CLASSES),
    entry("siglip_vision", "vision", "SiglipVisionModel", images(), config_cls="SiglipVisionConfig", **VIT),
    entry("swin", "vision", "SwinForImageClassification", images(), image_size=32, patch_size=4, embed_dim=16,
          depths=[2, 2], num_heads=[2, 4], window_size=4, **CLASSES),
    entry("swinv2", "vision", "Swinv2ForImageClassification", images(), image_size=32, patch_size=4, embed_dim=16,
          depths=[2, 2], num_heads=[2, 4], window_size=4, **CLASSES),
    entry("mobilenet_v1", "vision", "MobileNetV1ForImageClassification", images(), norm_stats=True, image_size=32,
          depth_multiplier=0.25, min_depth=8, **CLASSES),
    entry("mobilenet_v2", "vision", "MobileNetV2ForImageClassification", images(), norm_stats=True, image_size=32,
          depth_multiplier=0.25, **CLASSES),
    entry("efficientnet", "vision", "EfficientNetForImageClassification", images(), norm_stats=True, image_size=32,
          width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, **CLASSES),
    entry("regnet", "vision", "RegNetForImageClassification", images(), norm_stats=True, embedding_size=16,
          hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, layer_type="y", **CLASSES),
    entry("bit", "vision", "BitForImageClassification", images(), embedding_size=16, hidden_sizes=[32, 64],
          depths=[1, 1], layer_type="bottleneck", num_groups=8, **CLASSES),
    entry("poolformer", "vision", "PoolFormerForImageClassification", images(), num_encoder_blocks=2,
          hidden_sizes=[16, 32], depths=[1, 1], patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1], **CLASSES),
    entry("segformer", "vision", "SegformerForSemanticSegmentation", images(), num_encoder_blocks=2, depths=[1, 1],
          sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
          mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=5),
    entry("pvt_v2", "vision", "PvtV2ForImageClassification", images(), config_cls="PvtV2Config", num_encoder_blocks=2,
          depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
          num_attention_heads=[1, 2], mlp_ratios=[2, 2], **CLASSES),
    entry("mobilevit", "vision", "MobileViTForImageClassification", images(64), norm_stats=True, image_size=64,
          hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 16, 24, 32, 40, 64], **CLASSES),
    entry("mobilevitv2", "vision", "MobileViTV2ForImageClassification", images(64), norm_stats=True, image_size=64,
          width_multiplier=0.25, **CLASSES),
    entry("levit", "vision", "LevitForImageClassification", images(64), norm_stats=True, image_size=64,
          hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4], depths=[1, 1, 1], key_dim=[8, 8, 8],
          mlp_ratio=[2, 2, 2], attention_ratio=[2, 2, 2], **CLASSES),
    entry("cvt", "vision", "CvtForImageClassification", images(), norm_stats=True, embed_dim=[16, 32, 64],
          num_heads=[1, 2, 4], depth=[1, 2, 3], drop_path_rate=[0.0, 0.0, 0.0], **CLASSES),
    entry("focalnet", "vision", "FocalNetForImageClassification", images(), image_size=32, patch_size=4,
          embed_dim=16, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3], **CLASSES),
    entry("hiera", "vision", "HieraForImageClassification", images(64), image_size=[64, 64], embed_dim=16,
          depths=[1, 1], num_heads=[1, 2], masked_unit_size=[8, 8], masked_unit_attention=[True, False],
          num_query_pool=1, **CLASSES),
    entry("yolos", "detection", "YolosForObjectDetection", images(), image_size=[32, 32], patch_size=8,
          hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
          num_detection_tokens=5, num_labels=5),
    entry("detr", "detection", "DetrForObjectDetection", images(64, batch=1), norm_stats=True, **DETR),
    entry("conditional_detr", "detection", "ConditionalDetrForObjectDetection", images(64, batch=1),
          norm_stats=True, **DETR),
    entry("rt_detr", "detection", "RTDetrForObjectDetection", images(64, batch=1), norm_stats=True,
          backbone_config=("RTDetrResNetConfig", dict(SMALL_RESNET[1], out_features=["stage2", "stage3", "stage4"])),
          encoder_hidden_dim=32, encoder_in_channels=[32, 64, 128], encoder_ffn_dim=64, encoder_attention_heads=2,
          d_model=32, num_queries=10, decoder_in_channels=[32, 32, 32], decoder_ffn_dim=64, decoder_layers=1,
          decoder_attention_heads=2, num_labels=5, num_denoising=0, anchor_image_size=[64, 64]),
    entry("dpt", "depth", "DPTForDepthEstimation", images(), image_size=32, patch_size=8, hidden_size=32,
          num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, backbone_out_indices=[0, 1, 2, 3],
          neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16),
    entry("clip", "multimodal", "CLIPModel", text_and_image,
          text_config=dict(ENCODER, max_position_embeddings=16, **TOKENS), vision_config=VIT, projection_dim=32),
]

TEXT = [
    entry("roberta", "text", "RobertaModel", text, **ENCODER, pad_token_id=1),
    entry("distilbert", "text", "DistilBertModel", text, vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4,
          hidden_dim=128, max_position_embeddings=64),
    entry("albert", "text", "AlbertModel", text, embedding_size=32, **ENCODER),
    entry("electra", "text", "ElectraModel", text, embedding_size=32, **ENCODER),
    entry("deberta_v2", "text", "DebertaV2Model", text, relative_attention=True, position_buckets=16,
          max_relative_positions=16, pos_att_type=["p2c", "c2p"], **ENCODER),
    entry("mpnet", "text", "MPNetModel", text, **ENCODER),
    entry("roformer", "text", "RoFormerModel", text, embedding_size=64, **ENCODER),
    entry("mobilebert", "text", "MobileBertModel", text, vocab_size=VOCAB, hidden_size=64, embedding_size=32,
          intra_bottleneck_size=32, true_hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
          intermediate_size=64, num_feedforward_networks=2, max_position_embeddings=64),
    entry("modernbert", "text", "ModernBertModel", text, global_attn_every_n_layers=2, local_attention=4, **ENCODER,
          cls_token_id=1, sep_token_id=2, **TOKENS),
    entry("t5_encoder", "text", "T5EncoderModel", text, config_cls="T5Config", vocab_size=VOCAB, d_model=64, d_kv=16,
          d_ff=128, num_layers=2, num_heads=4, relative_attention_num_buckets=8, **TOKENS),
    entry("bart", "text", "BartModel", text, vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
          max_position_embeddings=64, use_cache=False, **TOKENS),
    entry("gpt_neo", "llm", "GPTNeoForCausalLM", text, vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4,
          attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=64, use_cache=False,
          **TOKENS),
    entry("gptj", "llm", "GPTJForCausalLM", text, vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
          n_positions=64, use_cache=False, **TOKENS),
    entry("gpt_neox", "llm", "GPTNeoXForCausalLM", text, rotary_pct=0.25, **ENCODER, use_cache=False, **TOKENS),
    entry("opt", "llm", "OPTForCausalLM", text, vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
          num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=64, use_cache=False, **TOKENS),
    entry("bloom", "llm", "BloomForCausalLM", text, vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4,
          use_cache=False, **TOKENS),
    entry("falcon", "llm", "FalconForCausalLM", text, vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
          num_attention_heads=4, use_cache=False, **TOKENS),
    entry("mistral", "llm", "MistralForCausalLM", text, sliding_window=4, **DECODER),
    entry("qwen3", "llm", "Qwen3ForCausalLM", text, **DECODER, **HEAD_DIM),
    entry("phi", "llm", "PhiForCausalLM", text, partial_rotary_factor=0.5, **DECODER),
    entry("phi3", "llm", "Phi3ForCausalLM", text, **DECODER),
    entry("gemma", "llm", "GemmaForCausalLM", text, **DECODER, **HEAD_DIM),
    entry("gemma2", "llm", "Gemma2ForCausalLM", text, sliding_window=4, **DECODER, **HEAD_DIM),
    entry("stablelm", "llm", "StableLmForCausalLM", text, **DECODER),
    entry("olmo", "llm", "OlmoForCausalLM", text, **DECODER),
    entry("mixtral", "llm", "MixtralForCausalLM", text, num_local_experts=4, num_experts_per_tok=2, **DECODER),
]

AUDIO_MODELS = [
    entry("wav2vec2", "audio", "Wav2Vec2ForSequenceClassification", waveform(), config_cls="Wav2Vec2Config",
          num_labels=4, **AUDIO),
    entry("hubert", "audio", "HubertModel", waveform(), **AUDIO),
    entry("wavlm", "audio", "WavLMModel", waveform(), num_buckets=16, max_bucket_distance=32, **AUDIO),
    entry("data2vec_audio", "audio", "Data2VecAudioModel", waveform(), **AUDIO),
    entry("ast", "audio", "ASTForAudioClassification", lambda g: ((), {"input_values": torch.randn(2, 64, 32,
                                                                                                   generator=g)}),
          hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_length=64,
          num_mel_bins=32, **CLASSES),
]

TRANSFORMERS: list[ZooEntry] = [*VISION, *TEXT, *AUDIO_MODELS]


def zoo_entries() -> list[ZooEntry]:
    """The built-in zoo's entries whose packages are installed."""
    return [e for e in map(get_model, list_models()) if e.available()]


def transformers_entries() -> list[ZooEntry]:
    """``TRANSFORMERS`` less the architectures the zoo has under the same name (the zoo's are run)."""
    ours = set(list_models())
    return [e for e in TRANSFORMERS if e.name not in ours]


# -- the ONNX CNNs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OnnxModel:
    name: str

    @property
    def path(self) -> str:
        return light_model_path(self.name)


def light_model_path(name: str) -> str:
    """``.../onnx/backend/test/data/light/light_<name>.onnx`` of the installed onnx package."""
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")


def onnx_entries() -> list[OnnxModel]:
    return [OnnxModel(n) for n in ONNX_CNNS]


def randomized_light_model(path: str, seed: int = 0) -> Any:
    """The light model with each foldable ``ConstantOfShape`` weight made a seeded random initializer.

    Scaled so that activations keep their size through the net (He-style 1/sqrt(fan-in) for weights of
    rank 2 and more, U(0.5, 1.5) for batch-norm variances and scales, small values elsewhere).
    """
    import onnx
    from onnx import helper, numpy_helper

    from torch_ir.limits import fold_allowed

    model = onnx.load(path)
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers = {name: (node, i) for node in graph.node for i, name in enumerate(node.input)}
    rng = np.random.default_rng(seed)
    kept, added = [], []
    for node in graph.node:
        shape = inits.get(node.input[0]) if node.op_type == "ConstantOfShape" and node.input else None
        if shape is None or not fold_allowed(4 * int(np.prod(shape))):
            kept.append(node)
            continue
        value = _random_weight(rng, tuple(int(d) for d in shape), *consumers.get(node.output[0], (None, 0)))
        added.append(numpy_helper.from_array(value, node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(added)
    # these files are IR version 3, where every initializer must also be a graph input
    graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in added)
    expose_logits(graph)
    return model


def expose_logits(graph: Any) -> None:
    """Make the input of a final Softmax a graph output too: random weights often saturate the softmax
    into a one-hot vector, which hides any error in the logits (unless the top class changes)."""
    outputs = {o.name: o for o in graph.output}
    for node in graph.node:
        if node.op_type == "Softmax" and node.output[0] in outputs and node.input[0] not in outputs:
            logits = graph.output.add()
            logits.CopyFrom(outputs[node.output[0]])  # a softmax keeps its input's type and shape
            logits.name = node.input[0]


def _random_weight(rng: np.random.Generator, shape: tuple[int, ...], consumer: Any, index: int) -> np.ndarray:
    op = consumer.op_type if consumer is not None else ""
    if op == "BatchNormalization" and index in (1, 4):  # scale, variance
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if len(shape) >= 2:
        fan_in = int(np.prod(shape[1:]))
        if op == "Gemm" and not any(a.name == "transB" and a.i for a in consumer.attribute):
            fan_in = shape[0]
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / max(fan_in, 1)))
    return rng.uniform(-0.1, 0.1, shape).astype(np.float32)
