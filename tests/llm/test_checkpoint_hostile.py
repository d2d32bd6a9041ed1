"""Hostile Hugging Face checkpoint directories (issue 25): each is refused with one error naming the file and the
field, in milliseconds or seconds, never a hang, a traceback, gigabytes read or a silently wrong model.

* files that are not regular files (FIFOs, links to /dev/zero), under every name we or a library open;
* model sizes over the limits or not positive integers, under transformers' canonical names and their aliases;
* NaN and infinite hyper-parameters anywhere in ``config.json`` and ``generation_config.json``;
* tokenizers whose regexes backtrack catastrophically: a Rust panic or a deadline, one error either way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from npu_tools.cli import main
from tests.hang_guard import no_hang
from tests.llm.checkpoints import make_checkpoint
from torch_ir.errors import LimitExceededError, TorchIRError
from torch_ir.frontends.hf_checkpoint import (
    CheckpointError,
    CheckpointNotFoundError,
    is_checkpoint_dir,
    load_checkpoint,
)
from torch_ir.limits import get_limits, limits

ROOT = Path(__file__).resolve().parents[2]
PANIC_TEXT = "a" * 64 + "!"  # (a+)+$ passes Oniguruma's 10^7 steps at once: the library panics
SLOW_TEXT = ("a" * 21 + "!") * 120  # 120 runs just under that limit: about 6 s without a deadline


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("llama") / "ckpt", "llama")


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("sharded") / "ckpt", "llama", shards=2)


@pytest.fixture
def copy(llama_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(llama_dir, tmp_path / "ckpt"))


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``, failing the test (not hanging it) when it does not return in time: a FIFO blocks forever."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = e

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s (blocked?)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def refused(directory: Path, error: type[Exception], *fragments: str, seconds: float = 60) -> str:
    with pytest.raises(error) as info:
        within(seconds, lambda: load_checkpoint(directory))
    message = str(info.value)
    assert isinstance(info.value, TorchIRError), type(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    return message


def add_members(path: Path, members: str) -> None:
    """Add raw JSON members (NaN and Infinity spelled as Python's JSON reads them) to the object in ``path``."""
    path.write_text(json.dumps(json.loads(path.read_text()))[:-1] + ", " + members + "}")


def plant(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


# -- files that are not regular files ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "zero"])
@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json", "added_tokens.json", "model.safetensors"])
def test_a_file_that_is_not_regular_is_refused_by_name(copy: Path, name: str, kind: str) -> None:
    plant(copy / name, kind)
    refused(copy, CheckpointError, name, "not a regular file",
            "named pipe" if kind == "fifo" else "/dev/zero", seconds=30)


@pytest.mark.parametrize("target", ["index", "shard"])
def test_a_fifo_index_or_shard_is_refused(sharded_dir: Path, tmp_path: Path, target: str) -> None:
    directory = Path(shutil.copytree(sharded_dir, tmp_path / "ckpt"))
    index = directory / "model.safetensors.index.json"
    name = index.name if target == "index" else sorted(json.loads(index.read_text())["weight_map"].values())[0]
    plant(directory / name, "fifo")
    refused(directory, CheckpointError, name, "named pipe", seconds=30)


def test_files_transformers_would_open_by_itself_are_never_opened(copy: Path) -> None:
    """The tokenizer is made from private copies: FIFOs under the other names AutoTokenizer looks for do not
    block it, and the tokenizer is the checkpoint's."""
    expected = load_checkpoint(copy).encode("hello world")
    for name in ("vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
                 "preprocessor_config.json"):
        plant(copy / name, "fifo")
    checkpoint = within(60, lambda: load_checkpoint(copy))
    assert checkpoint.encode("hello world") == expected
    assert checkpoint.tokenizer.name_or_path == str(copy)


def test_a_weights_file_larger_than_one_allocation_still_loads(copy: Path) -> None:
    """A safetensors file is mapped, never read whole: only each tensor must fit max_alloc_bytes."""
    assert (copy / "model.safetensors").stat().st_size > 200_000
    with limits(max_alloc_bytes=200_000):
        assert load_checkpoint(copy).state_dict()


def test_a_directory_whose_config_is_a_fifo_is_a_checkpoint_to_refuse(copy: Path, capsys) -> None:
    plant(copy / "config.json", "fifo")
    assert is_checkpoint_dir(copy)
    assert within(30, lambda: main(["generate", str(copy), "--prompt-ids", "1,2", "--max-new-tokens", "2"])) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("torch-ir generate: error:") and "named pipe" in err[0], err


# -- model sizes --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("members", "error", "fragments"), [
    ('"num_hidden_layers": 100000', LimitExceededError, ["num_hidden_layers is 100000", "max_layers",
                                                          "TORCH_IR_MAX_LAYERS"]),
    ('"num_hidden_layers": true', CheckpointError, ["num_hidden_layers is true", "positive integer"]),
    ('"num_hidden_layers": 2.0', CheckpointError, ["num_hidden_layers is 2.0", "positive integer"]),
    ('"num_hidden_layers": "2"', CheckpointError, ["num_hidden_layers is \"2\"", "positive integer"]),
    ('"num_hidden_layers": 0', CheckpointError, ["num_hidden_layers is 0", "positive integer"]),
    ('"num_attention_heads": -4', CheckpointError, ["num_attention_heads is -4"]),
    ('"num_key_value_heads": {"a": 1}', CheckpointError, ["num_key_value_heads is {"]),
    ('"hidden_size": 1125899906842624', LimitExceededError, ["hidden_size", "max_dim"]),
    ('"vocab_size": 1e20', CheckpointError, ["vocab_size is 1e+20"]),
    ('"intermediate_size": [128, 0]', CheckpointError, ["intermediate_size[1] is 0"]),
    ('"head_dim": 1099511627777', LimitExceededError, ["head_dim", "max_dim"]),
    ('"max_position_embeddings": 1099511627777', LimitExceededError, ["max_position_embeddings"]),
    ('"num_local_experts": 100000', LimitExceededError, ["num_local_experts", "max_experts"]),
    ('"text_config": {"num_hidden_layers": 100000}', LimitExceededError, ["text_config.num_hidden_layers"]),
    ('"model_type": "gpt2", "n_layer": 100000', LimitExceededError, ["n_layer is 100000", "'gpt2'"]),
    ('"model_type": "gpt2", "n_embd": -1', CheckpointError, ["n_embd is -1"]),
])
def test_model_sizes_are_checked_before_anything_is_built(copy: Path, members: str, error: type[Exception],
                                                          fragments: list[str]) -> None:
    load_checkpoint(copy)  # transformers imported and warm: what is timed is the check
    add_members(copy / "config.json", members)
    with no_hang(1, "test_model_sizes_are_checked_before_anything_is_built"):
        refused(copy, error, "config.json", *fragments)


