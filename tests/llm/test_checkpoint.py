"""Loading Hugging Face causal-LM checkpoint directories: real transformers, tiny checkpoints, no mocks.

Good directories load to what ``from_pretrained`` loads (same keys, shapes, dtypes, logits); every bad one is
refused with a message that names the file and the fix.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.llm.checkpoints import EOS_ID, PAD_ID, TOKENIZER_VOCAB, VOCAB_SIZE, make_checkpoint
from torch_ir.errors import LimitExceededError, TorchIRError, UnsafeInputError, WeightsMismatchError
from torch_ir.frontends.hf_checkpoint import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWeightsError,
    UnsafeCheckpointError,
    is_checkpoint_dir,
    load_checkpoint,
)
from torch_ir.limits import limits

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "ünïcödé → 東京 🚀", "  spaces\tand\nlines  "]


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("qwen2") / "ckpt", "qwen2")


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("sharded") / "ckpt", "qwen2", shards=3)


@pytest.fixture
def copy(qwen2_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the qwen2 checkpoint, for a test to break."""
    return Path(shutil.copytree(qwen2_dir, tmp_path / "ckpt"))


@pytest.fixture
def sharded_copy(sharded_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(sharded_dir, tmp_path / "ckpt"))


def edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def rewrite_weights(file: Path, change: Any) -> None:
    """Apply ``change`` to the state dict of one safetensors file and save it back, as save_pretrained would."""
    state = load_file(file)
    change(state)
    save_file(state, file, metadata={"format": "pt"})


def refused(directory: Path, error: type[Exception], *fragments: str, **kwargs: Any) -> str:
    """Load ``directory``, expect ``error`` whose message holds every fragment; returns the message."""
    with pytest.raises(error) as info:
        load_checkpoint(directory, **kwargs)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert isinstance(info.value, TorchIRError)
    return message


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


# -- good directories -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("arch", "shards"), [("qwen2", 1), ("qwen2", 3), ("llama", 1), ("llama", 2), ("mistral", 1)])
def test_loads_and_meta_model_matches_weights(tmp_path: Path, arch: str, shards: int) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", arch, shards=shards)
    checkpoint = load_checkpoint(directory)
    assert checkpoint.model_type == arch and checkpoint.path == directory
    assert len(checkpoint.files) == shards and all(f.suffix == ".safetensors" for f in checkpoint.files)
    assert (checkpoint.weight_map is None) == (shards == 1)
    assert is_checkpoint_dir(directory) and repr(checkpoint).startswith("HFCheckpoint(")

    meta = checkpoint.build_on_meta()
    assert not meta.training and meta.config._attn_implementation == "sdpa"
    meta_state = meta.state_dict()
    assert all(t.is_meta for t in meta_state.values())
    state = checkpoint.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == {k: tuple(v.shape) for k, v in meta_state.items()}
    assert all(not t.is_meta and t.dtype == torch.float32 for t in state.values())
    assert checkpoint.config.dtype == torch.float32  # building models did not write into the loaded config


@pytest.mark.parametrize(("arch", "shards", "tied"), [("qwen2", 1, False), ("llama", 2, True)])
def test_logits_equal_from_pretrained(tmp_path: Path, arch: str, shards: int, tied: bool) -> None:
    from transformers import AutoModelForCausalLM

    directory = make_checkpoint(tmp_path / "ckpt", arch, shards=shards, tie_word_embeddings=tied)
    checkpoint = load_checkpoint(directory)
    ids = checkpoint.encode("The quick brown fox")
    reference = logits(AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval(), ids)

    torch.testing.assert_close(logits(checkpoint.build_with_weights(), ids), reference, rtol=0, atol=0)
    # The state dict alone, loaded into a model built from the config, gives the same numbers.
    model = AutoModelForCausalLM.from_config(checkpoint.config, attn_implementation="sdpa").eval()
    model.load_state_dict(checkpoint.state_dict())
    torch.testing.assert_close(logits(model, ids), reference, rtol=0, atol=0)


def test_sharded_holds_the_same_weights(tmp_path: Path) -> None:
    single = load_checkpoint(make_checkpoint(tmp_path / "one", "llama", seed=3)).state_dict()
    sharded = load_checkpoint(make_checkpoint(tmp_path / "three", "llama", shards=3, seed=3)).state_dict()
    assert single.keys() == sharded.keys()
    assert all(torch.equal(single[k], sharded[k]) for k in single)


