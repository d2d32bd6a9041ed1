"""A tiny byte-level BPE tokenizer trained here with HF ``tokenizers`` (nothing downloaded), written to GGUF's
tokenizer.ggml.* keys as llama.cpp's converter writes them, rebuilt by build_tokenizer: the same ids and the
same decoded text as the source on every test string."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from torch_ir.errors import IRValidationError
from torch_ir.frontends.gguf import build_fast_tokenizer, build_tokenizer, read_gguf, token_ids
from torch_ir.frontends.gguf.tokenizer import PRE_TOKENIZERS

from .writer import write_gguf

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello, world! It's 2024: 12345 + 678 = 13023.",
          "naïve café — über straße, 日本語のテキスト", "def f(x):\n    return x * 2\n\n", "  spaces   and\ttabs "] * 4
TEXTS = ["Hello world", "The lazy café's fox<|endoftext|>jumps 99999 times!", "日本語 テキスト\n\n  x",
         "unseen zebra QXJ ✓ 🙂", "", "   ", "<|endoftext|>"]


def train(pre: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    if PRE_TOKENIZERS[pre] is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_tokenizer(tok: Tokenizer, pre: str, path: Path) -> Path:
    model = json.loads(tok.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in by_id] == list(range(len(by_id)))
    tokens = [t for t, _ in by_id]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    eot = tokens.index("<|endoftext|>")

    def fill(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([3 if i == eot else 1 for i in range(len(tokens))])
        w.add_token_merges(merges)
        w.add_bos_token_id(eot)
        w.add_eos_token_id(eot)

    return write_gguf(path, "qwen2", {}, fill)


@pytest.mark.parametrize("pre", ["gpt2", "qwen2", "llama-bpe"])
def test_bpe_round_trip(tmp_path: Path, pre: str) -> None:
    source = train(pre)
    f = read_gguf(write_tokenizer(source, pre, tmp_path / "tok.gguf"))
    rebuilt = build_tokenizer(f)
    assert rebuilt.get_vocab_size() == source.get_vocab_size()
    for text in TEXTS:
        ids = source.encode(text).ids
        assert rebuilt.encode(text).ids == ids, text
        assert rebuilt.decode(ids, skip_special_tokens=False) == source.decode(ids, skip_special_tokens=False)
    eot = source.token_to_id("<|endoftext|>")
    assert token_ids(f) == {"bos": eot, "eos": eot}
    fast = build_fast_tokenizer(f)
    assert fast.eos_token == "<|endoftext|>" and fast("Hello world")["input_ids"] == source.encode("Hello world").ids


def test_unsupported_tokenizers(tmp_path: Path) -> None:
    # SentencePiece ("llama") vocabularies: test_tokenizer_spm.py
    def bad_pre(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("deepseek-llm")
        w.add_token_list(["a", "b"])
        w.add_token_merges(["a b"])
        w.add_eos_token_id(7)

    f = read_gguf(write_gguf(tmp_path / "pre.gguf", "llama", {}, bad_pre))
    with pytest.raises(IRValidationError, match="'deepseek-llm' is not supported yet; supported: default, gpt2"):
        build_tokenizer(f)
    with pytest.raises(IRValidationError, match=r"eos_token_id: must be a token id in \[0, 2\), got 7"):
        token_ids(f)