@pytest.mark.slow
def test_the_layer_limit_can_be_raised(copy: Path) -> None:
    add_members(copy / "config.json", '"num_hidden_layers": 2000')
    refused(copy, LimitExceededError, "num_hidden_layers is 2000")
    with limits(max_layers=4096):  # passes the limit, then the weights (2 layers) do not match
        refused(copy, CheckpointError, "num_hidden_layers=2000", "model.layers.2.self_attn.q_proj.weight is missing")


def test_limits_come_from_the_environment() -> None:
    code = "from torch_ir.limits import get_limits; l = get_limits(); print(l.max_layers, l.max_experts, " \
           "l.max_tokenizer_seconds)"
    env = {**os.environ, "TORCH_IR_MAX_LAYERS": "2048", "TORCH_IR_MAX_EXPERTS": "64",
           "TORCH_IR_MAX_TOKENIZER_SECONDS": "5", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2048", "64", "5"], out.stderr[-2000:]
    defaults = get_limits()
    assert (defaults.max_layers, defaults.max_experts) == (1024, 1024)


# Published configs (their sizes; other fields left to transformers' defaults): within the default limits.
REAL_CONFIGS = {
    "llama-3.1-405b": {"model_type": "llama", "hidden_size": 16384, "intermediate_size": 53248,
                       "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8,
                       "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
                       "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                                                                "high_freq_factor": 4.0,
                                                                "original_max_position_embeddings": 8192,
                                                                "rope_type": "llama3"}},
    "qwen2.5-72b": {"model_type": "qwen2", "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 152064,
                    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                    "sliding_window": 131072, "max_window_layers": 70},
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
                   "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
                   "sliding_window": None, "head_dim": 128},
    "mixtral-8x22b": {"model_type": "mixtral", "hidden_size": 6144, "intermediate_size": 16384,
                      "num_hidden_layers": 56, "num_attention_heads": 48, "num_key_value_heads": 8,
                      "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32768,
                      "max_position_embeddings": 65536, "rope_theta": 1000000.0},
    "deepseek-v3": {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                    "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "vocab_size": 129280, "max_position_embeddings": 163840,
                    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                     "type": "yarn"}},
    "gpt2-xl": {"model_type": "gpt2", "n_embd": 1600, "n_head": 25, "n_layer": 48, "n_positions": 1024,
                "n_ctx": 1024, "vocab_size": 50257, "n_inner": None, "layer_norm_epsilon": 1e-05},
}


@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_published_models_are_within_the_default_limits(tmp_path: Path, name: str) -> None:
    """Their configs pass every check: what stops them here is the missing weights."""
    (tmp_path / "config.json").write_text(json.dumps(REAL_CONFIGS[name]))
    refused(tmp_path, CheckpointNotFoundError, "no weights")