def test_bf16_checkpoint_stays_bf16(tmp_path: Path) -> None:
    fp32 = make_checkpoint(tmp_path / "fp32", "qwen2")
    bf16 = make_checkpoint(tmp_path / "bf16", "qwen2", dtype=torch.bfloat16)
    checkpoint = load_checkpoint(bf16)
    state = checkpoint.state_dict()
    assert checkpoint.dtype == torch.bfloat16 and {t.dtype for t in state.values()} == {torch.bfloat16}
    assert next(checkpoint.build_on_meta().parameters()).dtype == torch.bfloat16
    size = lambda d: sum(f.stat().st_size for f in d.glob("*.safetensors"))
    assert size(bf16) < 0.51 * size(fp32)
    assert {t.dtype for t in checkpoint.state_dict(torch.float32).values()} == {torch.float32}
    assert next(checkpoint.build_with_weights(torch.float32).parameters()).dtype == torch.float32


def test_tied_embeddings_filled_in(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", "qwen2", tie_word_embeddings=True)
    with safe_open(directory / "model.safetensors", framework="pt") as f:
        assert "lm_head.weight" not in f.keys()  # save_pretrained stores a tied weight once
    state = load_checkpoint(directory).state_dict()
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]


def test_tokenizer_round_trip_and_eos(qwen2_dir: Path) -> None:
    checkpoint = load_checkpoint(qwen2_dir)
    for text in TEXTS:
        ids = checkpoint.encode(text)
        assert ids and all(0 <= i < VOCAB_SIZE for i in ids)
        assert checkpoint.decode(ids) == text
    assert checkpoint.eos_token_ids == {EOS_ID}
    assert checkpoint.tokenizer.eos_token_id == checkpoint.config.eos_token_id == EOS_ID
    assert checkpoint.tokenizer.pad_token_id == checkpoint.config.pad_token_id == PAD_ID
    assert checkpoint.decode([*checkpoint.encode("hi"), EOS_ID]) == "hi"  # special tokens left out


def test_eos_from_generation_config_then_config(copy: Path) -> None:
    edit_json(copy / "generation_config.json", eos_token_id=[EOS_ID, 7])
    assert load_checkpoint(copy).eos_token_ids == {EOS_ID, 7}
    (copy / "generation_config.json").unlink()
    edit_json(copy / "config.json", eos_token_id=5)
    assert load_checkpoint(copy).eos_token_ids == {5}


def test_without_tokenizer(tmp_path: Path) -> None:
    checkpoint = load_checkpoint(make_checkpoint(tmp_path / "ckpt", "llama", tokenizer=False))
    assert checkpoint.tokenizer is None
    with pytest.raises(CheckpointError, match="no tokenizer.json.*tokenizer_config.json"):
        checkpoint.encode("hello")


