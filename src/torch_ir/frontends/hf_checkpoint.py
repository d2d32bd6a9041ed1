"""A local Hugging Face causal-LM checkpoint directory: config, safetensors weights read lazily, tokenizer.

``torch-ir generate CHECKPOINT_DIR`` and the LLM compiler start here. :func:`load_checkpoint` reads and checks
everything a directory written by ``save_pretrained`` holds, before anything is built from it::

    ckpt = load_checkpoint("Qwen2-0.5B/")              # config.json, safetensors headers, tokenizer.json
    model = ckpt.build_on_meta()                         # for extraction: no memory for the weights
    ir = extract_ir(StaticCacheLM(model, max_cache_len=256), ...)
    weights = ckpt.state_dict()                          # the tensors, read from the files only now
    ids = ckpt.encode("Hello")

The directory is untrusted data (docs/security.md), like every file the toolkit reads:

* nothing in it is run: ``config.json`` picks a transformers class only through transformers' own table of
  model types, and custom code (``auto_map``, ``trust_remote_code``) is never loaded;
* weights are read from safetensors only; ``pytorch_model.bin`` pickles are refused with the command that
  converts them, since unpickling can run code;
* the shard index may only name plain file names inside the directory (no ``../x``, no absolute paths);
* every file read, here or by a library that opens it by name (safetensors, tokenizers, transformers), is first
  checked to be a regular file: a FIFO would block forever, a link to ``/dev/zero`` never end. The tokenizer is
  made from private copies of the few files it needs (read with a bound), so transformers cannot open any other
  file of the directory;
* every model size in ``config.json`` (layers, experts, widths, under any name transformers reads them by) is a
  positive integer within ``torch_ir.limits`` (``max_layers``, ``max_experts``, ``max_dim``), checked before
  anything is built, so a hostile config costs milliseconds. Every number in it is finite (Python's JSON reads
  ``NaN`` and ``Infinity``), norm epsilons are not negative and ``rope_theta`` is positive: each of those would
  make every logit NaN;
* every tensor's size is checked against ``torch_ir.limits`` before it is read, and the headers are checked
  against the model the config describes (names and shapes) before any weight is used, so a config and
  weights that do not belong together are refused with every difference listed, not found later as garbage;
* every call into the tokenizer library (loading, encoding, decoding) ends in a result or one error naming
  ``tokenizer.json``: its Rust panics are caught, and a call is abandoned after ``max_tokenizer_seconds``
  (see :func:`_tokenizer_call` for why a regex can otherwise take hours).

Every refusal is a :class:`CheckpointError` (a ``TorchIRError``) that names the directory, the file and the
fix; sizes over the limits raise ``LimitExceededError`` as elsewhere. transformers is imported only here.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..errors import InputNotFoundError, InputReadError, LimitExceededError, UnsafeInputError, WeightsMismatchError
from ..fileio import check_regular_file, read_input
from ..limits import check_alloc, check_count, check_shape, get_limits, how_to_raise
from .constants import build_on_meta as recording_meta_device
from .constants import known_value

if TYPE_CHECKING:
    import transformers

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
ADDED_TOKENS = "added_tokens.json"

#: The files the tokenizer is made from. ``AutoTokenizer.from_pretrained`` opens a dozen names by itself (these,
#: vocab.json, merges.txt, tokenizer.model, chat templates, ... by class and version); it is given a private
#: directory holding copies of these only. transformers 5 builds a fast tokenizer from tokenizer.json alone (the
#: vocabulary files beside it change nothing), and picks its class by config.json's model_type.
_TOKENIZER_FILES = (TOKENIZER, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, ADDED_TOKENS, CONFIG)

_T = TypeVar("_T")

_TOKENIZER_FIX = (f"replace {TOKENIZER} and {TOKENIZER_CONFIG} with the model's own (tokenizer.save_pretrained(dir) "
                  "writes both), or delete them to load the checkpoint without a tokenizer")

#: Model types whose loading is tested end to end (logits equal to ``from_pretrained``'s). Any other model type
#: with an ``AutoModelForCausalLM`` class loads too when its checkpoint keys are the module's own names.
TESTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

#: How many problems one error lists before it gives a count of the rest.
_SHOWN = 10

#: Bytes per element of each safetensors dtype code; a tensor of another code is refused.
_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
_FLOAT_CODES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F16", "BF16", "F32", "F64"}
_CONFIG_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                  "float64": torch.float64}

#: Config fields that fix the weights' shapes: an error about shapes shows them, so the reader sees which
#: value in config.json disagrees with the files.
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "tie_word_embeddings")

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
_CONVERT_HINT = ("convert it to safetensors where the file is trusted: "
                 "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir) writes model.safetensors "
                 "(pickled weights can run code when they are loaded, so torch_ir never opens them)")


class CheckpointError(InputReadError):
    """A checkpoint directory cannot be used: a file is missing, malformed, or does not fit the others.

    Every problem :func:`load_checkpoint` finds is one of these (or a ``LimitExceededError``), so one
    ``except CheckpointError`` covers a bad directory; the message names the directory, the file and the fix.
    """


class CheckpointNotFoundError(CheckpointError, InputNotFoundError):
    """The directory, its ``config.json``, or a shard its index lists does not exist."""


class CheckpointWeightsError(CheckpointError, WeightsMismatchError):
    """The safetensors files do not hold the weights ``config.json`` describes, or cannot be read."""


class UnsafeCheckpointError(CheckpointError, UnsafeInputError):
    """A file of the checkpoint names a path outside the directory."""


# -- what the config's model expects ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Stored:
    """One tensor as a safetensors header describes it (no data read)."""

    file: Path
    shape: tuple[int, ...]
    code: str  # safetensors dtype code: "F32", "BF16", ...


@dataclass(frozen=True)
class _ModelSpec:
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


def _model_spec(model: torch.nn.Module, where: str) -> _ModelSpec:
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
    return _ModelSpec(
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


# -- the checkpoint -----------------------------------------------------------------------------------------

@dataclass(repr=False)
class HFCheckpoint:
    """A checked checkpoint directory; made by :func:`load_checkpoint`, which says what was checked.

    Holds no weights: :meth:`state_dict` reads them from ``files`` when called, so a compiler that only needs
    shapes (:meth:`build_on_meta`) never pays for them.
    """

    path: Path
    config: transformers.PretrainedConfig
    #: The safetensors files: ``model.safetensors``, or the shards ``model.safetensors.index.json`` lists.
    files: list[Path]
    #: A transformers fast tokenizer from ``tokenizer.json``; None when the directory has none.
    tokenizer: Any | None = None
    #: The index's ``weight_map`` (tensor name -> shard file name); None for a single file.
    weight_map: dict[str, str] | None = field(default=None, repr=False)
    #: ``eos_token_id`` of ``generation_config.json``; None when that file does not set it.
    generation_eos: list[int] | None = field(default=None, repr=False)
    _spec: _ModelSpec | None = field(default=None, init=False, repr=False, compare=False)

    def __repr__(self) -> str:  # the config and tokenizer print dozens of lines each
        return (f"HFCheckpoint({str(self.path)!r}, model_type={self.model_type!r}, files={len(self.files)}, "
                f"tokenizer={type(self.tokenizer).__name__ if self.tokenizer is not None else None})")

    @property
    def model_type(self) -> str:
        return str(self.config.model_type)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model is built in by default: the config's ``dtype``, or float32 if it has none."""
        return _config_dtype(self.config) or torch.float32

    def build_on_meta(self, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """The config's ``AutoModelForCausalLM`` on the meta device (shapes only), in eval mode, SDPA attention.

        Built under :func:`torch_ir.build_on_meta` rather than a bare ``torch.device("meta")``, so the values of
        small buffers made in ``__init__`` (rotary ``inv_freq``) stay known: extraction records how to rebuild
        them, and :meth:`build_with_weights` fills them in. ``dtype`` defaults to :attr:`dtype`.
        """
        from transformers import AutoModelForCausalLM

        dtype = self.dtype if dtype is None else _float_dtype(dtype)
        # from_config writes the dtype and the attention implementation into the config it is given.
        config = copy.deepcopy(self.config)
        try:
            with recording_meta_device():
                model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa",
                                                         trust_remote_code=False)
        except Exception as e:  # the config's values are the file's; any failure to build is its fault
            raise CheckpointError(
                f"checkpoint {self.path}: transformers cannot build {self.model_type!r} from {CONFIG} "
                f"({type(e).__name__}: {e}); fix its sizes (positive, hidden_size a multiple of num_attention_heads, "
                f"num_attention_heads of num_key_value_heads), or use the {CONFIG} saved with the weights"
            ) from None
        return model.eval()

    def build_with_weights(self, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """The model with the checkpoint's weights, on the CPU: a reference to compare a compiled model with.

        Equal to ``AutoModelForCausalLM.from_pretrained(path, dtype=dtype)`` (SDPA attention), without reading
        any file that method would and this loader refuses. The weights are cast to the model's dtype as
        ``from_pretrained`` casts them; non-persistent buffers get the values they were built with.
        """
        model = self.build_on_meta(dtype)
        target = self.dtype if dtype is None else dtype
        state = self.state_dict(target)
        result = model.load_state_dict(state, strict=False, assign=True)
        # Only possible with check_weights=False: the full check would have refused these files.
        if result.missing_keys or result.unexpected_keys:
            raise CheckpointWeightsError(self._report(
                [f"{k} is missing: no file holds it" for k in result.missing_keys]
                + [f"{k} is not a weight of {type(model).__name__}" for k in result.unexpected_keys]))
        _fill_known_values(model, self.path)
        return model.requires_grad_(False)

    def state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Every tensor of the safetensors files, by the model's state-dict key; floats cast to ``dtype`` if given.

        Tensors are memory-mapped from the files (pages are read when used). Tied weights the files store once
        (``lm_head.weight`` when ``tie_word_embeddings``) appear under each of their keys, as the same tensor;
        keys ``from_pretrained`` ignores (old ``rotary_emb.inv_freq``) are left out. Each tensor's size is
        checked against ``torch_ir.limits`` before it is read.
        """
        target = None if dtype is None else _float_dtype(dtype)
        spec = self._model_spec()
        state: dict[str, torch.Tensor] = {}
        for file in self.files:
            with _opened(file, self.path) as handle:
                for key in handle.keys():
                    name = spec.model_key(key)
                    if name not in spec.shapes and spec.ignored(key):
                        continue
                    state[name] = _read_tensor(handle, key, file, self.path, target)
        for key, others in spec.ties.items():
            if key not in state:
                present = [o for o in others if o in state]
                if present:
                    state[key] = state[present[0]]
        return state

    def check_weights(self) -> None:
        """Compare the files' headers (names, shapes, dtypes; no data) with the config's model.

        Reports every missing, unexpected and wrong-shape tensor together, naming the file of each, in one
        :class:`CheckpointWeightsError`. :func:`load_checkpoint` calls it unless ``check_weights=False``.
        """
        stored, problems = _scan_headers(self.files, self.path)
        spec = self._model_spec()
        problems += _compare(stored, spec, self.config)
        problems += _index_problems(self.weight_map, stored)
        if problems:
            raise CheckpointWeightsError(self._report(problems))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, through the checkpoint's tokenizer (special tokens as the tokenizer adds them,
        e.g. Llama's BOS). A tokenizer that fails or takes over ``max_tokenizer_seconds`` is a CheckpointError."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        tokenizer = self._tokenizer()
        ids = _tokenizer_call(self.path, f"used to encode a text of {len(text)} characters",
                              lambda: tokenizer.encode(text, add_special_tokens=add_special_tokens))
        return [int(i) for i in ids]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """The text of token ids; special tokens (EOS, padding) are left out unless ``skip_special_tokens=False``."""
        tokenizer, tokens = self._tokenizer(), [int(i) for i in ids]
        return str(_tokenizer_call(self.path, f"used to decode {len(tokens)} tokens",
                                   lambda: tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)))

    @property
    def eos_token_ids(self) -> set[int]:
        """Ids that end generation: ``generation_config.json``'s ``eos_token_id`` (what ``generate`` uses; chat
        models list several there), else ``config.json``'s, else the tokenizer's EOS; empty when none has one."""
        if self.generation_eos is not None:
            return set(self.generation_eos)
        ids = _token_ids(getattr(self.config, "eos_token_id", None))
        if ids is None and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids = [int(self.tokenizer.eos_token_id)]
        return set(ids or ())

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise CheckpointError(
                f"checkpoint {self.path} has no {TOKENIZER}, so it cannot turn text into token ids; copy the "
                f"model's {TOKENIZER} and {TOKENIZER_CONFIG} into the directory (a tokenizer saved with "
                f"tokenizer.save_pretrained(dir) has both), or pass token ids instead of text")
        return self.tokenizer

    def _model_spec(self) -> _ModelSpec:
        if self._spec is None:
            self._spec = _model_spec(self.build_on_meta(), f"checkpoint {self.path}")
        return self._spec

    def _report(self, problems: list[str]) -> str:
        shown = problems[:_SHOWN] + ([f"... and {len(problems) - _SHOWN} more"] if len(problems) > _SHOWN else [])
        lines = [f"checkpoint {self.path}: the weights do not belong to its {CONFIG} "
                 f"({_config_summary(self.config)}); {len(problems)} problem(s):"]
        lines += [f"  {p}" for p in shown]
        lines.append(f"Fix: put the {CONFIG} saved with these weights beside them (save_pretrained writes both), "
                     f"or use the weights that belong to this {CONFIG}.{_conversion_hint(self.model_type)}")
        return "\n".join(lines)


# -- loading ------------------------------------------------------------------------------------------------

def is_checkpoint_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory with a ``config.json``: what a CLI argument naming a checkpoint looks like
    (anything else is a file: an IR, a program, an ONNX model)."""
    try:
        root = Path(path)
        # lexists, not is_file: a config.json that is a FIFO or a link to a device is a checkpoint's, to refuse
        return root.is_dir() and os.path.lexists(root / CONFIG)
    except (OSError, TypeError, ValueError):
        return False


