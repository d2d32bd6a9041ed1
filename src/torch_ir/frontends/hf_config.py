"""A checkpoint's ``config.json`` and ``generation_config.json``, read and checked before anything is built.

``config.json`` picks a transformers class only through transformers' own table of model types (custom code,
``auto_map``, is never loaded); its values are checked by :mod:`.hf_config_checks` before transformers parses
them, and the sizes again as transformers reads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .hf_config_checks import check_model_sizes, check_numbers, check_sizes, size_aliases
from .hf_files import CONFIG, GENERATION_CONFIG, CheckpointError, read_json_object

if TYPE_CHECKING:
    import transformers

#: Model types whose loading is tested end to end (logits equal to ``from_pretrained``'s). Any other model type
#: with an ``AutoModelForCausalLM`` class loads too when its checkpoint keys are the module's own names.
TESTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

_CONFIG_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                  "float64": torch.float64}


def load_config(root: Path, *, causal: bool = True) -> transformers.PretrainedConfig:
    """``root/config.json`` as transformers' config class of its model type: a type with an
    ``AutoModelForCausalLM`` class (with ``causal=False``: any type with an ``AutoModel`` class, an encoder such as
    BERT too), not quantized, every size within ``torch_ir.limits``, every number finite."""
    fix = f"use the {CONFIG} that came with the model (save_pretrained writes it)"
    raw = read_json_object(root, CONFIG, fix)
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CheckpointError(
            f"checkpoint {root}: {CONFIG} has no \"model_type\" (e.g. \"llama\", \"qwen2\"), so the architecture "
            f"is unknown; {fix}")
    _check_model_type(root, model_type, causal, is_decoder=raw.get("is_decoder") is True)
    if raw.get("quantization_config") is not None:
        method = raw["quantization_config"].get("quant_method") if isinstance(raw["quantization_config"], dict) \
            else None
        raise CheckpointError(
            f"checkpoint {root}: {CONFIG} has a quantization_config ({method or 'unknown method'}): quantized "
            "weights are not supported; use the model's unquantized (float16/bfloat16/float32) checkpoint")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    where = f"checkpoint {root}: {CONFIG} (model_type {model_type!r})"
    # Before from_dict: parsing a config already loops over its layers (layer_types), and NaN would pass through.
    check_numbers(raw, where)
    check_sizes(raw, size_aliases(config_class), where)
    try:
        config = config_class.from_dict(raw)
    except Exception as e:  # the values are the file's; transformers raises many kinds on bad ones
        raise CheckpointError(
            f"checkpoint {root}: transformers cannot read {CONFIG} as a {model_type!r} config "
            f"({type(e).__name__}: {e}); {fix}") from None
    check_model_sizes(config, where)
    config_dtype(config, root)  # refuse a dtype we cannot build now, not when the model is first built
    token_ids(getattr(config, "eos_token_id", None), f"checkpoint {root}: {CONFIG}")
    return config


def is_causal_lm(model_type: str, is_decoder: bool = False) -> bool:
    """Whether a model type is a decoder that generates: transformers has an ``AutoModelForCausalLM`` class for it,
    and it is no encoder. BERT-like encoders have a causal-LM class too (``BertLMHeadModel``, for a BERT trained as a
    decoder); they are told apart by their masked-LM class, unless the config sets ``is_decoder``."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        is_decoder or model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def _check_model_type(root: Path, model_type: str, causal: bool, is_decoder: bool) -> None:
    """A model type transformers knows (by its own table: a file never names a class) with a causal-LM class, or
    (``causal=False``) with a base-model class."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    lms = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    supported = (f"supported: the {len(lms)} causal-LM model types of transformers {transformers.__version__} "
                 f"(transformers.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), e.g. "
                 f"{', '.join(t for t in ('llama', 'mistral', 'qwen2', 'qwen3', 'gemma2', 'phi3') if t in lms)}; "
                 f"tested: {', '.join(TESTED_MODEL_TYPES)}")
    if model_type not in CONFIG_MAPPING:
        raise CheckpointError(
            f"checkpoint {root}: {CONFIG} has model_type {model_type!r}, which transformers "
            f"{transformers.__version__} does not know (custom model code, auto_map, is never run); {supported}")
    if not causal:
        if model_type not in MODEL_MAPPING_NAMES and model_type not in lms:
            raise CheckpointError(
                f"checkpoint {root}: {CONFIG} has model_type {model_type!r}, for which transformers "
                f"{transformers.__version__} has no model class (AutoModel or AutoModelForCausalLM) to build")
        return
    if model_type not in lms:
        raise CheckpointError(
            f"checkpoint {root}: {CONFIG} has model_type {model_type!r}, which is not a causal language model "
            f"(transformers has no AutoModelForCausalLM class for it), so it cannot generate text; {supported}")
    if not is_causal_lm(model_type, is_decoder):
        raise CheckpointError(
            f"checkpoint {root}: {CONFIG} has model_type {model_type!r}, an encoder (it has a masked-LM class, and "
            f"{CONFIG} does not set \"is_decoder\": true), not a causal language model, so it cannot generate text; "
            f"{supported}")


def config_dtype(config: Any, root: Path | None = None) -> torch.dtype | None:
    """The config's ``dtype`` (``torch_dtype`` in older files) as a floating torch dtype, or None if unset."""
    value = getattr(config, "dtype", None)
    if value is None or (isinstance(value, torch.dtype) and value in _CONFIG_DTYPES.values()):
        return value
    if isinstance(value, str) and value in _CONFIG_DTYPES:
        return _CONFIG_DTYPES[value]
    where = f"checkpoint {root}: " if root is not None else ""
    raise CheckpointError(
        f"{where}{CONFIG} has dtype {value!r}; use one of {', '.join(_CONFIG_DTYPES)} (or remove it for float32)")


def token_ids(value: Any, where: str | None = None) -> list[int] | None:
    """An ``eos_token_id`` field (an int, a list of ints, or null) as a list; a bad one raises naming ``where``."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    if all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        return list(items)
    raise CheckpointError(f"{where or 'config'}: eos_token_id {value!r:.80} is not a token id or a list of them; "
                          "write e.g. \"eos_token_id\": 2 or [2, 7]")


def read_generation_eos(root: Path) -> list[int] | None:
    """``eos_token_id`` of ``generation_config.json``; None without the file, or when it does not set one."""
    if not os.path.lexists(root / GENERATION_CONFIG):  # exists() would hide a dangling link; reading names it
        return None
    fix = f"fix it or delete it ({CONFIG}'s eos_token_id is used then)"
    raw = read_json_object(root, GENERATION_CONFIG, fix)
    check_numbers(raw, f"checkpoint {root}: {GENERATION_CONFIG}")
    return token_ids(raw.get("eos_token_id"), f"checkpoint {root}: {GENERATION_CONFIG}")
