"""The weight files' headers checked against the model the config describes, before any weight is used.

A config and weights that do not belong together are refused with every difference listed (names, shapes,
dtypes, the index's entries), not found later as garbage. No tensor data is read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..limits import check_shape
from .hf_config import TESTED_MODEL_TYPES
from .hf_files import CONFIG, INDEX, SHOWN
from .hf_weights import FLOAT_CODES, Stored

#: Config fields that fix the weights' shapes: an error about shapes shows them, so the reader sees which
#: value in config.json disagrees with the files.
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "tie_word_embeddings")


# -- what the config's model expects ----------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    """The state dict the config's model has, taken from a meta-device build of it.

    The model itself is the reference rather than rules about names, so tied weights, prefixes and buffers
    are what transformers makes for this config and this version.
    """

    class_name: str
    shapes: dict[str, tuple[int, ...]]
    floating: dict[str, bool]
    ties: dict[str, tuple[str, ...]]  # key -> the other keys of the same tensor (tied weights)
    prefix: str  # base_model_prefix: checkpoints of the bare model store keys without it
    ignore_unexpected: re.Pattern[str] | None
    ignore_missing: re.Pattern[str] | None

    def model_key(self, key: str) -> str:
        """The model's name for a checkpoint key: itself, or with the base model's prefix added, as
        ``from_pretrained`` does when it loads the bare model's weights (``layers.0...``) into a causal LM."""
        if key in self.shapes or not self.prefix:
            return key
        prefixed = f"{self.prefix}.{key}"
        return prefixed if prefixed in self.shapes else key

    def ignored(self, key: str) -> bool:
        """Keys ``from_pretrained`` drops without a word: old checkpoints' ``rotary_emb.inv_freq`` and the like."""
        return self.ignore_unexpected is not None and self.ignore_unexpected.search(key) is not None


def model_spec(model: torch.nn.Module, where: str) -> ModelSpec:
    """The :class:`ModelSpec` of a model built on the meta device; each tensor's size is checked on the way."""
    state = model.state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    for key, t in state.items():
        # The config alone fixes these sizes: refuse a config that asks for more than the machine allows
        # before any file is read against it.
        check_shape(list(t.shape), t.element_size(), f"{where}: {CONFIG} makes {key} {list(t.shape)}, which")
    groups: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if name in shapes:
            groups.setdefault(id(t), []).append(name)
    ties = {k: tuple(o for o in names if o != k) for names in groups.values() if len(names) > 1 for k in names}
    return ModelSpec(
        class_name=type(model).__name__, shapes=shapes,
        floating={k: v.is_floating_point() for k, v in state.items()}, ties=ties,
        prefix=getattr(model, "base_model_prefix", "") or "",
        ignore_unexpected=_patterns(_unexpected_patterns(model)),
        ignore_missing=_patterns(getattr(model, "_keys_to_ignore_on_load_missing", None) or ()),
    )


def _unexpected_patterns(model: torch.nn.Module) -> set[str]:
    """The patterns ``PreTrainedModel._adjust_missing_and_unexpected_keys`` ignores among unexpected keys:
    the class's own, and buffers that used to be persistent (rotary ``inv_freq``, ``position_ids``)."""
    patterns = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    buffers = [name for name, _ in model.named_buffers()]
    if any(name.endswith("rotary_emb.inv_freq") for name in buffers):
        patterns.add(r"rotary_emb\.inv_freq")
    if any(name.endswith("position_ids") for name in buffers):
        patterns.add(r"(^|\.)position_ids$")
    return patterns


def _patterns(patterns: Iterable[str]) -> re.Pattern[str] | None:
    patterns = sorted(patterns)  # from the transformers class, never from a file
    return re.compile("|".join(f"({p})" for p in patterns)) if patterns else None


# -- comparing the files with the config ----------------------------------------------------------------------

def compare(stored: dict[str, Stored], spec: ModelSpec, config: Any) -> list[str]:
    """Wrong shapes and dtypes first (the clearest sign of a wrong config), then missing, then unexpected keys."""
    wrong, unexpected, present = [], [], set()
    for key, entry in stored.items():
        name = spec.model_key(key)
        if name not in spec.shapes:
            if not spec.ignored(key):
                unexpected.append(f"{key} in {entry.file.name} is not a weight of {spec.class_name}")
            continue
        present.add(name)
        if entry.shape != spec.shapes[name]:
            wrong.append(f"{key} is {list(entry.shape)} in {entry.file.name} but the config makes it "
                         f"{list(spec.shapes[name])}")
        elif spec.floating[name] and entry.code not in FLOAT_CODES:
            wrong.append(f"{key} is {entry.code} in {entry.file.name} but the model's weight is floating point "
                         "(quantized weights are not supported)")
    return wrong + _missing(present, spec, config) + unexpected


def _missing(present: set[str], spec: ModelSpec, config: Any) -> list[str]:
    problems = []
    for name in spec.shapes:
        if name in present or any(o in present for o in spec.ties.get(name, ())):
            continue
        if spec.ignore_missing is not None and spec.ignore_missing.search(name):
            continue
        hint = ""
        if name.startswith("lm_head.") and not getattr(config, "tie_word_embeddings", False):
            hint = (" (tie_word_embeddings is false in config.json; if the output layer shares the input "
                    "embedding, set it to true)")
        problems.append(f"{name} is missing: no file holds it{hint}")
    return problems


def index_problems(weight_map: dict[str, str] | None, stored: dict[str, Stored]) -> list[str]:
    """The index must say where each tensor is: a wrong entry would send a lazy loader to the wrong file."""
    if weight_map is None:
        return []
    problems = []
    for key, name in weight_map.items():
        entry = stored.get(key)
        if entry is None:
            problems.append(f"{INDEX} puts {key} in {name}, which does not hold it")
        elif entry.file.name != name:
            problems.append(f"{INDEX} puts {key} in {name}, but it is in {entry.file.name}")
    return problems


def weights_report(root: Path, config: Any, problems: list[str]) -> str:
    """The message of a CheckpointWeightsError: the config's shape fields, the first problems, and the fix."""
    shown = problems[:SHOWN] + ([f"... and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else [])
    lines = [f"checkpoint {root}: the weights do not belong to its {CONFIG} "
             f"({_config_summary(config)}); {len(problems)} problem(s):"]
    lines += [f"  {p}" for p in shown]
    lines.append(f"Fix: put the {CONFIG} saved with these weights beside them (save_pretrained writes both), "
                 f"or use the weights that belong to this {CONFIG}.{_conversion_hint(str(config.model_type))}")
    return "\n".join(lines)


def _config_summary(config: Any) -> str:
    values = [f"model_type={config.model_type}"]
    values += [f"{k}={getattr(config, k)}" for k in _SHAPE_FIELDS if getattr(config, k, None) is not None]
    return ", ".join(values)


def _conversion_hint(model_type: str) -> str:
    """transformers rewrites the checkpoints of some model types as it loads them (MoE experts fused into one
    tensor, old names): their files do not hold the module's names, which this loader reads as they are."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        converted = bool(get_checkpoint_conversion_mapping(model_type))
    except (ImportError, AttributeError):
        return ""
    if not converted:
        return ""
    return (f" transformers converts {model_type!r} checkpoints while loading them (its modules' names and "
            f"shapes differ from the files'); this loader reads weights as stored, so it supports model types "
            f"whose files hold the module's own tensors, such as {', '.join(TESTED_MODEL_TYPES)}.")
