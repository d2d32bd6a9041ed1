"""``torch-ir generate`` on a checkpoint directory as a user has it after a download, and on a zoo name."""

from __future__ import annotations

import pytest

from npu_tools.cli import main

from .checkpoints import make_checkpoint, transformers_continuation

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2", shards=2)


@pytest.mark.slow
def test_generate_text_from_a_checkpoint_equals_transformers(checkpoint, capsys):
    prompt = "The quick brown fox"
    assert main(["generate", str(checkpoint), "--prompt", prompt, "--max-new-tokens", "12",
                 "--max-cache-len", "64"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == transformers_continuation(checkpoint, prompt, 12).strip()
    for field in ("prefill", "ms/token", "tokens/s", "dispatches/token", "per layer"):
        assert field in out.err


@pytest.mark.slow
def test_generate_ids_from_a_zoo_model(capsys):
    assert main(["generate", "qwen2", "--prompt-ids", "5,6,7", "--max-new-tokens", "4", "--max-cache-len",
                 "32"]) == 0
    out = capsys.readouterr().out
    assert "prompt ids: 5,6,7" in out
    assert len(out.split("new ids: ")[1].strip().split(",")) == 4


def test_text_prompt_needs_a_tokenizer(capsys):
    assert main(["generate", "qwen2", "--prompt", "hello", "--max-new-tokens", "2", "--max-cache-len", "16"]) == 2
    assert "has no tokenizer: give --prompt-ids" in capsys.readouterr().err


def test_prompt_longer_than_the_cache_is_refused(checkpoint, capsys):
    ids = ",".join(["5"] * 20)
    assert main(["generate", str(checkpoint), "--prompt-ids", ids, "--max-new-tokens", "4", "--max-cache-len",
                 "16", "--chunk", "8"]) == 2
    assert "needs a KV cache of 23 positions" in capsys.readouterr().err


def test_a_missing_shard_is_named(tmp_path, capsys):
    directory = make_checkpoint(tmp_path / "broken", "llama", shards=2)
    shard = sorted(directory.glob("model-*.safetensors"))[0]
    shard.unlink()
    assert main(["generate", str(directory), "--prompt-ids", "5", "--max-new-tokens", "2"]) == 2
    assert shard.name in capsys.readouterr().err


@pytest.mark.slow
def test_compile_of_an_llm_ir_writes_both_programs_and_the_dispatch_table(tmp_path, capsys):
    ir = tmp_path / "llama_kv.json"
    assert main(["extract", "llama_kv", "-o", str(ir)]) == 0
    out = tmp_path / "llama_lm"
    assert main(["compile", str(ir), "-o", str(out), "--chunk", "4"]) == 0
    printed = capsys.readouterr().out
    assert (out / "prefill.npubin").exists() and (out / "decode.npubin").exists()
    assert "unfused/run" in printed and "fused/run" in printed and "decode" in printed
