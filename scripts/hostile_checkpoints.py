"""Hostile corpus, second pass: Hugging Face checkpoint directories (``torch-ir generate DIR``).

Each case is a directory made from one tiny valid llama checkpoint (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``) with one thing broken, as the probe of issue 25 found them:

* a file that is not a regular file: a FIFO named ``config.json``, ``generation_config.json``,
  ``tokenizer_config.json``, ``special_tokens_map.json`` (which only transformers reads), the shard index or a
  shard blocked forever; a link to ``/dev/zero`` named ``tokenizer.json`` or ``model.safetensors`` read gigabytes;
* model sizes that cost minutes and gigabytes to build from a 700-byte config (``num_hidden_layers: 100000``,
  also under GPT-2's name ``n_layer``), sizes that are not positive integers, widths over the limits;
* ``NaN`` and ``Infinity`` hyper-parameters (Python's JSON reads them), and a negative norm epsilon: generation
  emitted token 0 as if it were the model's answer;
* a ``tokenizer.json`` whose pre-tokenizer regex backtracks catastrophically (``(a+)+$``): a text with one long
  run of ``a`` made the Rust library panic (a ``BaseException``: its traceback escaped the command line's
  handler), a text of many short runs took minutes; a decoder regex, which could not be bounded at all.

Every case is refused with one ``TorchIRError`` naming the file and the field; the ones that could block run
isolated (a forked child with a timeout).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from make_hostile_corpus import Case, CliCall, _Builder

BASE = "ck_base"
PROMPT_IDS = ["--prompt-ids", "1,2", "--max-new-tokens", "2"]
#: A run of ``a`` long enough that ``(a+)+$`` passes Oniguruma's 10^7 backtracking steps at the first position:
#: the Rust library panics within a fraction of a second.
PANIC_PROMPT = "a" * 64 + "!"
#: Many runs each just short of that limit: every start position costs up to 2^21 steps (46 s for 22 KB).
SLOW_PROMPT = ("a" * 21 + "!") * 1000
#: The deadline the encode cases run under (``max_tokenizer_seconds``), so the slow one ends in seconds.
ENCODE_SECONDS = 3

CONFIG: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 16,
    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "dtype": "float32",
}
TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                    "unk_token": "<unk>"}


def _load(case: Case, d: Path) -> None:
    from torch_ir.frontends.hf_checkpoint import load_checkpoint

    load_checkpoint(d / case.file)


def _encode(case: Case, d: Path) -> None:
    """Load the checkpoint and encode the text of ``case.files[1]`` under a short tokenizer deadline."""
    from torch_ir.frontends.hf_checkpoint import load_checkpoint
    from torch_ir.limits import limits

    text = (d / case.files[1]).read_text(encoding="utf-8")
    with limits(max_tokenizer_seconds=ENCODE_SECONDS):
        load_checkpoint(d / case.file).encode(text)


#: API kinds of this family's cases: name -> call(case, corpus_dir).
API: dict[str, Callable[[Case, Path], None]] = {"checkpoints.load": _load, "checkpoints.encode": _encode}


# -- the valid checkpoint every case starts from -----------------------------------------------------------

def _write_base(directory: Path) -> None:
    """A tiny llama checkpoint: seeded random weights, a word-level tokenizer of 32 tokens."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(CONFIG, indent=1))
    words = ["<unk>", "<s>", "</s>", "a", "!", *"bcdefghijklmnopqrstuvwxyz", "hello", "world"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))


def _checkpoint(b: _Builder, name: str) -> Path:
    """A fresh copy of the base checkpoint as ``name`` (replacing a copy left by an earlier build)."""
    directory = b.path(name)
    if directory.exists() or directory.is_symlink():
        shutil.rmtree(directory)
    shutil.copytree(b.path(BASE), directory, symlinks=True)
    return directory


def _edit_json(path: Path, text: str) -> None:
    """Add ``text`` (raw JSON members, which may spell NaN or Infinity) at the end of the object in ``path``."""
    body = json.loads(path.read_text())
    path.write_text(json.dumps(body)[:-1] + ", " + text + "}")


