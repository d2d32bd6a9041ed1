"""SentencePiece (GGUF model ``llama``) vocabularies: a tiny BPE model trained here with the ``sentencepiece`` package
(Llama's settings: identity normalization, spaces kept, a dummy prefix, byte fallback), written to GGUF's
tokenizer.ggml.* keys as llama.cpp's converter writes them (``_create_vocab_sentencepiece``: pieces, scores, types,
padding to the model's vocabulary size), rebuilt by build_tokenizer from the file: the same ids and decoded text as
SentencePiece itself on every test string, and as transformers' LlamaTokenizer where that agrees with
SentencePiece (it does not prefix a text that starts with a space twice)."""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import pytest

from torch_ir.errors import IRValidationError
from torch_ir.frontends.gguf import build_fast_tokenizer, build_tokenizer, read_gguf, token_ids

from .writer import write_gguf

spm = pytest.importorskip("sentencepiece")

WORDS = ("the quick brown fox jumps over lazy dog hello world token model café naïve über straße 日本 語 テキスト "
         "data 123 4567 89 interpretation international internationalization tokenizer tokenization").split()
TEXTS = ["Hello world", "the quick brown fox", "internationalization of the tokenizer", "café naïve über straße",
         "日本語のテキスト", "x  y   z\n\n  w ", "tab\there", "digits 0123456789 and 3.14159",
         "unseen zebra QXJ ✓ 🙂 ψ", "\n", "", " hi", "  hi", "   ", "ends with space ", "[PAD3] is text"]
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
PADDING = 8  # llama.cpp pads the vocabulary to the model's size with [PAD{i}] tokens
TOOL = "<tool>"  # an added token (added_tokens.json): user-defined, in the first padding slot


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def train(byte_fallback: bool = True, dummy_prefix: bool = True, vocab_size: int = 400) -> Any:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences(400, seed=0)), model_writer=buf, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=byte_fallback, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=dummy_prefix, character_coverage=1.0, split_digits=True, num_threads=1, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def vocab(sp: Any) -> tuple[list[str], list[float], list[int]]:
    """Pieces, scores and types as llama.cpp's _create_vocab_sentencepiece lists them."""
    n = sp.vocab_size()
    tokens = [sp.id_to_piece(i) for i in range(n)] + [f"[PAD{i}]" for i in range(PADDING)]
    scores = [sp.get_score(i) for i in range(n)] + [-10000.0] * PADDING
    types = [UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else UNUSED if sp.is_unused(i)
             else BYTE if sp.is_byte(i) else NORMAL for i in range(n)] + [UNUSED] * PADDING
    tokens[n], scores[n], types[n] = TOOL, -1000.0, USER_DEFINED
    return tokens, scores, types