# -- numbers ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("members", "fragments"), [
    ('"rms_norm_eps": NaN', ["rms_norm_eps is NaN", "finite"]),
    ('"rope_theta": Infinity', ["rope_theta is Infinity"]),
    ('"rope_parameters": {"rope_type": "default", "rope_theta": -Infinity}', ["rope_parameters.rope_theta is -Inf"]),
    ('"rope_scaling": {"rope_type": "linear", "factor": NaN}', ["rope_scaling.factor is NaN"]),
    ('"rope_scaling": {"rope_type": "longrope", "long_factor": [1.0, NaN]}', ["rope_scaling.long_factor[1] is NaN"]),
    ('"initializer_range": 1e999', ["initializer_range is Infinity"]),
    ('"rope_theta": 1' + "0" * 400, ["rope_theta is 1000", "...; a model hyper-parameter must be a finite number"]),
    ('"attention_dropout": NaN', ["attention_dropout is NaN"]),
    ('"rms_norm_eps": -1e-06', ["rms_norm_eps is -1e-06", "must not be negative"]),
    ('"rope_theta": 0', ["rope_theta is 0", "must be positive"]),
])
def test_non_finite_hyper_parameters_are_refused_by_name(copy: Path, members: str, fragments: list[str]) -> None:
    add_members(copy / "config.json", members)
    refused(copy, CheckpointError, "config.json", *fragments)


def test_non_finite_generation_config_is_refused(copy: Path) -> None:
    add_members(copy / "generation_config.json", '"temperature": NaN')
    refused(copy, CheckpointError, "generation_config.json", "temperature is NaN")


def test_nan_rms_norm_eps_no_longer_generates_token_0(copy: Path, capsys) -> None:
    add_members(copy / "config.json", '"rms_norm_eps": NaN')
    assert main(["generate", str(copy), "--prompt-ids", "1,2", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "rms_norm_eps is NaN" in err[0], err


# -- the tokenizer ------------------------------------------------------------------------------------------

def hostile_tokenizer(directory: Path, part: str, value: dict[str, Any]) -> Path:
    doc = json.loads((directory / "tokenizer.json").read_text())
    doc[part] = value
    (directory / "tokenizer.json").write_text(json.dumps(doc))
    return directory


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
CATASTROPHIC_SPLIT = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}, BYTE_LEVEL]}


@pytest.fixture
def catastrophic(copy: Path) -> Path:
    return hostile_tokenizer(copy, "pre_tokenizer", CATASTROPHIC_SPLIT)


def test_a_tokenizer_panic_is_one_error_and_prints_nothing(catastrophic: Path, capfd) -> None:
    checkpoint = load_checkpoint(catastrophic)
    assert checkpoint.encode("hello") == load_checkpoint(catastrophic).encode("hello")  # ordinary text is fine
    capfd.readouterr()
    with pytest.raises(CheckpointError) as info:
        within(30, lambda: checkpoint.encode(PANIC_TEXT))
    message = str(info.value)
    assert "tokenizer.json cannot be used to encode a text of 65 characters" in message
    assert "PanicException" in message and str(catastrophic) in message
    err = capfd.readouterr().err
    assert "panicked" not in err and "Onig" not in err, err  # the Rust panic hook's output is held and dropped


def test_a_slow_regex_is_abandoned_at_the_deadline(catastrophic: Path) -> None:
    checkpoint = load_checkpoint(catastrophic)
    with no_hang(3, "test_a_slow_regex_is_abandoned_at_the_deadline"):
        with limits(max_tokenizer_seconds=1), pytest.raises(CheckpointError) as info:
            checkpoint.encode(SLOW_TEXT)
    assert "within 1 s" in str(info.value) and "TORCH_IR_MAX_TOKENIZER_SECONDS" in str(info.value)


@pytest.mark.slow
def test_a_tokenizer_panic_on_the_command_line(catastrophic: Path, capsys) -> None:
    code = main(["generate", str(catastrophic), "--prompt", PANIC_TEXT, "--max-new-tokens", "1",
                 "--max-cache-len", "16", "--chunk", "4"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("torch-ir generate: error: checkpoint"), err
    assert "tokenizer.json" in err[0] and "PanicException" in err[0]


def test_a_decoder_regex_is_refused(copy: Path) -> None:
    decoder = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"Regex": "(a+)+$"}, "content": "b"},
                                                BYTE_LEVEL]}
    hostile_tokenizer(copy, "decoder", decoder)
    refused(copy, CheckpointError, "tokenizer.json", "decoder.decoders[0].pattern.Regex", "regular expression")


def test_a_decoder_replacing_a_plain_string_loads(copy: Path) -> None:
    decoder = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                BYTE_LEVEL]}
    hostile_tokenizer(copy, "decoder", decoder)
    assert load_checkpoint(copy).decode([5, 6])


def test_a_broken_tokenizer_is_named_by_its_own_path(copy: Path) -> None:
    (copy / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": 3}}')
    message = refused(copy, CheckpointError, "tokenizer.json", "cannot be loaded as a tokenizer")
    assert "torch_ir_tokenizer_" not in message  # the private copy's path is not shown


def test_library_output_of_a_successful_call_is_kept(copy: Path, capfd) -> None:
    from torch_ir.frontends.hf_tokenizer import tokenizer_call

    capfd.readouterr()
    assert tokenizer_call(copy, "used", lambda: os.write(2, b"a library warning\n")) == 18
    assert capfd.readouterr().err == "a library warning\n"
