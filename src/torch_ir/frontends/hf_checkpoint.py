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
  (see :func:`.hf_tokenizer.tokenizer_call` for why a regex can otherwise take hours).

Every refusal is a :class:`CheckpointError` (a ``TorchIRError``) that names the directory, the file and the
fix; sizes over the limits raise ``LimitExceededError`` as elsewhere. transformers is imported only here and in
the modules of the steps below, and only inside the functions that use it.

:func:`load_checkpoint` runs the steps in order, each a module beside this one:

1. :mod:`.hf_config` reads ``config.json`` (its values checked by :mod:`.hf_config_checks` before transformers
   parses them) and ``generation_config.json``;
2. :mod:`.hf_weights` finds the safetensors files and reads their headers (and, later, their tensors);
3. :mod:`.hf_weights_check` compares the headers with the config's model;
4. :mod:`.hf_tokenizer` loads ``tokenizer.json`` and bounds every call into it.

Each reads files through :mod:`.hf_files`: the file names, the errors, the bounded readers.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .constants import build_on_meta as recording_meta_device
from .constants import known_value
from .hf_config import TESTED_MODEL_TYPES, config_dtype, load_config, read_generation_eos, token_ids
from .hf_files import (
    CONFIG,
    INDEX,
    TOKENIZER,
    TOKENIZER_CONFIG,
    WEIGHTS,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWeightsError,
    UnsafeCheckpointError,
)
from .hf_tokenizer import load_tokenizer, tokenizer_call
from .hf_weights import opened, read_tensor, scan_headers, weight_files
from .hf_weights_check import ModelSpec, compare, index_problems, model_spec, weights_report

if TYPE_CHECKING:
    import transformers

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
    #: Build the config's ``AutoModelForCausalLM`` (a decoder); False: its ``AutoModel`` (an encoder such as BERT).
    causal: bool = True
    _spec: ModelSpec | None = field(default=None, init=False, repr=False, compare=False)

    def __repr__(self) -> str:  # the config and tokenizer print dozens of lines each
        return (f"HFCheckpoint({str(self.path)!r}, model_type={self.model_type!r}, files={len(self.files)}, "
                f"tokenizer={type(self.tokenizer).__name__ if self.tokenizer is not None else None})")

    @property
    def model_type(self) -> str:
        return str(self.config.model_type)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model is built in by default: the config's ``dtype``, or float32 if it has none."""
        return config_dtype(self.config) or torch.float32

    def build_on_meta(self, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """The config's ``AutoModelForCausalLM`` (``AutoModel`` when not :attr:`causal`) on the meta device (shapes
        only), in eval mode, SDPA attention.

        Built under :func:`torch_ir.build_on_meta` rather than a bare ``torch.device("meta")``, so the values of
        small buffers made in ``__init__`` (rotary ``inv_freq``) stay known: extraction records how to rebuild
        them, and :meth:`build_with_weights` fills them in. ``dtype`` defaults to :attr:`dtype`.
        """
        from transformers import AutoModel, AutoModelForCausalLM

        dtype = self.dtype if dtype is None else _float_dtype(dtype)
        auto = AutoModelForCausalLM if self.causal else AutoModel
        # from_config writes the dtype and the attention implementation into the config it is given.
        config = copy.deepcopy(self.config)
        try:
            with recording_meta_device():
                model = auto.from_config(config, dtype=dtype, attn_implementation="sdpa", trust_remote_code=False)
        except Exception as e:  # the config's values are the file's; any failure to build is its fault
            raise CheckpointError(
                f"checkpoint {self.path}: transformers cannot build {self.model_type!r} from {CONFIG} "
                f"({type(e).__name__}: {e}); fix its sizes (positive, hidden_size a multiple of num_attention_heads, "
                f"num_attention_heads of num_key_value_heads), or use the {CONFIG} saved with the weights"
            ) from None
        return model.eval()

    def build_with_weights(self, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """The model with the checkpoint's weights, on the CPU: a reference to compare a compiled model with.

        Equal to ``AutoModelForCausalLM.from_pretrained(path, dtype=dtype)`` (``AutoModel``'s when not
        :attr:`causal`; SDPA attention), without reading
        any file that method would and this loader refuses. The weights are cast to the model's dtype as
        ``from_pretrained`` casts them; non-persistent buffers get the values they were built with.
        """
        model = self.build_on_meta(dtype)
        target = self.dtype if dtype is None else dtype
        state = self.state_dict(target)
        result = model.load_state_dict(state, strict=False, assign=True)
        # Only possible with check_weights=False: the full check would have refused these files.
        if result.missing_keys or result.unexpected_keys:
            raise CheckpointWeightsError(weights_report(
                self.path, self.config,
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
            with opened(file, self.path) as handle:
                for key in handle.keys():
                    name = spec.model_key(key)
                    if name not in spec.shapes and spec.ignored(key):
                        continue
                    state[name] = read_tensor(handle, key, file, self.path, target)
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
        stored, problems = scan_headers(self.files, self.path)
        spec = self._model_spec()
        problems += compare(stored, spec, self.config)
        problems += index_problems(self.weight_map, stored)
        if problems:
            raise CheckpointWeightsError(weights_report(self.path, self.config, problems))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, through the checkpoint's tokenizer (special tokens as the tokenizer adds them,
        e.g. Llama's BOS). A tokenizer that fails or takes over ``max_tokenizer_seconds`` is a CheckpointError."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        tokenizer = self._tokenizer()
        ids = tokenizer_call(self.path, f"used to encode a text of {len(text)} characters",
                             lambda: tokenizer.encode(text, add_special_tokens=add_special_tokens))
        return [int(i) for i in ids]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """The text of token ids; special tokens (EOS, padding) are left out unless ``skip_special_tokens=False``."""
        tokenizer, tokens = self._tokenizer(), [int(i) for i in ids]
        return str(tokenizer_call(self.path, f"used to decode {len(tokens)} tokens",
                                  lambda: tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)))

    @property
    def eos_token_ids(self) -> set[int]:
        """Ids that end generation: ``generation_config.json``'s ``eos_token_id`` (what ``generate`` uses; chat
        models list several there), else ``config.json``'s, else the tokenizer's EOS; empty when none has one."""
        if self.generation_eos is not None:
            return set(self.generation_eos)
        ids = token_ids(getattr(self.config, "eos_token_id", None))
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

    def _model_spec(self) -> ModelSpec:
        if self._spec is None:
            self._spec = model_spec(self.build_on_meta(), f"checkpoint {self.path}")
        return self._spec


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
    config = load_config(root)
    files, weight_map = weight_files(root)
    checkpoint = HFCheckpoint(root, config, files, weight_map=weight_map, generation_eos=read_generation_eos(root))
    if check_weights:
        checkpoint.check_weights()
    checkpoint.tokenizer = load_tokenizer(root, config)
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


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype {dtype!r}: pass a floating torch dtype such as torch.bfloat16")
    return dtype


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
