"""``load_lm`` / ``torch-ir generate`` on a GGUF file: tiny seeded Llama and Qwen2 checkpoints written as llama.cpp
writes them (F32, and Q8_0/Q4_0 layers), compiled into prefill and decode programs; their greedy tokens equal
transformers' on the same weights (the file's, dequantized by the gguf package's rules)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from npu_runtime import Device, load_weights
from npu_runtime.generate import Generator
from npu_tools.cli import main
from npu_tools.lm_source import load_lm
from torch_ir.frontends.gguf import hf_state_dict, read_gguf

from .test_config import make_model, write_model

PROMPT = [5, 17, 33, 2, 9, 71]


def _hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch, quant", [("qwen2", {}), ("llama", {}),
                                         ("qwen2", {"attn_": "Q8_0", "ffn_": "Q4_0"})])
def test_greedy_tokens_equal_transformers_on_the_files_weights(tmp_path: Path, arch: str, quant: dict) -> None:
    path = write_model(make_model(arch), arch, tmp_path / f"{arch}.gguf", quant)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = load_lm(path, max_cache_len=64)
    assert any("dequantized" in str(w.message) for w in caught) == bool(quant)
    reference = make_model(arch)  # the float model with the file's weights, as the gguf package dequantizes them
    state = hf_state_dict(read_gguf(path))
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is the embedding
    device = Device()
    generator = Generator(lm.programs.prefill, lm.programs.decode,
                          load_weights(lm.weights, lm.programs.prefill, device), device)
    assert generator.generate(PROMPT, 24).tokens == _hf_greedy(reference.eval(), PROMPT, 24)


def test_generate_command_takes_a_gguf_file(tmp_path: Path, capsys) -> None:
    path = write_model(make_model("qwen2"), "qwen2", tmp_path / "tiny.gguf", {})
    assert main(["generate", str(path), "--prompt-ids", "5,17,33", "--max-new-tokens", "4",
                 "--max-cache-len", "32"]) == 0
    assert "tiny" in capsys.readouterr().err


def test_a_tokenizer_not_built_yet_is_an_error_at_encode_not_at_load() -> None:
    from npu_tools.lm_gguf import GGUFTokenizer
    from torch_ir.errors import TorchIRError

    tok = GGUFTokenizer(unsupported="f.gguf: tokenizer.ggml.model 'llama' (SentencePiece) is not supported yet")
    with pytest.raises(TorchIRError, match=r"SentencePiece.*give the prompt as token ids \(--prompt-ids\)"):
        tok.encode("hello")