def load_checkpoint(path: str | os.PathLike, *, check_weights: bool = True) -> HFCheckpoint:
    """Load and check a Hugging Face causal-LM checkpoint directory (as ``save_pretrained`` writes it).

    Checks, each failure a :class:`CheckpointError` naming the file and the fix, and nothing returned half-done:

    1. the directory and its ``config.json`` (a JSON object with a ``model_type``); every file read is a regular
       file (no FIFO, no device, no link to one), checked before anything opens it;
    2. the config: a model type transformers knows, with an ``AutoModelForCausalLM`` class, not quantized; every
       size within ``torch_ir.limits``, every number finite (before anything is built);
    3. the weights: ``model.safetensors``, or ``model.safetensors.index.json`` and every shard it names (plain
       file names in the directory only); ``pytorch_model.bin`` alone is refused with the conversion command;
    4. with ``check_weights`` (the default), the safetensors headers against the config's model: names,
       shapes and dtypes, every difference listed; no tensor data is read. ``False`` skips this for a
       checkpoint already checked, but each tensor's size is still checked when it is read;
    5. ``tokenizer.json`` when present: it must load, and its vocabulary must fit the config's ``vocab_size``;
    6. ``generation_config.json`` when present: its ``eos_token_id``.
    """
    root = _checkpoint_dir(path)
    config = _load_config(root)
    files, weight_map = _weight_files(root)
    checkpoint = HFCheckpoint(root, config, files, weight_map=weight_map, generation_eos=_generation_eos(root))
    if check_weights:
        checkpoint.check_weights()
    checkpoint.tokenizer = _load_tokenizer(root, config)
    return checkpoint


