"""A GGUF file's tokenizer (``tokenizer.ggml.*``) as a Hugging Face ``tokenizers`` tokenizer.

Supported: model ``gpt2`` (byte-level BPE: tokens + merges), with the pre-tokenizer ``tokenizer.ggml.pre``
names: ``default``/``gpt2`` (GPT-2's split), ``llama-bpe`` (Llama 3), ``qwen2``. Control and user-defined
tokens (``token_type`` 3 and 4) become added special tokens, matched whole before the BPE. Other
pre-tokenizers are refused with an error naming what is supported.

Model ``llama`` (SentencePiece BPE: Llama 2, Mistral, TinyLlama) is rebuilt from tokens, scores and token types
as SentencePiece and llama.cpp encode it: spaces become ``▁``, one ``▁`` is put before the text and after every
special token (``tokenizer.ggml.add_space_prefix``, default true), the pieces merge best score first (the BPE
merges are recovered from the scores: a normal token that splits into two normal tokens), and a character
outside the vocabulary becomes its UTF-8 bytes' ``<0xXX>`` tokens (byte fallback; a file without byte tokens
gives its unknown token instead). Decoding undoes each step and drops the leading space the prefix put there.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ...errors import IRValidationError
from .reader import GGUFFile

# llama.cpp's llama-vocab.cpp regexes for each tokenizer.ggml.pre (the same as the HF tokenizers' Split)
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS: dict[str, str | None] = {"default": None, "gpt2": None, "llama-bpe": _LLAMA3, "qwen2": _QWEN2}
# llama_token_type, as llama.cpp's converter writes them (SentencePieceTokenTypes)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's visible space
_BYTE_TOKEN = re.compile(r"<0x([0-9A-F]{2})>")


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
    for name, key_name in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        key = f"tokenizer.ggml.{key_name}_token_id"
        value = f.metadata.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
            raise _fail(f, key, f"must be a token id in [0, {n}), got {value!r}")
        out[name] = value
    return out


def build_tokenizer(f: GGUFFile) -> Any:
    """A ``tokenizers.Tokenizer`` equal to the one the file was converted from (module docstring)."""
    model = f.metadata.get("tokenizer.ggml.model")
    if model == "gpt2":
        return _byte_level_bpe(f)
    if model == "llama":
        return _sentencepiece_bpe(f)
    raise _fail(f, "tokenizer.ggml.model", f"{model!r} is not known; supported: 'gpt2' (byte-level BPE), "
                                           "'llama' (SentencePiece BPE)")


def _byte_level_bpe(f: GGUFFile) -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = f.metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise _fail(f, "tokenizer.ggml.pre", f"{pre!r} is not supported yet; supported: {', '.join(PRE_TOKENIZERS)}")
    tokens = _strings(f, "tokenizer.ggml.tokens")
    vocab = _vocab(tokens)
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


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # a repeated token keeps its first id, as llama.cpp's text-to-token map does
    return vocab


def _numbers(f: GGUFFile, key: str, n: int, kinds: tuple[str, ...]) -> list[Any]:
    value, kind = f.metadata.get(key), f.value_types.get(key, "nothing")
    if not isinstance(value, list) or kind not in [f"array[{k}]" for k in kinds]:
        raise _fail(f, key, f"must be an array of {' or '.join(kinds)}, got {kind}")
    if len(value) != n:
        raise _fail(f, key, f"has {len(value)} entries for {n} tokens (tokenizer.ggml.tokens)")
    return value


def _spm_arrays(f: GGUFFile) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types, checked: one each per token, finite scores, known types."""
    tokens = _strings(f, "tokenizer.ggml.tokens")
    scores = _numbers(f, "tokenizer.ggml.scores", len(tokens), ("float32", "float64"))
    for i, score in enumerate(scores):
        if not math.isfinite(score):
            raise _fail(f, f"tokenizer.ggml.scores[{i}]", f"must be a finite number, got {score!r}")
    types = _numbers(f, "tokenizer.ggml.token_type", len(tokens), ("int32",))
    for i, t in enumerate(types):
        if not NORMAL <= t <= BYTE:
            raise _fail(f, f"tokenizer.ggml.token_type[{i}]", f"must be a token type in [{NORMAL}, {BYTE}] "
                                                              f"(normal .. byte), got {t}")
    return tokens, scores, types


