"""Config values of a checkpoint: every number finite, every size within the limits.

:func:`~.hf_config.load_config` runs :func:`check_numbers` and :func:`check_sizes` on ``config.json`` as parsed
JSON, before transformers reads any value, then :func:`check_model_sizes` on the parsed config: a hostile config
is refused in milliseconds, before anything is built from it. ``generation_config.json`` gets :func:`check_numbers`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from ..limits import check_count
from .hf_files import CONFIG, CheckpointError

#: Config fields that size the model: name -> (the limit it is checked against, its smallest value). The names are
#: transformers' canonical ones and those configs use for them (GPT-2's n_layer, BART's d_model, ...); a config
#: class's ``attribute_map`` adds its own. A field may hold one size or a list of them (one per layer).
_SIZE_RULES: dict[str, tuple[str, int]] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "encoder_layers",
                     "num_decoder_layers", "num_encoder_layers"), ("max_layers", 1)),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
                     "num_experts_per_tok", "n_shared_experts", "num_shared_experts"), ("max_experts", 0)),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "ffn_dim", "encoder_ffn_dim",
                     "decoder_ffn_dim", "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "vocab_size", "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length",
                     "head_dim", "kv_channels", "num_attention_heads", "num_key_value_heads", "n_head", "n_heads",
                     "num_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "encoder_attention_heads",
                     "decoder_attention_heads"), ("max_dim", 1)),
}
#: The canonical sizes read back from the parsed config (transformers' defaults and aliases applied).
_MODEL_SIZES = ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings",
                "head_dim", "num_attention_heads", "num_key_value_heads")


def entries(doc: Any) -> Iterator[tuple[str, str, Any]]:
    """``(place, field, value)`` of every value inside a parsed JSON document, containers included: ``field`` is
    the name of the nearest object member (a list's items share their list's), ``place`` the full path
    (``rope_scaling.long_factor[3]``). Iterative: a file may nest as deep as the JSON parser allows."""
    stack: list[tuple[str, str, Any]] = [("", "", doc)]
    while stack:
        place, name, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{place}.{k}" if place else str(k), str(k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{place}[{i}]", name, v) for i, v in reversed(list(enumerate(value))))
        if place:
            yield place, name, value


def check_numbers(raw: dict[str, Any], where: str) -> None:
    """Refuse a non-finite number anywhere (``NaN``, ``Infinity``, ``1e999``: Python's JSON reads them all, and
    an integer of 400 digits is infinite as soon as it is used as a float), a negative norm epsilon and a
    non-positive ``rope_theta``: each makes every logit NaN (or turns the rotary embedding off), and generation
    would then emit token 0 as if it were the model's answer."""
    fix = f"write the value the model was trained with (the {CONFIG} saved with the weights has it)"
    for place, name, value in entries(raw):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if not _finite(value):
            text = json.dumps(value)
            raise CheckpointError(f"{where}: {place} is {text[:40]}{'...' if len(text) > 40 else ''}; a model "
                                  f"hyper-parameter must be a finite number: {fix}")
        if name.endswith(("eps", "epsilon")) and value < 0:
            raise CheckpointError(f"{where}: {place} is {value!r}; a norm epsilon must not be negative (it would "
                                  f"take the square root of a negative number): {fix}")
        if name == "rope_theta" and value <= 0:
            raise CheckpointError(f"{where}: {place} is {value!r}; the rotary base rope_theta must be positive: {fix}")


def _finite(value: float) -> bool:
    """Whether ``value`` is a finite double (an int is compared exactly: ``math.isfinite`` would overflow)."""
    return math.isfinite(value) if isinstance(value, float) else abs(value) <= sys.float_info.max


def size_aliases(config_class: type) -> dict[str, str]:
    """Field name -> the size rule's name for the names a config class stores sizes under (its ``attribute_map``
    maps canonical names to them: GPT-2 keeps num_hidden_layers as n_layer), with those of its sub-configs."""
    aliases: dict[str, str] = {}
    for cls in [config_class, *getattr(config_class, "sub_configs", {}).values()]:
        aliases.update({stored: canonical for canonical, stored in getattr(cls, "attribute_map", {}).items()})
    return aliases


def check_sizes(raw: dict[str, Any], aliases: Mapping[str, str], where: str) -> None:
    """Every size field of the file, at any depth (``text_config`` too), before transformers reads any of them."""
    for place, name, value in entries(raw):
        rule = _SIZE_RULES.get(name) or _SIZE_RULES.get(aliases.get(name, ""))
        if rule is not None and value is not None and not isinstance(value, list):  # a list's items come next
            _check_size(value, place, *rule, where)


def _check_size(value: Any, place: str, limit: str, minimum: int, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        wanted = "a positive integer" if minimum > 0 else "a non-negative integer"
        raise CheckpointError(f"{where}: {place} is {json.dumps(value)[:80]}, not {wanted}; a model size must be "
                              f"{wanted}: use the {CONFIG} saved with the weights")
    check_count(value, limit, f"{where}: {place}")


def check_model_sizes(config: Any, where: str) -> None:
    """The sizes as transformers reads them (its defaults and aliases applied), before anything is built. (The
    weights they make are checked against ``max_alloc_bytes`` right after the build on the meta device, which
    takes milliseconds once the layers are bounded, and before any file is read against them.)"""
    text = config.get_text_config(decoder=True)
    for name in _MODEL_SIZES:
        value = getattr(text, name, None)
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                _check_size(item, name, *_SIZE_RULES[name], where)