def _checkpoint_dir(path: str | os.PathLike) -> Path:
    root = Path(path)
    if not root.exists():
        raise CheckpointNotFoundError(
            f"checkpoint directory {str(root)!r} does not exist; pass the directory that holds {CONFIG} and "
            f"{WEIGHTS} (one written by save_pretrained, or a downloaded Hugging Face model)")
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint {str(root)!r} is a file, not a directory; pass the directory that holds {CONFIG} and the "
            f"weights{f' ({root.parent})' if root.name in (CONFIG, WEIGHTS, INDEX) else ''}")
    if not os.path.lexists(root / CONFIG):  # anything else by that name is refused when it is read
        raise CheckpointNotFoundError(
            f"checkpoint {root}: no {CONFIG} in the directory; a Hugging Face checkpoint holds {CONFIG} (the "
            "architecture) beside its weights: copy it from where the weights came from, or save the model "
            "with save_pretrained(dir), which writes both")
    return root


@contextmanager
def _as_checkpoint_error() -> Iterator[None]:
    """``fileio``'s refusals of a checkpoint's file (missing, not a regular file, unreadable) as CheckpointErrors,
    with the same message, so one ``except CheckpointError`` covers a bad directory."""
    try:
        yield
    except CheckpointError:
        raise
    except InputNotFoundError as e:
        raise CheckpointNotFoundError(str(e)) from None
    except InputReadError as e:
        raise CheckpointError(str(e)) from None


