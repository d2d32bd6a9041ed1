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

    def __init__(self, model: nn.Module, max_cache_len: int, batch_size: int = 1):
        super().__init__()
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
        out = self.model(
            input_ids=input_ids, position_ids=cache_position.unsqueeze(0), past_key_values=self.cache, use_cache=True
        )
        return out.logits if hasattr(out, "logits") else out.last_hidden_state



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