def write(path: Path, tokens: list[str], scores: list[Any], types: list[int],
          more: Callable[[gguf.GGUFWriter], None] | None = None) -> Path:
    def fill(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        if more is not None:
            more(w)

    return write_gguf(path, "llama", {}, fill)


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    sp = train()
    return sp, write(tmp_path_factory.mktemp("spm") / "spm.gguf", *vocab(sp))


def test_encode_decode_as_sentencepiece(spm_file: tuple[Any, Path]) -> None:
    sp, path = spm_file
    tok = build_tokenizer(read_gguf(path))
    assert tok.get_vocab_size() == sp.vocab_size() + PADDING
    texts = TEXTS + sentences(200, seed=1) + [" " + a + "\n\n " + b for a, b in zip(sentences(20, 2), sentences(20, 3))]
    for text in texts:
        ids = sp.encode(text)
        assert tok.encode(text).ids == ids, text
        assert tok.decode(ids) == sp.decode(ids), text
    # byte fallback: a character the model never saw is its UTF-8 bytes' <0xXX> pieces
    assert tok.encode("✓").tokens == ["▁", "<0xE2>", "<0x9C>", "<0x93>"] == sp.encode("✓", out_type=str)


def test_special_and_added_tokens(spm_file: tuple[Any, Path]) -> None:
    """Control (<s>, </s>, <unk>) and user-defined tokens match whole in the text; the text between them is
    encoded as a text of its own, prefix included (llama.cpp's tokenizer with special tokens parsed)."""
    sp, path = spm_file
    f = read_gguf(path)
    tok, tool = build_tokenizer(f), sp.vocab_size()
    assert tok.encode("<s>hello</s> world").ids == [1, *sp.encode("hello"), 2, *sp.encode(" world")]
    assert tok.encode(f"a{TOOL}b<unk>").ids == [*sp.encode("a"), tool, *sp.encode("b"), 0]
    ids = [1, *sp.encode("the fox"), 2]
    assert tok.decode(ids, skip_special_tokens=True) == "the fox"
    assert token_ids(f) == {"bos": 1, "eos": 2, "unk": 0}
    fast = build_fast_tokenizer(f)
    assert (fast.bos_token, fast.eos_token, fast.unk_token) == ("<s>", "</s>", "<unk>")
    assert fast.encode("the fox", add_special_tokens=False) == sp.encode("the fox")
    assert fast.decode(ids, skip_special_tokens=True) == "the fox"


def test_as_transformers_llama_tokenizer(spm_file: tuple[Any, Path], tmp_path: Path) -> None:
    """transformers' LlamaTokenizer made from the same tokenizer.model, on texts that do not start with a space
    (where its Metaspace pre-tokenizer and SentencePiece agree) and hold no special token."""
    transformers = pytest.importorskip("transformers")
    sp, path = spm_file
    (tmp_path / "tokenizer.model").write_bytes(sp.serialized_model_proto())
    hf = transformers.LlamaTokenizer.from_pretrained(tmp_path)
    tok = build_tokenizer(read_gguf(path))
    for text in [t for t in TEXTS if not t[:1].isspace()] + sentences(50, seed=4):
        ids = hf.encode(text, add_special_tokens=False)
        assert tok.encode(text).ids == ids, text
        assert tok.decode(ids) == hf.decode(ids), text


def test_no_byte_fallback_no_prefix(tmp_path: Path) -> None:
    """A vocabulary without byte tokens gives <unk> for a run of unknown characters (as SentencePiece: one);
    add_space_prefix false (a model trained without the dummy prefix) puts no ▁ before the text."""
    sp = train(byte_fallback=False, dummy_prefix=False, vocab_size=200)
    tokens, scores, types = vocab(sp)
    path = write(tmp_path / "nobytes.gguf", tokens, scores, types, lambda w: w.add_add_space_prefix(False))
    tok = build_tokenizer(read_gguf(path))
    for text in TEXTS + sentences(50, seed=5):
        ids = sp.encode(text)
        assert tok.encode(text).ids == ids, text
        if 0 not in ids:  # SentencePiece decodes <unk> as " ⁇ ", transformers as the token's text
            assert tok.decode(ids) == sp.decode(ids), text
    ids = sp.encode("fox ✓✓ q")
    assert ids.count(0) == 1 and tok.encode("fox ✓✓ q").ids == ids  # the two unknown characters: one <unk>


def _hostile(tmp_path: Path, edit: Callable[[list[str], list[Any], list[int]], None]) -> Any:
    tokens, scores, types = vocab(train())
    edit(tokens, scores, types)
    return read_gguf(write(tmp_path / "hostile.gguf", tokens, scores, types))


@pytest.mark.parametrize(("edit", "error"), [
    (lambda t, s, y: s.pop(), r"tokenizer\.ggml\.scores: has 407 entries for 408 tokens"),
    (lambda t, s, y: s.__setitem__(40, float("nan")), r"tokenizer\.ggml\.scores\[40\]: must be a finite number"),
    (lambda t, s, y: y.__setitem__(7, 9), r"tokenizer\.ggml\.token_type\[7\]: must be a token type in \[1, 6\]"),
    (lambda t, s, y: y.__setitem__(3 + 0x41, NORMAL), r"tokenizer\.ggml\.tokens: byte fallback needs a token per "
                                                      r"byte: 255 byte tokens \(type 6\), <0x41> missing"),
    (lambda t, s, y: t.__setitem__(3 + 0x41, "<0x0A>"), r"tokenizer\.ggml\.tokens\[68\]: '<0x0A>' repeats token 13"),
    (lambda t, s, y: y.__setitem__(300, BYTE),
     r"tokenizer\.ggml\.tokens\[300\]: '.*' is typed byte \(6\) but is not <0xXX>"),
])
def test_hostile_vocabularies(tmp_path: Path, edit: Callable[..., None], error: str) -> None:
    f = _hostile(tmp_path, edit)
    with pytest.raises(IRValidationError, match=r"GGUF file '.*hostile\.gguf': " + error):
        build_tokenizer(f)


def test_missing_scores_and_unknown_model(tmp_path: Path) -> None:
    def no_scores(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("llama")
        w.add_token_list(["<unk>", "a"])

    with pytest.raises(IRValidationError, match=r"tokenizer\.ggml\.scores: must be an array of float32 or float64, "
                                                r"got nothing"):
        build_tokenizer(read_gguf(write_gguf(tmp_path / "a.gguf", "llama", {}, no_scores)))

    def ugm(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("t5")
        w.add_token_list(["<unk>", "a"])

    with pytest.raises(IRValidationError, match=r"'t5' is not known; supported: 'gpt2' .*, 'llama' \(SentencePiece"):
        build_tokenizer(read_gguf(write_gguf(tmp_path / "b.gguf", "t5", {}, ugm)))
