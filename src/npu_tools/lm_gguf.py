"""An LLM from a GGUF file (llama.cpp's format) for ``load_lm``: the metadata as a Hugging Face config (the model
built on the meta device from it), the tokenizer from the file's vocabulary and merges, the weights by HF key.

The weights of the block layouts the programs hold (``torch_ir.quant.spec.BLOCKS``: Q8_0, Q4_0, Q5_0, Q4_K, Q6_K) stay
their blocks, as the file maps them: the programs' weight slots are marked with the layout
(``npu_compiler.llm.with_block_weights``) and the CPU backend's linear layers read the blocks
(``npu_runtime.backends.cpu_qgemv``), so a decode step reads the file's bytes. Tensors of other block types (Q4_1,
Q5_1, ... which llama.cpp's quantizer may use for some rows) are dequantized to the compute dtype when read, bit-exact
against the ``gguf`` package (one warning names them).
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from torch_ir.errors import IRValidationError, TorchIRError

_FLOAT_TYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def is_gguf_path(source: str | os.PathLike[str]) -> bool:
    """A regular file whose name ends in ``.gguf`` (its magic and every field are checked when it is read)."""
    path = Path(source)
    return path.suffix.lower() == ".gguf" and path.is_file()


class GGUFTokenizer:
    """``encode(text) -> ids`` / ``decode(ids) -> text`` of the file's tokenizer, without added special tokens (a
    prompt is the text's tokens, as the checkpoint tokenizer gives them). A tokenizer the reader cannot build yet
    (an unknown ``tokenizer.ggml.model``) is an error when text is encoded or decoded, not when the model loads:
    token ids still run."""

    def __init__(self, fast: Any = None, unsupported: str | None = None) -> None:
        self.fast, self.unsupported = fast, unsupported

    def _ready(self) -> Any:
        if self.fast is None:
            raise TorchIRError(f"{self.unsupported}; give the prompt as token ids (--prompt-ids)")
        return self.fast

    def encode(self, text: str) -> list[int]:
        return list(self._ready().encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._ready().decode(ids)


def _tokenizer(f: Any) -> GGUFTokenizer | None:
    from torch_ir.frontends.gguf import build_fast_tokenizer

    if "tokenizer.ggml.tokens" not in f.metadata:
        return None
    try:
        return GGUFTokenizer(build_fast_tokenizer(f))
    except IRValidationError as e:  # e.g. a tokenizer model the reader does not build
        return GGUFTokenizer(unsupported=str(e))


def gguf_lm(source: str | os.PathLike[str], torch_dtype: Any) -> tuple[Any, str, Any, set[int], Any, Any]:
    """(meta model, name, tokenizer or None, eos ids, a function reading the weights, the dtype) of a GGUF file.
    The function returns (tensors by HF key, {key: block layout} of those kept as blocks)."""
    import torch
    import transformers

    import torch_ir
    from torch_ir.frontends.gguf import hf_tensors, read_gguf, spec_block, token_ids, transformers_config
    from torch_ir.quant.spec import BLOCKS

    f = read_gguf(source)
    config = transformers_config(f)
    types = Counter(info.type.name for info in f.tensors.values())
    dtype = torch_dtype or getattr(torch, _default_dtype(types))
    with torch_ir.build_on_meta():
        meta = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    tokenizer = _tokenizer(f)
    ids = token_ids(f) if "tokenizer.ggml.tokens" in f.metadata else {}
    eos = {ids["eos"]} if "eos" in ids else set()
    expanded = sorted(t for t in types if t not in _FLOAT_TYPES and spec_block(t) not in BLOCKS)

    def weights() -> tuple[dict[str, Any], dict[str, str]]:
        if expanded:
            warnings.warn(f"{Path(source).name}: its {', '.join(expanded)} tensors are dequantized to "
                          f"{str(dtype).removeprefix('torch.')} as they are read (the programs hold "
                          f"{', '.join(BLOCKS)} blocks as they are)", stacklevel=3)
        tensors, layouts = hf_tensors(f, keep=BLOCKS)
        return {k: v if k in layouts else v.to(dtype) for k, v in tensors.items()}, layouts

    return meta, Path(source).stem, tokenizer, eos, weights, dtype


def _default_dtype(types: Counter) -> str:
    """The file's float type when its tensors are float (BF16, then F16), else float32."""
    for ggml, name in (("BF16", "bfloat16"), ("F16", "float16")):
        if types.get(ggml):
            return name
    return "float32"


def gguf_model_parts(source: str | os.PathLike[str]) -> tuple[str, Any, dict[str, Any], str]:
    """What a command's model argument needs of a GGUF file (``npu_tools.zoo.runner.resolve_spec``): its name, a
    ``build(device)`` (on meta: shapes only; on the CPU: the float model with the file's weights, block tensors
    dequantized bit-exactly as the ``gguf`` package does, the reference the IR is checked against), seeded example
    token ids and what weights ``build`` gives."""
    import torch
    import transformers

    import torch_ir
    from torch_ir.frontends.gguf import hf_state_dict, read_gguf, transformers_config
    from torch_ir.frontends.hf_model import EXAMPLE_TOKENS, SEED

    f = read_gguf(source)
    config = transformers_config(f)

    def build(device: str) -> Any:
        if torch.device(device).type == "meta":
            with torch_ir.build_on_meta():
                return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        missing, unexpected = model.load_state_dict(hf_state_dict(f), strict=False)
        if unexpected or set(missing) - ({"lm_head.weight"} if config.tie_word_embeddings else set()):
            raise TorchIRError(f"{Path(source).name}: its tensors do not fill the {config.model_type} model built from "
                               f"its metadata (missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
        return model.to(device).eval().requires_grad_(False)

    tokens = min(EXAMPLE_TOKENS, config.max_position_embeddings)
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(SEED))
    return Path(source).stem, build, {"input_ids": ids}, f"the GGUF file's weights ({Path(source).name}, dequantized)"