def _byte_tokens(f: GGUFFile, tokens: list[str], types: list[int]) -> bool:
    """Whether the file has byte fallback: all 256 ``<0xXX>`` tokens typed BYTE, or none."""
    seen: dict[int, int] = {}
    for i, (tok, t) in enumerate(zip(tokens, types)):
        if t != BYTE:
            continue
        m = _BYTE_TOKEN.fullmatch(tok)
        if m is None:
            raise _fail(f, f"tokenizer.ggml.tokens[{i}]", f"{tok[:40]!r} is typed byte ({BYTE}) but is not <0xXX>")
        if seen.setdefault(int(m.group(1), 16), i) != i:
            raise _fail(f, f"tokenizer.ggml.tokens[{i}]", f"{tok!r} repeats token {seen[int(m.group(1), 16)]}")
    if seen and len(seen) != 256:
        missing = next(b for b in range(256) if b not in seen)
        raise _fail(f, "tokenizer.ggml.tokens", f"byte fallback needs a token per byte: {len(seen)} byte tokens "
                                                f"(type {BYTE}), <0x{missing:02X}> missing")
    return bool(seen)


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """The BPE merges a SentencePiece vocabulary implies: each normal token that is two normal tokens joined,
    best score first (SentencePiece merges the adjacent pair whose joined piece scores highest). Control, byte,
    unknown and unused tokens take no part: SentencePiece never builds them from pieces."""
    normal = {}
    for i, (tok, t) in enumerate(zip(tokens, types)):
        if t == NORMAL:
            normal.setdefault(tok, i)
    ranked = []
    for tok, i in normal.items():
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in normal and right in normal:
                # ties (one piece, several cuts) by the longer left part first, as transformers' generate_merges
                ranked.append((-scores[i], i, -cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece_bpe(f: GGUFFile) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    tokens, scores, types = _spm_arrays(f)
    byte_fallback = _byte_tokens(f, tokens, types)
    unk = token_ids(f).get("unk", next((i for i, t in enumerate(types) if t == UNKNOWN), None))
    if unk is None and not byte_fallback:
        raise _fail(f, "tokenizer.ggml.unknown_token_id", "is needed when the vocabulary has no byte tokens "
                                                          "(a character outside it has no other token)")
    tok = Tokenizer(models.BPE(_vocab(tokens), spm_merges(tokens, scores, types), dropout=None,
                               unk_token=None if unk is None else tokens[unk], fuse_unk=True,
                               byte_fallback=byte_fallback))
    prefix = f.metadata.get("tokenizer.ggml.add_space_prefix", True)
    if not isinstance(prefix, bool):
        raise _fail(f, "tokenizer.ggml.add_space_prefix", f"must be a bool, got {prefix!r}")
    # A normalizer, not Metaspace: it prefixes every text piece between special tokens and even one that starts
    # with a space (" hi" -> "▁▁hi"), as llama.cpp and SentencePiece do; Metaspace would not.
    replace = normalizers.Replace(" ", SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), replace]) if prefix else replace
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    # control and unknown tokens (<s>, </s>, <unk>) match whole as specials; user-defined ones match whole too
    # (llama.cpp matches both in the text), but stay in decoded text with skip_special_tokens
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t in (CONTROL, UNKNOWN)])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(types) if t == USER_DEFINED])
    return tok


def build_fast_tokenizer(f: GGUFFile) -> Any:
    """:func:`build_tokenizer` as a ``transformers.PreTrainedTokenizerFast`` with the file's special tokens."""
    import transformers

    tokens = _strings(f, "tokenizer.ggml.tokens")
    names = {f"{k}_token": tokens[i] for k, i in token_ids(f).items()}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(f), **names)


__all__ = ["PRE_TOKENIZERS", "build_fast_tokenizer", "build_tokenizer", "spm_merges", "token_ids"]