def _read_bytes(root: Path, name: str, fix: str) -> bytes:
    """The bytes of ``root/name``: a regular file (checked before it is opened), read with a bound."""
    with _as_checkpoint_error():
        return read_input(root / name, f"checkpoint file {name}", fix)


def _read_json(root: Path, name: str, fix: str) -> Any:
    """The parsed JSON of ``root/name``; its size is checked before it is read (``torch_ir.limits``)."""
    return _parse_json(root, name, _read_bytes(root, name, fix), fix)


def _parse_json(root: Path, name: str, data: bytes, fix: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"checkpoint {root}: {name} is not valid JSON ({type(e).__name__}: {e}); {fix}") \
            from None


def _read_json_object(root: Path, name: str, fix: str) -> dict[str, Any]:
    return _parse_json_object(root, name, _read_bytes(root, name, fix), fix)


def _parse_json_object(root: Path, name: str, data: bytes, fix: str) -> dict[str, Any]:
    value = _parse_json(root, name, data, fix)
    if not isinstance(value, dict):
        raise CheckpointError(f"checkpoint {root}: {name} holds a JSON {type(value).__name__}, not an object; {fix}")
    return value


def _load_config(root: Path) -> transformers.PretrainedConfig:
    fix = f"use the {CONFIG} that came with the model (save_pretrained writes it)"
    raw = _read_json_object(root, CONFIG, fix)
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CheckpointError(
            f"checkpoint {root}: {CONFIG} has no \"model_type\" (e.g. \"llama\", \"qwen2\"), so the architecture "
            f"is unknown; {fix}")
    _check_model_type(root, model_type)
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
    _check_numbers(raw, where)
    _check_sizes(raw, _size_aliases(config_class), where)
    try:
        config = config_class.from_dict(raw)
    except Exception as e:  # the values are the file's; transformers raises many kinds on bad ones
        raise CheckpointError(
            f"checkpoint {root}: transformers cannot read {CONFIG} as a {model_type!r} config "
            f"({type(e).__name__}: {e}); {fix}") from None
    _check_model_sizes(config, where)
    _config_dtype(config, root)  # refuse a dtype we cannot build now, not when the model is first built
    _token_ids(getattr(config, "eos_token_id", None), f"checkpoint {root}: {CONFIG}")
    return config


