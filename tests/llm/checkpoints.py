"""Tiny Hugging Face causal-LM checkpoint directories for tests, written as ``save_pretrained`` writes them.

Real transformers classes with a tiny config (2 layers, hidden 64) and seeded random weights, plus a small
byte-level BPE tokenizer trained on a few sentences, so that loading, tokenizing and generating can be tested
offline in well under a second per checkpoint. Each call writes a fresh directory: nothing is cached, so a
test that corrupts its copy cannot affect another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ARCHS = ("qwen2", "llama", "mistral")
#: Special tokens, in id order: the config's bos/eos/pad ids below are these tokens' ids.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(len(SPECIAL_TOKENS))
#: The embedding has room for the whole tokenizer (256 byte tokens + 4 special + a few merges) with some to spare,
#: as real checkpoints pad their vocabulary.
VOCAB_SIZE = 320
TOKENIZER_VOCAB = 300
TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! A tiny language model for tests.",
    "Prefill the cache, then decode one token at a time.",
    "the the the and and of of to to in in is is",
)


def tiny_config(arch: str = "qwen2", **overrides: Any) -> Any:
    """A transformers config of ``arch`` small enough to build and run in milliseconds.

    Mistral gets ``sliding_window=None`` (as Mistral 7B v0.2 has): with a window, its cache layers would be
    sliding ones, which a static KV cache does not support. ``overrides`` replace any field.
    """
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig, "mistral": MistralConfig}
    if arch not in classes:
        raise ValueError(f"arch {arch!r}: choose one of {', '.join(ARCHS)}")
    fields: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
    )
    if arch == "mistral":
        fields["sliding_window"] = None
    fields.update(overrides)
    return classes[arch](**fields)


def transformers_continuation(checkpoint: Path, prompt: str, new_tokens: int) -> str:
    """The text transformers' greedy ``generate`` adds to ``prompt`` with the checkpoint directory's model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, attn_implementation="sdpa").eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.decode(ref[0, ids.shape[1]:], skip_special_tokens=True)


def make_tokenizer() -> Any:
    """A byte-level BPE tokenizer (every string encodes) wrapped as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK_ID]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(TRAINING_TEXT, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token=SPECIAL_TOKENS[UNK_ID], bos_token=SPECIAL_TOKENS[BOS_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID], pad_token=SPECIAL_TOKENS[PAD_ID],
    )


def make_checkpoint(directory: Path, arch: str = "qwen2", *, shards: int = 1, dtype: torch.dtype = torch.float32,
                    tokenizer: bool = True, seed: int = 0, **config_overrides: Any) -> Path:
    """Write a tiny ``arch`` checkpoint into ``directory`` (created if needed) and return it.

    ``shards > 1`` writes ``model.safetensors.index.json`` and ``shards`` shard files (more only if one tensor
    is bigger than the weights' size over ``shards``); otherwise one ``model.safetensors``.
    Weights are random from ``torch.manual_seed(seed)``, made and saved in ``dtype``. ``tokenizer`` adds
    ``tokenizer.json`` and ``tokenizer_config.json``. ``config_overrides`` go into the config (and are not
    checked: tests use them to write checkpoints that must be refused).
    """
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = tiny_config(arch, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(directory, max_shard_size=_shard_size(model, shards))
    if tokenizer:
        make_tokenizer().save_pretrained(directory)
    return directory


def _shard_size(model: torch.nn.Module, shards: int) -> int | str:
    """The smallest ``max_shard_size`` for which ``save_pretrained`` writes at most ``shards`` files.

    save_pretrained fills shards greedily in state-dict order (huggingface_hub's
    ``split_torch_state_dict_into_shards``), so the weights' size over ``shards`` usually gives one file
    more; searching for the size against the same greedy rule gives exactly ``shards`` when tensors allow.
    """
    if shards <= 1:
        return "50GB"  # save_pretrained's default: one file
    unique = {id(t): t for t in model.state_dict(keep_vars=True).values()}  # tied weights are saved once
    sizes = [t.numel() * t.element_size() for t in unique.values()]
    low, high = 1, sum(sizes)
    while low < high:
        middle = (low + high) // 2
        if _greedy_shards(sizes, middle) <= shards:
            high = middle
        else:
            low = middle + 1
    return low


def _greedy_shards(sizes: list[int], capacity: int) -> int:
    count, current = 0, 0
    for size in sizes:
        if size > capacity:  # a tensor over the size gets a file of its own; the open shard stays open
            count += 1
        elif current + size > capacity:
            count, current = count + 1, size
        else:
            current += size
    return count + (current > 0)
