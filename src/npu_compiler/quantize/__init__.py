"""The toolkit quantizes a float model itself: ``quantize(ir, weights, "w8a8", calibration=samples)``.

    from npu_compiler.quantize import quantize, get_preset
    qir, qweights = quantize(ir, model.state_dict(), "w8a8", calibration=[x0, x1, ...])
    IRExecutor(qir, qweights).run([x])        # the quantized model, run by the reference

The IR is normalized first (CONV/GEMM canonical); the result is in QDQ form at the NPU level: each quantized
weight an integer (int4: packed) weight tensor with its quantization spec, read through DEQUANTIZE; each
quantized activation QUANTIZE -> DEQUANTIZE with the per-tensor scale and zero point calibration found. The
returned weights are keyed by state-dict key, ready for ``torch_ir.weights.save_weights``.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_ir.ir import NPU_IR
from torch_ir.weights import WeightsSource, match_weights

from .calibrate import Progress, calibrate, npz_samples, samples_from, text_samples
from .insert import Builder
from .plan import Site, plan
from .presets import PRESET_DOCS, PRESETS, QuantConfig, QuantizeError, get_preset
from .weights import QuantizedWeight, fold_batch_norm, quantize_weight


def quantize(ir: NPU_IR, weights: WeightsSource, qconfig: QuantConfig | str = "w8a8", calibration: Any = None, *,
             samples: int | None = None, progress: Progress | None = None,
             normalized: bool | None = None) -> tuple[NPU_IR, dict[str, torch.Tensor]]:
    """``ir`` quantized as ``qconfig`` (a ``QuantConfig`` or a preset name) says; returns (IR, weights by key).

    ``calibration``: the inputs whose activation ranges set the activation scales (a list of dicts, tuples or
    tensors, or a directory of ``.npz`` files); needed when the config quantizes activations or the KV cache.
    ``samples`` caps how many are used; ``progress(done, total)`` is called after each. ``normalized``: whether
    ``ir`` is already normalized (default: it is when its metadata says so).
    """
    config = get_preset(qconfig) if isinstance(qconfig, str) else qconfig
    if normalized is None:
        normalized = "normalize" in ir.metadata
    if not normalized:
        from ..passes import normalize

        ir = normalize(ir)
    state, filled = _with_empty_caches(ir, weights)
    sites = plan(ir, config)
    wanted = {ir.nodes[s.node].inputs[pos].name: s.config for s in sites for pos in s.acts}
    wanted.update({ir.nodes[s.node].outputs[0].name: s.config for s in sites if s.output})
    ranges: dict[str, tuple[float, float]] = {}
    if wanted:
        if calibration is None:
            raise QuantizeError(f"{config.name} quantizes activations (or the KV cache): give calibration inputs "
                                "(calibration=[...] or a directory of .npz files; torch-ir quantize --calibration)")
        data = samples_from(ir, calibration, samples)
        if not data:
            raise QuantizeError("no calibration sample was given; give at least one")
        ranges = calibrate(ir, state, wanted, data, progress)
    values = match_weights(ir, state, strict=False)
    builder = Builder(ir, values, ranges)
    builder.rewrite(sites)
    qir, qstate = builder.result({"preset": config.name,
                                  "overrides": [[p, _name(v)] for p, v in config.overrides]})
    if filled:  # the IR says how to rebuild them (zeros), so its weights file need not hold them
        from dataclasses import replace

        from torch_ir.weights import buffer_recipe

        recipes = {k: buffer_recipe(qstate[k]) for k in filled if k in qstate}
        qir = replace(qir, non_persistent_buffers={**qir.non_persistent_buffers, **recipes})
    return qir, {k: v for k, v in qstate.items() if k not in filled}


def _with_empty_caches(ir: NPU_IR, weights: WeightsSource) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The weights as a state dict, with zeros for the non-persistent buffers the graph writes (an LLM's KV cache)
    that the source lacks: a checkpoint never holds them, and a cache starts empty. The result does not store them
    but records their recipe (zeros) in the IR."""
    from torch_ir.ops.values import dtype_from_name
    from torch_ir.weights import load_state_dict

    state = dict(load_state_dict(weights))
    filled = set()
    for meta in ir.weights:
        key = ir.weight_name_mapping.get(meta.name, meta.name)
        if meta.name in ir.mutations and key not in state and key in ir.non_persistent_buffers and meta.is_static:
            state[key] = torch.zeros([int(d) for d in meta.shape], dtype=dtype_from_name(meta.dtype))
            filled.add(key)
    return state, filled


def _name(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else value.name


__all__ = [
    "PRESETS", "PRESET_DOCS", "Progress", "QuantConfig", "QuantizeError", "QuantizedWeight", "Site", "calibrate",
    "fold_batch_norm", "get_preset", "npz_samples", "plan", "quantize", "quantize_weight", "samples_from",
    "text_samples",
]