def _check_model_type(root: Path, model_type: str) -> None:
    """A model type transformers knows (by its own table: a file never names a class) with a causal-LM class."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    supported = (f"supported: the {len(causal)} causal-LM model types of transformers {transformers.__version__} "
                 f"(transformers.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), e.g. "
                 f"{', '.join(t for t in ('llama', 'mistral', 'qwen2', 'qwen3', 'gemma2', 'phi3') if t in causal)}; "
                 f"tested: {', '.join(TESTED_MODEL_TYPES)}")
    if model_type not in CONFIG_MAPPING:
        raise CheckpointError(
            f"checkpoint {root}: {CONFIG} has model_type {model_type!r}, which transformers "
            f"{transformers.__version__} does not know (custom model code, auto_map, is never run); {supported}")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise CheckpointError(
            f"checkpoint {root}: {CONFIG} has model_type {model_type!r}, which is not a causal language model "
            f"(transformers has no AutoModelForCausalLM class for it), so it cannot generate text; {supported}")


def _config_dtype(config: Any, root: Path | None = None) -> torch.dtype | None:
    """The config's ``dtype`` (``torch_dtype`` in older files) as a floating torch dtype, or None if unset."""
    value = getattr(config, "dtype", None)
    if value is None or (isinstance(value, torch.dtype) and value in _CONFIG_DTYPES.values()):
        return value
    if isinstance(value, str) and value in _CONFIG_DTYPES:
        return _CONFIG_DTYPES[value]
    where = f"checkpoint {root}: " if root is not None else ""
    raise CheckpointError(
        f"{where}{CONFIG} has dtype {value!r}; use one of {', '.join(_CONFIG_DTYPES)} (or remove it for float32)")


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype {dtype!r}: pass a floating torch dtype such as torch.bfloat16")
    return dtype


def _token_ids(value: Any, where: str | None = None) -> list[int] | None:
    """An ``eos_token_id`` field (an int, a list of ints, or null) as a list; a bad one raises naming ``where``."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    if all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        return list(items)
    raise CheckpointError(f"{where or 'config'}: eos_token_id {value!r:.80} is not a token id or a list of them; "
                          "write e.g. \"eos_token_id\": 2 or [2, 7]")


def _generation_eos(root: Path) -> list[int] | None:
    if not os.path.lexists(root / GENERATION_CONFIG):  # exists() would hide a dangling link; reading names it
        return None
    fix = f"fix it or delete it ({CONFIG}'s eos_token_id is used then)"
    raw = _read_json_object(root, GENERATION_CONFIG, fix)
    _check_numbers(raw, f"checkpoint {root}: {GENERATION_CONFIG}")
    return _token_ids(raw.get("eos_token_id"), f"checkpoint {root}: {GENERATION_CONFIG}")


# -- config values: every number finite, every size within the limits ---------------------------------------

def _entries(doc: Any) -> Iterator[tuple[str, str, Any]]:
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


def _check_numbers(raw: dict[str, Any], where: str) -> None:
    """Refuse a non-finite number anywhere (``NaN``, ``Infinity``, ``1e999``: Python's JSON reads them all, and
    an integer of 400 digits is infinite as soon as it is used as a float), a negative norm epsilon and a
    non-positive ``rope_theta``: each makes every logit NaN (or turns the rotary embedding off), and generation
    would then emit token 0 as if it were the model's answer."""
    fix = f"write the value the model was trained with (the {CONFIG} saved with the weights has it)"
    for place, name, value in _entries(raw):
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


def _size_aliases(config_class: type) -> dict[str, str]:
    """Field name -> the size rule's name for the names a config class stores sizes under (its ``attribute_map``
    maps canonical names to them: GPT-2 keeps num_hidden_layers as n_layer), with those of its sub-configs."""
    aliases: dict[str, str] = {}
    for cls in [config_class, *getattr(config_class, "sub_configs", {}).values()]:
        aliases.update({stored: canonical for canonical, stored in getattr(cls, "attribute_map", {}).items()})
    return aliases


def _check_sizes(raw: dict[str, Any], aliases: Mapping[str, str], where: str) -> None:
    """Every size field of the file, at any depth (``text_config`` too), before transformers reads any of them."""
    for place, name, value in _entries(raw):
        rule = _SIZE_RULES.get(name) or _SIZE_RULES.get(aliases.get(name, ""))
        if rule is not None and value is not None and not isinstance(value, list):  # a list's items come next
            _check_size(value, place, *rule, where)


