"""A local Hugging Face model, encoder or decoder, as every command takes one: a checkpoint directory (with or
without weights) or its ``config.json`` alone (weight-free).

    model = open_hf_model("./minilm_hf")                 # config.json, and model.safetensors when it is there
    model = open_hf_model("./Llama-3-8B/config.json")    # the config alone: no other file is read
    meta = model.build("meta")                           # for extraction: no memory for the weights
    kwargs = model.example_kwargs()                      # input_ids (and attention_mask for an encoder)
    real = model.build("cpu")                            # the checkpoint's weights, or seeded random ones

A model type with an ``AutoModelForCausalLM`` class (Llama, Qwen2, GPT-2, ...) is built as that class (a decoder:
logits), any other text model as its ``AutoModel`` (an encoder such as BERT: hidden states). The directory is
untrusted data and is checked as :func:`.hf_checkpoint.load_checkpoint` checks it: the config by :mod:`.hf_config`
(model types through transformers' own table, no custom code, sizes within ``torch_ir.limits``, numbers finite),
the weights' headers against the config's model before any weight is read. Weight files are opened by
``build("cpu")`` only, so the commands that need no weights (extract, normalize, compile, partition, cost) never
open them. A model without weights (``config.json`` named alone, or a directory holding no weight file) gets seeded
random weights when a command needs values (verify, bisect, demo), with a warning that says so.
"""

from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .hf_checkpoint import HFCheckpoint, _checkpoint_dir, is_checkpoint_dir
from .hf_config import is_causal_lm, load_config
from .hf_files import CONFIG, CheckpointError
from .hf_weights import weight_files

#: Tokens in the example inputs (fewer when the config's position table is shorter): enough for attention to
#: have a sequence dimension worth the name, few enough that verifying a large model stays quick.
EXAMPLE_TOKENS = 16
#: Seed of the example token ids and of the random weights of a model without weights.
SEED = 0
#: File names that hold weights: a directory with none of them is a config-only model (weight-free).
_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".pt", ".pth", ".ckpt")


def is_hf_model_path(source: str | os.PathLike) -> bool:
    """Whether a command's model argument names a local Hugging Face model: a directory holding ``config.json``,
    or a file named ``config.json`` (told from the name: it is read, and checked, only when the model is opened)."""
    try:
        path = Path(source)
        return is_checkpoint_dir(path) or (path.name == CONFIG and os.path.lexists(path))
    except (OSError, TypeError, ValueError):
        return False