def _replace_with(path: Path, kind: str) -> None:
    """``path`` becomes a FIFO or a symbolic link to /dev/zero."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def _generate(name: str, *extra: str) -> list[CliCall]:
    return [CliCall(["generate", "{dir}/" + name, *(extra or PROMPT_IDS)], 2)]


# -- the cases --------------------------------------------------------------------------------------------

def _not_regular_files(b: _Builder) -> None:
    if os.name != "posix":  # FIFOs and /dev/zero
        return

    def case(cid: str, file: str, kind: str, description: str, *, sharded: bool = False) -> None:
        directory = _checkpoint(b, cid)
        if sharded:  # the weights as one shard listed by an index
            shard = "model-00001-of-00001.safetensors"
            (directory / "model.safetensors").rename(directory / shard)
            from safetensors import safe_open

            with safe_open(str(directory / shard), framework="pt") as handle:
                weight_map = {key: shard for key in handle.keys()}
            (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        _replace_with(directory / file, kind)
        what = "named pipe" if kind == "fifo" else "character device"
        b.add(Case(cid, "checkpoint_files", description, [cid], "checkpoints.load", "CheckpointError",
                   rf"{file}.*{what}", _generate(cid), isolate=True, big_alloc=kind == "zero"))

    case("ck_fifo_config", "config.json", "fifo", "config.json is a FIFO")
    case("ck_fifo_generation_config", "generation_config.json", "fifo", "generation_config.json is a FIFO")
    case("ck_fifo_tokenizer_config", "tokenizer_config.json", "fifo", "tokenizer_config.json is a FIFO")
    case("ck_fifo_special_tokens_map", "special_tokens_map.json", "fifo",
         "special_tokens_map.json, which only transformers' AutoTokenizer opens, is a FIFO")
    case("ck_fifo_index", "model.safetensors.index.json", "fifo", "the shard index is a FIFO", sharded=True)
    case("ck_fifo_shard", "model-00001-of-00001.safetensors", "fifo", "the shard the index lists is a FIFO",
         sharded=True)
    case("ck_zero_tokenizer", "tokenizer.json", "zero", "tokenizer.json is a link to /dev/zero")
    case("ck_zero_weights", "model.safetensors", "zero", "model.safetensors is a link to /dev/zero")


def _sizes(b: _Builder) -> None:
    def case(cid: str, members: str, error: str, message: str, description: str) -> None:
        directory = _checkpoint(b, cid)
        _edit_json(directory / "config.json", members)
        b.add(Case(cid, "checkpoint_sizes", description, [cid], "checkpoints.load", error, message, _generate(cid),
                   big_alloc=True))

    case("ck_layers_100000", '"num_hidden_layers": 100000', "LimitExceededError", r"num_hidden_layers.*max_layers",
         "a 700-byte config of 100,000 layers (minutes and gigabytes to build on the meta device)")
    case("ck_gpt2_n_layer", '"model_type": "gpt2", "n_layer": 100000, "n_embd": 16, "n_head": 2',
         "LimitExceededError", r"n_layer.*max_layers", "GPT-2's name for the layer count, n_layer: 100000")
    case("ck_heads_zero", '"num_attention_heads": 0', "CheckpointError", r"num_attention_heads.*positive integer",
         "zero attention heads")
    case("ck_intermediate_huge", '"intermediate_size": 1125899906842624', "LimitExceededError",
         r"intermediate_size.*max_dim", "an MLP width of 2^50")


def _numbers(b: _Builder) -> None:
    def case(cid: str, members: str, message: str, description: str, file: str = "config.json") -> None:
        directory = _checkpoint(b, cid)
        if not (directory / file).exists():
            (directory / file).write_text(json.dumps({"eos_token_id": CONFIG["eos_token_id"]}))
        _edit_json(directory / file, members)
        b.add(Case(cid, "checkpoint_numbers", description, [cid], "checkpoints.load", "CheckpointError", message,
                   _generate(cid)))

    case("ck_nan_rms_norm_eps", '"rms_norm_eps": NaN', r"rms_norm_eps is NaN",
         "rms_norm_eps NaN: generation emitted token 0")
    case("ck_inf_rope_theta", '"rope_theta": Infinity', r"rope_theta is Infinity", "rope_theta Infinity")
    case("ck_nan_rope_scaling_factor", '"rope_scaling": {"rope_type": "linear", "factor": NaN}',
         r"rope_scaling\.factor is NaN", "a NaN inside rope_scaling")
    case("ck_overflow_initializer_range", '"initializer_range": 1e999', r"initializer_range is Infinity",
         "1e999, which JSON reads as infinity")
    case("ck_negative_rms_norm_eps", '"rms_norm_eps": -1.0', r"rms_norm_eps.*negative",
         "a negative norm epsilon (NaN wherever the variance is below 1)")
    case("ck_nan_generation_config", '"temperature": NaN', r"generation_config\.json.*temperature is NaN",
         "a NaN in generation_config.json", file="generation_config.json")


def _tokenizers(b: _Builder) -> None:
    def hostile_tokenizer(cid: str, part: str, value: dict[str, Any]) -> Path:
        directory = _checkpoint(b, cid)
        doc = json.loads((directory / "tokenizer.json").read_text())
        doc[part] = value
        (directory / "tokenizer.json").write_text(json.dumps(doc))
        return directory

    split = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    directory = hostile_tokenizer("ck_tokenizer_regex", "pre_tokenizer", split)
    (directory / "panic_prompt.txt").write_text(PANIC_PROMPT)
    (directory / "slow_prompt.txt").write_text(SLOW_PROMPT)
    b.add(Case("ck_tokenizer_regex_panic", "checkpoint_tokenizer",
               "(a+)+$ over a long run of a: the Rust library panics (a BaseException)",
               ["ck_tokenizer_regex", "ck_tokenizer_regex/panic_prompt.txt"], "checkpoints.encode", "CheckpointError",
               r"tokenizer\.json cannot be used to encode.*PanicException",
               _generate("ck_tokenizer_regex", "--prompt", PANIC_PROMPT, "--max-new-tokens", "1",
                         "--max-cache-len", "16", "--chunk", "4"), isolate=True))
    b.add(Case("ck_tokenizer_regex_slow", "checkpoint_tokenizer",
               "(a+)+$ over 1,000 runs just short of the engine's limit: minutes without a deadline",
               ["ck_tokenizer_regex", "ck_tokenizer_regex/slow_prompt.txt"], "checkpoints.encode", "CheckpointError",
               rf"tokenizer\.json could not be used to encode .* within {ENCODE_SECONDS} s.*max_tokenizer_seconds",
               [], isolate=True))
    replace = {"type": "Replace", "pattern": {"Regex": "(a+)+$"}, "content": "b"}
    hostile_tokenizer("ck_tokenizer_decoder_regex", "decoder", replace)
    b.add(Case("ck_tokenizer_decoder_regex", "checkpoint_tokenizer",
               "a decoder regex: decoding holds the GIL, so it could not be bounded", ["ck_tokenizer_decoder_regex"],
               "checkpoints.load", "CheckpointError", r"decoder\.pattern\.Regex.*regular expression",
               _generate("ck_tokenizer_decoder_regex")))


def build(b: _Builder) -> None:
    """Add this family's cases to ``b``."""
    _write_base(b.path(BASE))
    _not_regular_files(b)
    _sizes(b)
    _numbers(b)
    _tokenizers(b)