def _check_size(value: Any, place: str, limit: str, minimum: int, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        wanted = "a positive integer" if minimum > 0 else "a non-negative integer"
        raise CheckpointError(f"{where}: {place} is {json.dumps(value)[:80]}, not {wanted}; a model size must be "
                              f"{wanted}: use the {CONFIG} saved with the weights")
    check_count(value, limit, f"{where}: {place}")


def _check_model_sizes(config: Any, where: str) -> None:
    """The sizes as transformers reads them (its defaults and aliases applied), before anything is built. (The
    weights they make are checked against ``max_alloc_bytes`` right after the build on the meta device, which
    takes milliseconds once the layers are bounded, and before any file is read against them.)"""
    text = config.get_text_config(decoder=True)
    for name in _MODEL_SIZES:
        value = getattr(text, name, None)
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                _check_size(item, name, *_SIZE_RULES[name], where)


# -- weight files -------------------------------------------------------------------------------------------

def _weight_files(root: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files, in the order ``from_pretrained`` looks: one file first, then a shard index."""
    if os.path.lexists(root / WEIGHTS):
        _check_weights_file(root / WEIGHTS)
        return [root / WEIGHTS], None
    if os.path.lexists(root / INDEX):
        return _shards(root)
    raise _no_weights(root)


def _shards(root: Path) -> tuple[list[Path], dict[str, str]]:
    fix = f"download {INDEX} again, or save the model with save_pretrained(dir), which writes it"
    index = _read_json_object(root, INDEX, fix)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f"checkpoint {root}: {INDEX} has no \"weight_map\" object (tensor name -> shard file); {fix}")
    bad = [(k, v) for k, v in weight_map.items() if not isinstance(v, str)]
    if bad:
        raise CheckpointError(
            f"checkpoint {root}: {INDEX} maps {bad[0][0]!r:.80} to {bad[0][1]!r:.80}, not a file name; {fix}")
    names = sorted(set(weight_map.values()))
    files = [_shard_path(root, name) for name in names]
    missing = [name for name, file in zip(names, files) if not os.path.lexists(file)]
    if missing:
        shown = ", ".join(missing[:_SHOWN]) + (f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else "")
        raise CheckpointNotFoundError(
            f"checkpoint {root}: {INDEX} lists shard(s) that are not in the directory: {shown}; download the "
            f"missing shard(s): every one of the {len(names)} files the index names is needed")
    for file in files:
        _check_weights_file(file)
    return files, dict(weight_map)


def _shard_path(root: Path, name: str) -> Path:
    """``root/name`` for a plain file name; anything that could point elsewhere is refused.

    A plain name can only be a file in the directory itself (which may be a symlink: the Hugging Face cache
    links each snapshot's files to its blobs, and the user chose that directory).
    """
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or Path(name).is_absolute():
        raise UnsafeCheckpointError(
            f"checkpoint {root}: {INDEX} names shard {name!r:.200}, which is not a plain file name in the "
            "directory; shards are read only from the checkpoint directory itself (no ../, no absolute paths): "
            "use an index written by save_pretrained")
    if not name.endswith(".safetensors"):
        hint = _CONVERT_HINT if name.endswith((".bin", ".pt", ".pth")) else "list the .safetensors shards"
        raise CheckpointError(f"checkpoint {root}: {INDEX} names shard {name!r:.200}, which is not a "
                              f".safetensors file; only safetensors weights are read: {hint}")
    return root / name


def _no_weights(root: Path) -> CheckpointError:
    try:
        names = sorted(p.name for p in root.iterdir())
    except OSError:
        names = []
    pickles = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt", ".bin.index.json"))]
    if pickles:
        return CheckpointError(
            f"checkpoint {root}: the weights are {', '.join(pickles[:3])}, a PyTorch pickle format this loader "
            f"does not read; {_CONVERT_HINT}")
    other = [n for n in names if n.endswith(".safetensors")]
    found = (f"; the directory has {', '.join(other[:3])}: if that is the model, rename it to {WEIGHTS} (one "
             f"file) or write the {INDEX} that lists the shards" if other else "")
    return CheckpointNotFoundError(
        f"checkpoint {root}: no weights: neither {WEIGHTS} nor {INDEX} is in the directory{found}; copy the "
        "model's safetensors files beside its config.json (save_pretrained writes them)")


def _check_weights_file(file: Path) -> None:
    """Refuse a weights file that is not a regular file (safetensors opens it by name and maps it: a FIFO would
    block, a device never end). Its size is not an allocation: each tensor's size is checked when it is read."""
    fix = "download it again, or save the weights with save_pretrained"
    try:
        with _as_checkpoint_error():
            check_regular_file(file, f"checkpoint weights file {file.name}", fix)
    except LimitExceededError:
        pass  # over max_alloc_bytes as a whole, which is fine for a file that is mapped, never read whole


@contextmanager
def _opened(file: Path, root: Path) -> Iterator[Any]:
    """``safe_open`` a weights file, its failures (bad header, truncated file) as CheckpointWeightsError."""
    from safetensors import SafetensorError, safe_open

    _check_weights_file(file)  # again: state_dict() opens the files long after load_checkpoint checked them
    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointWeightsError(
            f"checkpoint {root}: {file.name} is not a readable safetensors file ({type(e).__name__}: {e}); "
            "download it again, or save the weights with save_pretrained") from None
    with handle:
        yield handle


def _header(handle: Any, key: str, file: Path, root: Path) -> _Stored:
    view = handle.get_slice(key)
    code = str(view.get_dtype())
    if code not in _ITEMSIZE:
        raise CheckpointWeightsError(
            f"checkpoint {root}: {key} in {file.name} has safetensors dtype {code}, which is not read here; save "
            "the weights in float32, float16 or bfloat16")
    shape = tuple(view.get_shape())
    check_shape(list(shape), _ITEMSIZE[code], f"checkpoint {root}: {key} in {file.name}")
    return _Stored(file, shape, code)


def _scan_headers(files: list[Path], root: Path) -> tuple[dict[str, _Stored], list[str]]:
    """Every tensor's file, shape and dtype code, from the headers only; a key in two files is a problem."""
    stored: dict[str, _Stored] = {}
    problems = []
    for file in files:
        with _opened(file, root) as handle:
            for key in handle.keys():
                entry = _header(handle, key, file, root)
                if key in stored:
                    problems.append(f"{key} is in both {stored[key].file.name} and {file.name}")
                stored[key] = entry
    return stored, problems


def _read_tensor(handle: Any, key: str, file: Path, root: Path, dtype: torch.dtype | None) -> torch.Tensor:
    entry = _header(handle, key, file, root)  # sizes checked before the tensor exists
    if dtype is not None and entry.code in _FLOAT_CODES:
        check_alloc(dtype.itemsize * _numel(entry.shape), f"checkpoint {root}: {key} in {file.name} as {dtype}")
    try:
        tensor = handle.get_tensor(key)
    except Exception as e:  # a dtype this torch lacks, a read error: name the tensor and the file
        raise CheckpointWeightsError(
            f"checkpoint {root}: {key} in {file.name} cannot be read ({type(e).__name__}: {e}); download the "
            "file again") from None
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


# -- comparing the files with the config ----------------------------------------------------------------------

def _compare(stored: dict[str, _Stored], spec: _ModelSpec, config: Any) -> list[str]:
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
        elif spec.floating[name] and entry.code not in _FLOAT_CODES:
            wrong.append(f"{key} is {entry.code} in {entry.file.name} but the model's weight is floating point "
                         "(quantized weights are not supported)")
    return wrong + _missing(present, spec, config) + unexpected


def _missing(present: set[str], spec: _ModelSpec, config: Any) -> list[str]:
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


def _index_problems(weight_map: dict[str, str] | None, stored: dict[str, _Stored]) -> list[str]:
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


# -- the tokenizer and the reference model's leftovers --------------------------------------------------------

def _load_tokenizer(root: Path, config: Any) -> Any | None:
    """The fast tokenizer of ``tokenizer.json`` (None without one), checked against the config's vocabulary.

    transformers loads it from a private directory holding copies of :data:`_TOKENIZER_FILES` (each a regular
    file of the checkpoint, read with a bound): whatever names from_pretrained opens, it finds only those.
    """
    if not os.path.lexists(root / TOKENIZER):
        return None
    files = {name: _read_bytes(root, name, _TOKENIZER_FIX) for name in _TOKENIZER_FILES
             if os.path.lexists(root / name)}
    settings = (_parse_json_object(root, TOKENIZER_CONFIG, files[TOKENIZER_CONFIG], _TOKENIZER_FIX)
                if TOKENIZER_CONFIG in files else {})
    with tempfile.TemporaryDirectory(prefix="torch_ir_tokenizer_") as private:
        for name, data in files.items():
            (Path(private) / name).write_bytes(data)
        try:
            tokenizer = _tokenizer_call(root, "loaded as a tokenizer",
                                        lambda: _tokenizer_from(private, "auto_map" in settings))
        except CheckpointError as e:  # the library's message names the copy; the user knows the original
            raise type(e)(str(e).replace(private, str(root))) from None
    tokenizer.name_or_path = str(root)
    _check_decoder(root, tokenizer)
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise CheckpointError(
            f"checkpoint {root}: the tokenizer ({TOKENIZER}) has {len(tokenizer)} tokens but {CONFIG} has "
            f"vocab_size={vocab}: ids up to {len(tokenizer) - 1} cannot be embedded; use the tokenizer that "
            f"belongs to these weights, or the {CONFIG} that does")
    return tokenizer


def _tokenizer_from(directory: str, custom: bool) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if custom:  # tokenizer code of the model's own: never run; tokenizer.json alone describes the tokenizer
        return PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)
    # the class transformers' table gives, as from_pretrained users get
    return AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)


def _check_decoder(root: Path, tokenizer: Any) -> None:
    """Refuse a regular expression in the decoder the tokenizer was loaded with: decoding runs every token through
    it while holding the GIL, so its time could not be bounded as encoding's is (:func:`_tokenizer_call`). Real
    tokenizers' decoders replace plain strings (``"\u2581"`` -> ``" "``)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return
    for place, name, value in _entries(json.loads(decoder.__getstate__())):
        if name == "Regex":
            raise CheckpointError(
                f"checkpoint {root}: {TOKENIZER}: decoder.{place} is the regular expression {json.dumps(value)[:80]}; "
                f"a decoder may only replace plain strings (a regex could take hours on one token); {_TOKENIZER_FIX}")


def _tokenizer_call(root: Path, action: str, call: Callable[[], _T]) -> _T:
    """``call()``, a call into the tokenizers library, ending in its result or one :class:`CheckpointError` that
    names ``tokenizer.json`` and says it cannot be ``action`` ("loaded as a tokenizer", "used to ...").

    A hostile ``tokenizer.json`` defeats a plain ``try`` two ways:

    * the Rust library panics on some files and texts: ``pyo3_runtime.PanicException`` derives from
      ``BaseException``, which ``except Exception`` misses, and the panic hook first prints to file descriptor 2
      (with ``RUST_BACKTRACE``, a whole backtrace), which would break the command line's one-line error: fd 2 is
      held meanwhile (:class:`_HeldStderr`);
    * a regular expression of its normalizer or pre-tokenizer backtracks catastrophically (``(a+)+$``).
      Oniguruma, the library's regex engine, gives up one match after 10^7 steps (``retry-limit-in-match``:
      the panic above, in 0.2 s), but a search tries every start position, and a text of many near misses
      (``"a" * 21 + "!"`` repeated) costs just under that limit at each: 22 KB took 46 s. No rule on a pattern's
      text tells such regexes from the intricate ones real tokenizers use, so the call itself is bounded: it
      runs in a worker thread, abandoned after ``max_tokenizer_seconds``. Encoding releases the GIL inside the
      library (``encode_batch``), so the deadline holds; the abandoned thread runs on until the library returns
      (a command line exits, which ends it). Decoding holds the GIL, so a decoder may not use a regex at all
      (:func:`_check_decoder`).
    """
    seconds = get_limits().max_tokenizer_seconds
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - a Rust panic is a BaseException; reported by the caller's thread
            outcome["error"] = e

    worker = threading.Thread(target=work, name="torch_ir tokenizer", daemon=True)
    with _HeldStderr() as held:
        worker.start()
        worker.join(seconds)
        held.keep = not worker.is_alive() and "error" not in outcome  # a library's warnings survive a success
    if worker.is_alive():
        raise CheckpointError(
            f"checkpoint {root}: {TOKENIZER} could not be {action} within {seconds} s, the limit on one call into a "
            f"tokenizer (max_tokenizer_seconds): a regular expression of it backtracks catastrophically; "
            f"{_TOKENIZER_FIX}; {how_to_raise('max_tokenizer_seconds')}")
    if "error" in outcome:
        e = outcome["error"]
        detail = " ".join(str(e).split())[:300]  # a panic's message spans lines
        raise CheckpointError(f"checkpoint {root}: {TOKENIZER} cannot be {action} ({type(e).__name__}: {detail}); "
                              f"{_TOKENIZER_FIX}")
    return outcome["value"]


class _HeldStderr:
    """File descriptor 2 sent to a temporary file for a ``with`` block; what was written there goes back to stderr
    at the end when ``keep`` is set, and is dropped otherwise (a panic's message: the error says what happened).

    fd 2 belongs to the process, so blocks are serialized; another thread's stderr output in the meantime is
    delayed (or, when the call fails, dropped).
    """

    _lock = threading.Lock()

    def __init__(self) -> None:
        self.keep = False
        self._saved: int | None = None

    def __enter__(self) -> _HeldStderr:
        self._file = tempfile.TemporaryFile()
        self._lock.acquire()
        _flush_stderr()
        try:
            self._saved = os.dup(2)
        except OSError:  # no fd 2 at all (a daemon): nothing to hold
            return self
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._saved is not None:
                _flush_stderr()
                os.dup2(self._saved, 2)
                os.close(self._saved)
                if self.keep:
                    self._replay()
        finally:
            self._file.close()
            self._lock.release()

    def _replay(self) -> None:
        self._file.seek(0)
        while chunk := self._file.read(1 << 16):
            while chunk:
                chunk = chunk[os.write(2, chunk):]


def _flush_stderr() -> None:
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):  # closed or broken: nothing buffered can be saved
        pass


def _fill_known_values(model: torch.nn.Module, root: Path) -> None:
    """Give the meta tensors left after loading (non-persistent buffers such as rotary ``inv_freq``) the values
    ``build_on_meta`` recorded while the model was built; a meta tensor with no known value is refused."""
    for prefix, module in model.named_modules():
        for store in (module._buffers, vars(module)):  # parameters all come from the files
            for name, t in list(store.items()):
                if not isinstance(t, torch.Tensor) or not t.is_meta:
                    continue
                value = known_value(t)
                if value is None:
                    raise CheckpointError(
                        f"checkpoint {root}: {prefix + '.' if prefix else ''}{name} has no value after loading "
                        "(neither a weight in the files nor a buffer computed when the model is built); "
                        "the model cannot run with real weights")
                store[name] = value.clone()


__all__ = [
    "CheckpointError", "CheckpointNotFoundError", "CheckpointWeightsError", "HFCheckpoint", "TESTED_MODEL_TYPES",
    "UnsafeCheckpointError", "is_checkpoint_dir", "load_checkpoint",
]
