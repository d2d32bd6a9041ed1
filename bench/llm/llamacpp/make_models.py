"""Seeded random-weight Qwen2.5-0.5B/1.5B-shaped checkpoints as GGUF files, made here (nothing downloaded).

Run in this folder's venv (``setup.sh``)::

    bench/llm/llamacpp/.venv/bin/python bench/llm/llamacpp/make_models.py --shapes 0.5b
    bench/llm/llamacpp/.venv/bin/python bench/llm/llamacpp/make_models.py --shapes 0.5b,1.5b --types f32,q4_K_M

Per shape, under ``models/<shape>/``: ``hf/`` (``transformers`` ``save_pretrained`` of a ``Qwen2ForCausalLM``
built from the models' ``config.json`` values with ``torch.manual_seed(seed)`` weights, fp32) and
``qwen2.5-<shape>-<type>.gguf`` for each type: f32, bf16, f16 and q8_0 written by llama.cpp's own
``convert_hf_to_gguf.py --outtype``; q4_0 and q4_K_M by llama.cpp's quantizer (``llama_model_quantize`` through
the Python binding, the code behind the ``llama-quantize`` tool, which the wheel does not install) from the
f32 file, as a user quantizing a model would.

The tokenizer: the converter reads a Qwen2 checkpoint's vocabulary either from a SentencePiece
``tokenizer.model`` or from a BPE ``tokenizer.json`` whose pre-tokenizer it must recognise by the hash of its
encoding of a fixed text (only the real Qwen tokenizer's hash would pass). A small SentencePiece model trained
here (``sentencepiece``, byte fallback) takes the first path; the converter pads the vocabulary to the config's
151,936 entries, so the embedding and LM-head shapes are the real model's. The timing never tokenizes text:
``decode.py`` feeds token ids.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
CONVERTER = HERE / ".build" / "llama.cpp" / "convert_hf_to_gguf.py"

# From the models' config.json (Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-1.5B), as bench/llm/run.py writes them.
SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=True, use_sliding_window=False, bos_token_id=151643, eos_token_id=151643)
CONVERTED = ("f32", "bf16", "f16", "q8_0")  # the converter's --outtype values
QUANTIZED = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}  # llama_model_quantize
TYPES = CONVERTED + tuple(QUANTIZED)


def gguf_path(shape: str, qtype: str) -> Path:
    return MODELS / shape / f"qwen2.5-{shape}-{qtype}.gguf"


def train_tokenizer(out: Path, seed: int) -> None:
    """A 512-piece SentencePiece BPE model trained on seeded pseudo-words: the converter only needs a valid
    ``tokenizer.model`` (see the module docstring)."""
    import sentencepiece as spm

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(400)]
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=512,
                                   model_type="bpe", byte_fallback=True, num_threads=1, minloglevel=2)
    out.write_bytes(model.getvalue())


def make_checkpoint(shape: str, seed: int) -> Path:
    """``models/<shape>/hf``: the fp32 checkpoint and its tokenizer (kept: a rerun only converts)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    hf = MODELS / shape / "hf"
    if (hf / "config.json").is_file() and (hf / "tokenizer.model").is_file():
        return hf
    hf.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = Qwen2Config(**SHAPES[shape], **COMMON, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(hf)
    del model
    train_tokenizer(hf / "tokenizer.model", seed)
    return hf


def convert(hf: Path, out: Path, outtype: str) -> None:
    """llama.cpp's converter, its per-tensor log kept quiet unless it fails."""
    cmd = [sys.executable, str(CONVERTER), str(hf), "--outtype", outtype, "--outfile", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        out.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")


def quantize(src: Path, out: Path, ftype_name: str, threads: int) -> None:
    """llama.cpp's quantizer (``llama_model_quantize``) with its default parameters but the file type."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype_name)
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src.name} -> {out.name}, {ftype_name}) returned {rc}")


def make(shape: str, types: list[str], seed: int, threads: int) -> None:
    hf = make_checkpoint(shape, seed)
    # f32 first: the quantizer's source.
    for qtype in sorted(types, key=lambda t: (t not in CONVERTED, t != "f32")):
        out = gguf_path(shape, qtype)
        if out.is_file():
            continue
        start = time.perf_counter()
        if qtype in CONVERTED:
            convert(hf, out, qtype)
        else:
            src = gguf_path(shape, "f32")
            if not src.is_file():
                convert(hf, src, "f32")
            quantize(src, out, QUANTIZED[qtype], threads)
        print(f"{out.relative_to(HERE)}: {out.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - start:.0f} s",
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="0.5b", help="comma-separated: " + ",".join(SHAPES))
    parser.add_argument("--types", default=",".join(TYPES), help="comma-separated: " + ",".join(TYPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="the quantizer's threads")
    args = parser.parse_args()
    if not CONVERTER.is_file():
        parser.error(f"{CONVERTER} not found: run setup.sh first")
    types = args.types.split(",")
    unknown = [t for t in types if t not in TYPES] + [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape or type: {unknown}")
    for shape in args.shapes.split(","):
        make(shape, types, args.seed, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
