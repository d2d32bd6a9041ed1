"""Hugging Face helpers: make a decoder-only LM with a static KV cache exportable.

A Hugging Face LM returns its cache as a ``DynamicCache`` object, which ``torch.export`` cannot
put in a graph. :class:`StaticCacheLM` instead owns a fixed-size cache as registered buffers and
writes into them in place, so the exported IR records the cache as ``kv`` buffers and each step's
writes as ``ir.mutations``; the executor then carries the cache from one call to the next.

Written against the ``StaticCache``/``StaticLayer`` API of transformers 5.x. transformers is
imported only when a wrapper is built, so the rest of torch_ir never needs it.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


class StaticCacheLM(nn.Module):
    """``forward(input_ids, cache_position) -> logits``, with a static KV cache held as buffers.

    Example::

        with torch.device("meta"):
            lm = StaticCacheLM(LlamaForCausalLM(config), max_cache_len=64)
        seq = torch.export.Dim("seq", min=1, max=64)
        ir = extract_ir(lm, (), example_kwargs={"input_ids": ids, "cache_position": torch.arange(ids.shape[1])},
                        dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})

    ``cache_position`` holds the positions of ``input_ids`` in the sequence (``arange(n)`` for a
    prefill of ``n`` tokens, then ``[n]``, ``[n + 1]``, ... for decode steps); the tokens are written
    to the cache at those positions, which must be contiguous and below ``max_cache_len``. The cache
    buffers (``key_cache_{i}``, ``value_cache_{i}``) are non-persistent: they are state, not weights.
    Works the same on the meta device (for extraction) and with real weights (for reference runs).
    """

    def __init__(self, model: nn.Module, max_cache_len: int, batch_size: int = 1, logits_to_keep: int = 0):
        super().__init__()
        # Hugging Face's argument: logits of the last n positions only (0: all). A prefill needs only the last
        # position's, and the vocabulary projection of the others is most of a short prompt's work.
        self.logits_to_keep = logits_to_keep
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer
        from transformers.configuration_utils import get_head_shapes

        self.model = model
        config = model.config.get_text_config(decoder=True)
        self.cache = StaticCache(config=config, max_cache_len=max_cache_len)
        # Sliding-window layers decide where to write in Python, which export cannot follow.
        if any(type(layer) is not StaticLayer for layer in self.cache.layers):
            raise ValueError(
                f"{type(model).__name__} uses sliding-window or other non-static cache layers; "
                "StaticCacheLM supports full-attention decoders only"
            )
        num_heads, head_dim = get_head_shapes(config)
        weight = next(model.parameters())
        self.cache.early_initialization(batch_size, num_heads, head_dim, weight.dtype, weight.device)
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.cache.layers):
            # Re-bind on every call: export swaps the module's buffers for traced stand-ins, and the
            # cache must write into those (not the tensors it was built with) to be seen as mutations.
            layer.keys = getattr(self, f"key_cache_{i}")
            layer.values = getattr(self, f"value_cache_{i}")
            # The layer writes at ``cumulative_length + arange(n)`` and then advances it in place;
            # a copy taken from the input keeps that in-place add off the graph's inputs and state.
            layer.cumulative_length = cache_position[0].clone()
        keep = {"logits_to_keep": self.logits_to_keep} if self.logits_to_keep else {}
        out = self.model(input_ids=input_ids, position_ids=cache_position.unsqueeze(0), past_key_values=self.cache,
                         use_cache=True, **keep)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state



def extract_lm(model: nn.Module, max_cache_len: int, *, name: str | None = None) -> Any:
    """The IR of a Hugging Face causal LM with a static KV cache of ``max_cache_len`` positions and a symbolic
    sequence length ``seq`` (1..max_cache_len): what ``npu_compiler.compile_lm`` turns into prefill and
    decode programs. It returns the logits of the last position only ([1, 1, vocab]), which is all that
    generation reads. ``model`` is best built on the meta device (no weights are read)."""
    from torch.export import Dim

    from . import extract_ir

    if max_cache_len < 2:
        raise ValueError(f"max_cache_len must be at least 2, got {max_cache_len}")
    device = next(model.parameters()).device
    with torch.device(device):
        lm = StaticCacheLM(model, max_cache_len=max_cache_len, logits_to_keep=1)
    example = min(8, max_cache_len)  # not 1: export would specialize a length-1 dimension
    seq = Dim("seq", min=1, max=max_cache_len)
    kwargs = {"input_ids": torch.ones(1, example, dtype=torch.long, device=device),
              "cache_position": torch.arange(example, device=device)}
    ir = extract_ir(lm, (), example_kwargs=kwargs, dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    ir.model_name = name or type(model).__name__
    _unwrapped_keys(ir)
    return ir


def _unwrapped_keys(ir: Any) -> None:
    """State-dict keys as the wrapped model (and its checkpoint) names them: ``model.lm_head.weight`` of the
    wrapper is ``lm_head.weight``; the cache buffers keep their own names."""
    def key(k: str) -> str:
        return k.removeprefix("model.")

    ir.weight_name_mapping = {name: key(k) for name, k in ir.weight_name_mapping.items()}
    ir.weight_aliases = {key(k): [key(t) for t in tied] for k, tied in ir.weight_aliases.items()}
    ir.non_persistent_buffers = {key(k): recipe for k, recipe in ir.non_persistent_buffers.items()}


def without_dynamic_cache(model: nn.Module, kwargs: Mapping[str, Any], error: Exception) -> dict[str, Any] | None:
    """``kwargs`` plus ``use_cache=False`` when export failed because the model returned a ``DynamicCache``.

    A Hugging Face model with ``use_cache=True`` in its config returns its KV cache as a Python object
    that ``torch.export`` cannot put in a graph. Extraction then traces the model again without it, and
    says so; for a KV cache in the IR, wrap the model in :class:`StaticCacheLM`. None when the error is
    another one, or the caller already chose ``use_cache``.
    """
    if "DynamicCache" not in str(error) or "use_cache" in kwargs or "past_key_values" in kwargs:
        return None
    if "use_cache" not in inspect.signature(model.forward).parameters:
        return None
    warnings.warn(
        f"{type(model).__name__} returns a DynamicCache, which torch.export cannot capture: extracting it with "
        "use_cache=False (pass it yourself to skip the failed first trace). For a KV cache in the IR, wrap "
        "the model in torch_ir.frontends.hf.StaticCacheLM.",
        stacklevel=4,
    )
    return {**kwargs, "use_cache": False}
