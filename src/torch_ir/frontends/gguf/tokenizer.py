"""A GGUF file's tokenizer (``tokenizer.ggml.*``) as a Hugging Face ``tokenizers`` tokenizer.

Supported: model ``gpt2`` (byte-level BPE: tokens + merges), with the pre-tokenizer ``tokenizer.ggml.pre``
names: ``default``/``gpt2`` (GPT-2's split), ``llama-bpe`` (Llama 3), ``qwen2``. Control and user-defined
tokens (``token_type`` 3 and 4) become added special tokens, matched whole before the BPE. SentencePiece
files (model ``llama``) and other pre-tokenizers are refused with an error naming what is supported.
"""

from __future__ import annotations

from typing import Any

from ...errors import IRValidationError
from .reader import GGUFFile

# llama.cpp's llama-vocab.cpp regexes for each tokenizer.ggml.pre (the same as the HF tokenizers' Split)
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS: dict[str, str | None] = {"default": None, "gpt2": None, "llama-bpe": _LLAMA3, "qwen2": _QWEN2}
CONTROL, USER_DEFINED = 3, 4  # llama_token_type


def _fail(f: GGUFFile, key: str, problem: str) -> IRValidationError:
    return IRValidationError(f"GGUF file {str(f.path)!r}: {key}: {problem}")


def _strings(f: GGUFFile, key: str) -> list[str]:
    value = f.metadata.get(key)
    if not isinstance(value, list) or f.value_types.get(key) != "array[string]":
        raise _fail(f, key, f"must be an array of strings, got {f.value_types.get(key, 'nothing')}")
    return value


def token_ids(f: GGUFFile) -> dict[str, int]:
    """The special ids the file declares (``bos``, ``eos``, ``unk``, ``pad``), each checked to be a token."""
    n = len(_strings(f, "tokenizer.ggml.tokens"))
    out: dict[str, int] = {}
    for name in ("bos", "eos", "unk", "padding"):
        key = f"tokenizer.ggml.{name}_token_id"
        value = f.metadata.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
            raise _fail(f, key, f"must be a token id in [0, {n}), got {value!r}")
        out["pad" if name == "padding" else name] = value
    return out


def build_tokenizer(f: GGUFFile) -> Any:
    """A ``tokenizers.Tokenizer`` equal to the one the file was converted from (module docstring)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    model = f.metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        why = "SentencePiece (model 'llama') is not supported yet" if model == "llama" else "it is not known"
        raise _fail(f, "tokenizer.ggml.model", f"{model!r}: {why}; supported: 'gpt2' (byte-level BPE)")
    pre = f.metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise _fail(f, "tokenizer.ggml.pre", f"{pre!r} is not supported yet; supported: {', '.join(PRE_TOKENIZERS)}")
    tokens = _strings(f, "tokenizer.ggml.tokens")
    vocab = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # a repeated token keeps its first id, as llama.cpp's text-to-token map does
    merges = []
    for j, merge in enumerate(_strings(f, "tokenizer.ggml.merges")):
        parts = merge.split(" ")
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab:
            raise _fail(f, f"tokenizer.ggml.merges[{j}]", f"{merge[:80]!r} is not two known tokens split by a space")
        merges.append((parts[0], parts[1]))
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    regex = PRE_TOKENIZERS[pre]
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    types = f.metadata.get("tokenizer.ggml.token_type")
    if isinstance(types, list) and len(types) == len(tokens):
        special = [tokens[i] for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)]
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    return tok


def build_fast_tokenizer(f: GGUFFile) -> Any:
    """:func:`build_tokenizer` as a ``transformers.PreTrainedTokenizerFast`` with the file's special tokens."""
    import transformers

    tokens = _strings(f, "tokenizer.ggml.tokens")
    names = {f"{k}_token": tokens[i] for k, i in token_ids(f).items()}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(f), **names)


__all__ = ["PRE_TOKENIZERS", "build_fast_tokenizer", "build_tokenizer", "token_ids"]