def test_bare_model_keys_and_old_rotary_buffers_load(copy: Path) -> None:
    """Keys without the ``model.`` prefix (a bare model's checkpoint) and old per-layer ``inv_freq`` buffers
    load as ``from_pretrained`` loads them."""
    def change(state: dict[str, torch.Tensor]) -> None:
        for key in [k for k in state if k.startswith("model.")]:
            state[key.removeprefix("model.")] = state.pop(key)
        state["layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)

    rewrite_weights(copy / "model.safetensors", change)
    checkpoint = load_checkpoint(copy)
    assert checkpoint.state_dict().keys() == checkpoint.build_on_meta().state_dict().keys()


def test_custom_code_is_never_imported(copy: Path) -> None:
    edit_json(copy / "config.json", auto_map={"AutoModelForCausalLM": "evil_module_xyz.Evil"})
    edit_json(copy / "tokenizer_config.json", auto_map={"AutoTokenizer": ["evil_module_xyz.Tok", None]})
    checkpoint = load_checkpoint(copy)
    assert type(checkpoint.build_on_meta()).__module__.startswith("transformers.")
    assert checkpoint.decode(checkpoint.encode("hello")) == "hello"


def test_is_checkpoint_dir(qwen2_dir: Path, tmp_path: Path) -> None:
    assert is_checkpoint_dir(qwen2_dir) and is_checkpoint_dir(str(qwen2_dir))
    assert not is_checkpoint_dir(qwen2_dir / "config.json")
    assert not is_checkpoint_dir(tmp_path / "missing") and not is_checkpoint_dir(tmp_path)


# -- the directory and config.json ------------------------------------------------------------------------

def test_missing_directory_and_file(qwen2_dir: Path, tmp_path: Path) -> None:
    message = refused(tmp_path / "nope", CheckpointNotFoundError, "does not exist", "config.json")
    assert "nope" in message
    refused(qwen2_dir / "config.json", CheckpointError, "not a directory", str(qwen2_dir))
    with pytest.raises(FileNotFoundError):  # also the builtin class, for callers that catch that
        load_checkpoint(tmp_path / "nope")


def test_no_config(copy: Path) -> None:
    (copy / "config.json").unlink()
    refused(copy, CheckpointNotFoundError, "no config.json", "save_pretrained")


@pytest.mark.parametrize(("text", "fragment"), [("{not json", "not valid JSON"), ("[1, 2]", "not an object"),
                                                ("\xff\xfe", "not valid JSON"), ("{}", "no \"model_type\"")])
def test_bad_config_json(copy: Path, text: str, fragment: str) -> None:
    (copy / "config.json").write_text(text, encoding="latin-1")
    refused(copy, CheckpointError, "config.json", fragment)


def test_unknown_model_type(copy: Path) -> None:
    edit_json(copy / "config.json", model_type="nonsense_lm")
    refused(copy, CheckpointError, "'nonsense_lm'", "does not know", "llama", "mistral", "qwen2")


def test_model_type_that_is_not_a_causal_lm(copy: Path) -> None:
    edit_json(copy / "config.json", model_type="vit")
    refused(copy, CheckpointError, "'vit'", "not a causal language model", "qwen2")


def test_config_values_transformers_refuses(copy: Path) -> None:
    edit_json(copy / "config.json", num_attention_heads=0)
    refused(copy, CheckpointError, "config.json", "qwen2")


def test_quantized_checkpoint(copy: Path) -> None:
    edit_json(copy / "config.json", quantization_config={"quant_method": "gptq", "bits": 4})
    refused(copy, CheckpointError, "quantization_config", "gptq", "unquantized")


# -- weight files -----------------------------------------------------------------------------------------

def test_missing_shard(sharded_copy: Path) -> None:
    (sharded_copy / "model-00002-of-00003.safetensors").unlink()
    refused(sharded_copy, CheckpointNotFoundError, "model-00002-of-00003.safetensors",
            "model.safetensors.index.json", "download")


@pytest.mark.parametrize(("text", "fragment"), [
    ("{\"weight_map\": ", "not valid JSON"),
    ("[]", "not an object"),
    ("{\"metadata\": {}}", "no \"weight_map\""),
    ("{\"weight_map\": {\"model.norm.weight\": 3}}", "not a file name"),
])
def test_malformed_index(sharded_copy: Path, text: str, fragment: str) -> None:
    (sharded_copy / "model.safetensors.index.json").write_text(text)
    refused(sharded_copy, CheckpointError, "model.safetensors.index.json", fragment)


@pytest.mark.parametrize("name", ["../outside.safetensors", "/tmp/outside.safetensors", "sub/x.safetensors", ".."])
def test_index_path_outside_directory(sharded_copy: Path, name: str) -> None:
    (sharded_copy.parent / "outside.safetensors").write_bytes(
        (sharded_copy / "model-00001-of-00003.safetensors").read_bytes())  # it exists: refused all the same
    index = json.loads((sharded_copy / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = name
    (sharded_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    refused(sharded_copy, UnsafeCheckpointError, "not a plain file name", "model.safetensors.index.json")
    with pytest.raises(UnsafeInputError):
        load_checkpoint(sharded_copy)


def test_index_naming_the_wrong_shard(sharded_copy: Path) -> None:
    index = json.loads((sharded_copy / "model.safetensors.index.json").read_text())
    actual = index["weight_map"]["model.norm.weight"]
    wrong = next(n for n in sorted(set(index["weight_map"].values())) if n != actual)
    index["weight_map"]["model.norm.weight"] = wrong
    (sharded_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    refused(sharded_copy, CheckpointWeightsError, f"puts model.norm.weight in {wrong}, but it is in {actual}")


def test_no_weights(copy: Path) -> None:
    (copy / "model.safetensors").unlink()
    refused(copy, CheckpointNotFoundError, "no weights", "model.safetensors", "model.safetensors.index.json")


def test_stray_safetensors_named(copy: Path) -> None:
    (copy / "model.safetensors").rename(copy / "consolidated.safetensors")
    refused(copy, CheckpointNotFoundError, "consolidated.safetensors", "rename it to model.safetensors")


def test_pickled_weights_refused_unread(copy: Path) -> None:
    (copy / "model.safetensors").unlink()
    (copy / "pytorch_model.bin").write_bytes(b"\x80\x04 never unpickled")
    refused(copy, CheckpointError, "pytorch_model.bin", "safetensors", "save_pretrained(dir)")


def test_corrupt_safetensors(copy: Path) -> None:
    (copy / "model.safetensors").write_bytes(b"\xff" * 64)
    refused(copy, CheckpointWeightsError, "model.safetensors", "not a readable safetensors file")


# -- weights against the config ---------------------------------------------------------------------------

def test_shape_mismatch_names_key_file_and_config(copy: Path) -> None:
    edit_json(copy / "config.json", intermediate_size=96)
    message = refused(copy, CheckpointWeightsError, "model.layers.0.mlp.gate_proj.weight is [128, 64] in "
                      "model.safetensors but the config makes it [96, 64]", "intermediate_size=96",
                      "do not belong to its config.json", "Fix: put the config.json saved with these weights")
    assert message.count("\n  ") == 6  # gate, up and down projections of both layers, all listed
    with pytest.raises(WeightsMismatchError):
        load_checkpoint(copy)


def test_shape_mismatch_in_a_shard(sharded_copy: Path) -> None:
    edit_json(sharded_copy / "config.json", hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    message = refused(sharded_copy, CheckpointWeightsError, "model.embed_tokens.weight is [320, 64] in "
                      "model-00001-of-00003.safetensors but the config makes it [320, 32]", "hidden_size=32")
    assert "... and" in message  # more than ten problems: the rest are counted


def test_missing_and_unexpected_keys_reported_together(copy: Path) -> None:
    def change(state: dict[str, torch.Tensor]) -> None:
        del state["model.norm.weight"]
        state["model.extra.weight"] = torch.zeros(3)

    rewrite_weights(copy / "model.safetensors", change)
    refused(copy, CheckpointWeightsError, "model.norm.weight is missing", "model.extra.weight in model.safetensors "
            "is not a weight of Qwen2ForCausalLM", "2 problem(s)")
    # Trusting the files skips the check; a model cannot be built from them all the same.
    checkpoint = load_checkpoint(copy, check_weights=False)
    with pytest.raises(CheckpointWeightsError, match="model.norm.weight is missing"):
        checkpoint.build_with_weights()


def test_untied_config_missing_lm_head(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", "llama", tie_word_embeddings=True)
    edit_json(directory / "config.json", tie_word_embeddings=False)
    refused(directory, CheckpointWeightsError, "lm_head.weight is missing", "tie_word_embeddings is false")


def test_integer_weight_for_a_float_parameter(copy: Path) -> None:
    rewrite_weights(copy / "model.safetensors",
                    lambda s: s.__setitem__("model.norm.weight", torch.zeros(64, dtype=torch.int8)))
    refused(copy, CheckpointWeightsError, "model.norm.weight is I8 in model.safetensors", "floating point")


def test_sizes_checked_against_limits(copy: Path) -> None:
    with limits(max_alloc_bytes=40_000):  # over the json files, under the embedding
        refused(copy, LimitExceededError, "model.safetensors", "TORCH_IR_MAX_ALLOC_BYTES")
        checkpoint = load_checkpoint(copy, check_weights=False)
        with pytest.raises(LimitExceededError, match="TORCH_IR_MAX_ALLOC_BYTES"):
            checkpoint.state_dict()


# -- the tokenizer ----------------------------------------------------------------------------------------

def test_tokenizer_larger_than_vocab(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", "qwen2", vocab_size=200)
    refused(directory, CheckpointError, "tokenizer.json", "config.json", "vocab_size=200",
            f"ids up to {TOKENIZER_VOCAB - 1} cannot be embedded")


@pytest.mark.parametrize("text", ["{not json", "{\"a\": 1}", "[]"])
def test_corrupt_tokenizer(copy: Path, text: str) -> None:
    (copy / "tokenizer.json").write_text(text)
    refused(copy, CheckpointError, "tokenizer.json", "cannot be loaded", "delete them")
