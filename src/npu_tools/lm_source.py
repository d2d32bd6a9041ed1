"""An LLM ready to generate with, from a Hugging Face checkpoint directory or a zoo name: built on the meta
device, extracted, compiled into prefill and decode programs (``npu_compiler.llm.compile_lm``), its weights read.

A tool, not a compiler stage: it reaches the frontends and the zoo, which the compiler does not import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npu_compiler import CompileError
from npu_compiler.library import Target
from npu_compiler.llm import DEFAULT_CHUNK, LMPrograms, compile_lm, with_block_weights


@dataclass
class LoadedLM:
    """An LLM ready to generate with: its programs, its weights (state-dict keys), its tokenizer if any."""

    name: str
    programs: LMPrograms
    weights: dict[str, Any]
    # Something with ``encode(text) -> ids`` and ``decode(ids) -> text`` (a checkpoint), or None (a zoo model).
    tokenizer: Any | None
    eos_token_ids: set[int]
    dtype: str


def load_lm(source: str | os.PathLike[str], *, dtype: str | None = None, max_cache_len: int = 256,
            chunk: int = DEFAULT_CHUNK, target: str | Target = "cpu", int8_activations: bool = False,
            progress: Any = None, kv_bits: int | None = None) -> LoadedLM:
    """Build, extract and compile an LLM from a Hugging Face checkpoint directory (``config.json`` plus
    safetensors weights, as downloaded), a GGUF file (``npu_tools.lm_gguf``: llama, qwen2, mistral) or a zoo name
    (random seeded weights, no tokenizer).

    The model is built on the meta device and only the weights are read; ``dtype`` (``float32``,
    ``bfloat16``, ``float16``; default: the checkpoint's) is the dtype the weights are stored and computed
    in. A GGUF file's block-quantized weights stay blocks (``npu_compiler.llm.with_block_weights``);
    ``int8_activations`` rounds the activations their contractions read to int8 groups, as llama.cpp does (faster
    integer kernels for every block layout; CPU only). ``kv_bits=8`` holds the KV cache as int8 codes and float32 scales
    (``npu_compiler.kvcache``). ``progress(label)`` is called before each stage.
    """
    import torch

    from npu_compiler.kvcache import kv_code_dtype
    from npu_tools.lm_gguf import gguf_lm, is_gguf_path
    from torch_ir.frontends.hf import extract_lm
    from torch_ir.frontends.hf_checkpoint import load_checkpoint
    from torch_ir.frontends.hf_model import is_hf_model_path
    from torch_ir.quant import blocks

    step = progress or (lambda label: None)
    torch_dtype = _torch_dtype(dtype)
    kv_code_dtype(kv_bits)  # an unsupported width refused before the model is read
    step("load")
    # a config.json alone is refused there too: generating needs the weights beside it
    if is_gguf_path(source):
        meta, name, tokenizer, eos, weights, torch_dtype = gguf_lm(source, torch_dtype)
    elif is_hf_model_path(source):
        checkpoint = load_checkpoint(source)
        torch_dtype = torch_dtype or checkpoint.dtype
        meta = checkpoint.build_on_meta(torch_dtype)
        name, tokenizer, eos = Path(source).name or str(source), checkpoint, checkpoint.eos_token_ids
        weights: Any = lambda: (checkpoint.state_dict(torch_dtype), {})  # noqa: E731 - read after compiling
    else:
        meta, real = _zoo_lm(str(source))
        torch_dtype = torch_dtype or torch.float32
        meta, real = meta.to(torch_dtype), real.to(torch_dtype)
        name, tokenizer = str(source), None
        eos = {int(meta.config.eos_token_id)} if isinstance(meta.config.eos_token_id, int) else set()
        from torch_ir.weights import module_state

        weights = lambda: (module_state(real), {})  # noqa: E731
    step("extract")
    ir = extract_lm(meta, max_cache_len, name=name)
    step("compile")
    programs = compile_lm(ir, chunk=min(chunk, max_cache_len), target=target, kv_bits=kv_bits)
    step("weights")
    tensors, layouts = weights()  # a GGUF file's block-quantized weights stay blocks where the target reads them
    if int8_activations and not layouts:
        raise CompileError(f"{name}: int8 activations are for block-quantized weights (a Q8_0, Q4_0, Q5_0, Q4_K or "
                           "Q6_K GGUF file); this model's weights are float: leave --int8-activations out")
    kept = with_block_weights(programs, layouts, int8_activations=int8_activations)
    for key in set(layouts) - set(kept):  # blocks the target reads nowhere: their values
        tensors[key] = blocks.dequantize_rows(tensors[key], layouts[key].upper()).to(torch_dtype)
    return LoadedLM(name, programs, tensors, tokenizer, eos, str(torch_dtype).removeprefix("torch."))


def _torch_dtype(name: str | None) -> Any:
    import torch

    if name is None:
        return None
    allowed = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in allowed:
        raise CompileError(f"dtype {name!r}: an LLM is compiled in one of {', '.join(allowed)}")
    return allowed[name]


def _zoo_lm(name: str) -> tuple[Any, Any]:
    """(meta, real) causal LM of a zoo entry (a ``StaticCacheLM`` entry is unwrapped)."""
    from npu_tools.zoo import build_pair, get_model, list_models
    from torch_ir.frontends.hf import StaticCacheLM

    try:
        entry = get_model(name)
    except KeyError:
        llms = [*list_models("llm"), *list_models("kv_cache")]
        raise CompileError(f"{name!r} is neither a checkpoint directory (no config.json there), a GGUF file nor a "
                           "zoo model; "
                           f"zoo LLMs: {', '.join(llms)}") from None
    meta, real = build_pair(entry)
    if isinstance(meta, StaticCacheLM):
        meta, real = meta.model, real.model
    if not hasattr(meta, "generate") or not hasattr(meta, "config"):
        raise CompileError(f"zoo model {name!r} is not a causal LM ({type(meta).__name__}); generate needs one "
                           "such as 'llama' or 'qwen2'")
    return meta, real