@dataclass(repr=False)
class HFModel:
    """A Hugging Face model opened by :func:`open_hf_model`: how to build it and the inputs it is exported with."""

    checkpoint: HFCheckpoint
    #: The directory's name: the model name recorded in the IR and the program.
    name: str
    #: ``config.json`` was named alone: weight-free even when weight files lie beside it.
    config_only: bool = False

    def __repr__(self) -> str:
        return f"HFModel({self.name!r}, {self.checkpoint!r}, weights={self.has_weights})"

    @property
    def has_weights(self) -> bool:
        return bool(self.checkpoint.files)

    @property
    def weights_text(self) -> str:
        """Which weights ``build("cpu")`` gives, as reports say it."""
        if self.has_weights:
            files = ", ".join(str(f) for f in self.checkpoint.files[:3])
            more = f" and {len(self.checkpoint.files) - 3} more" if len(self.checkpoint.files) > 3 else ""
            return f"the checkpoint's weights ({files}{more})"
        why = f"{CONFIG} alone was given" if self.config_only else f"{self.checkpoint.path} holds no weight file"
        return f"seeded random weights (seed {SEED}): {why}"

    def build(self, device: str | torch.device = "meta") -> torch.nn.Module:
        """The model in eval mode: on ``meta`` shapes only (no file but ``config.json`` is read); on the CPU with
        the checkpoint's weights (their headers checked against the config first), or seeded random ones."""
        if torch.device(device).type == "meta":
            return self.checkpoint.build_on_meta()
        if self.has_weights:
            self.checkpoint.check_weights()
            return self.checkpoint.build_with_weights().to(device)
        warnings.warn(f"{self.name}: {self.weights_text}; the numbers checked are the model's with these "
                      "weights, not with the trained ones (give the checkpoint directory to use its weights)",
                      UserWarning, stacklevel=2)
        return self._build_seeded().to(device)

    def example_kwargs(self) -> dict[str, torch.Tensor]:
        """Seeded token ids ``[1, n]`` below the config's vocabulary size (``n`` = :data:`EXAMPLE_TOKENS`, or the
        position table's length if shorter); an encoder also gets an ``attention_mask`` whose last quarter is
        padding, so that the mask matters when the IR is checked against the model."""
        forward = _forward_parameters(self.checkpoint)
        vocab, tokens = _text_sizes(self.checkpoint, forward)
        generator = torch.Generator().manual_seed(SEED)
        kwargs = {"input_ids": torch.randint(0, vocab, (1, tokens), generator=generator)}
        if not self.checkpoint.causal and "attention_mask" in forward:
            mask = torch.ones(1, tokens, dtype=torch.long)
            mask[:, tokens - tokens // 4:] = 0
            kwargs["attention_mask"] = mask
        return kwargs

    def _build_seeded(self) -> torch.nn.Module:
        from transformers import AutoModel, AutoModelForCausalLM

        auto = AutoModelForCausalLM if self.checkpoint.causal else AutoModel
        config = copy.deepcopy(self.checkpoint.config)
        with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
            torch.manual_seed(SEED)
            model = auto.from_config(config, dtype=self.checkpoint.dtype, attn_implementation="sdpa",
                                     trust_remote_code=False)
        return model.eval().requires_grad_(False)


def open_hf_model(path: str | os.PathLike) -> HFModel:
    """Open a local Hugging Face model: a checkpoint directory, or its ``config.json`` alone (weight-free).

    Reads and checks ``config.json`` only (see the module's docstring), and finds the weight files without opening
    them: ``model.safetensors`` or the shards of ``model.safetensors.index.json`` (pickled ``pytorch_model.bin``
    weights are refused with the command that converts them). Every refusal is a ``CheckpointError`` naming the
    file and the fix. The model computes without a KV cache (``use_cache=False``: torch.export cannot return
    transformers' ``DynamicCache``); ``torch-ir generate`` is the path for a decoder with one.
    """
    given = Path(path)
    config_only = given.name == CONFIG and not given.is_dir()
    root = _checkpoint_dir(given.parent if config_only else given)
    config = load_config(root, causal=False)
    where = f"checkpoint {root}: {CONFIG} (model_type {config.model_type!r})"
    if getattr(config, "is_encoder_decoder", False):
        raise CheckpointError(
            f"{where} describes an encoder-decoder model, whose decoder inputs this loader does not make; export "
            "it with a package.module:factory spec that returns (model, args, kwargs)")
    config.use_cache = False
    files, weight_map = ([], None) if config_only or not _holds_weights(root) else weight_files(root)
    causal = is_causal_lm(config.model_type, getattr(config, "is_decoder", False) is True)
    checkpoint = HFCheckpoint(root, config, files, weight_map=weight_map, causal=causal)
    return HFModel(checkpoint, Path(os.path.abspath(root)).name or "model", config_only)


def _holds_weights(root: Path) -> bool:
    """Whether the directory has a weight file of any format: when it has one, it must be one this loader reads
    (``weight_files`` refuses a pickle with the conversion command) rather than be silently replaced by random
    weights."""
    try:
        return any(entry.name.endswith(_WEIGHT_SUFFIXES) for entry in os.scandir(root))
    except OSError as e:
        raise CheckpointError(f"checkpoint {root}: cannot list the directory ({e.strerror or e})") from None


def _forward_parameters(checkpoint: HFCheckpoint) -> set[str]:
    """The argument names of the model class's ``forward``, taken from transformers' table (nothing is built)."""
    import inspect

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING

    table = MODEL_FOR_CAUSAL_LM_MAPPING if checkpoint.causal else MODEL_MAPPING
    return set(inspect.signature(table[type(checkpoint.config)].forward).parameters)


def _text_sizes(checkpoint: HFCheckpoint, forward: set[str]) -> tuple[int, int]:
    """(vocabulary size, example length) from the config, whose sizes ``load_config`` checked against the limits;
    a model that takes no token ids is refused (its inputs are images or audio this loader does not make)."""
    config = checkpoint.config.get_text_config(decoder=True)
    vocab = getattr(config, "vocab_size", None)
    if "input_ids" not in forward or not isinstance(vocab, int) or vocab < 1:
        raise CheckpointError(
            f"checkpoint {checkpoint.path}: {CONFIG} (model_type {checkpoint.model_type!r}) does not describe a text "
            "model taking input_ids with a vocab_size, so its example inputs cannot be made from the config; export "
            "it with a package.module:factory spec that returns (model, args, kwargs)")
    positions = [getattr(config, name, None) for name in ("max_position_embeddings", "n_positions")]
    limit = min((p for p in positions if isinstance(p, int) and p > 0), default=EXAMPLE_TOKENS)
    return vocab, min(EXAMPLE_TOKENS, limit)

