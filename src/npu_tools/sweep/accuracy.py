"""The accuracy of one model at one quantized precision, measured once per (model, precision) by a sweep: the
float model quantized with ``npu_compiler.quantize.quantize`` (the precision's preset), calibrated on seeded
inputs, and compared with the float model on other seeded inputs by the quantization report's
``compare_quantized``.

* ``sqnr_db``: the output SQNR (the report's ``output_sqnr_db``: the worst graph output);
* ``top1_agreement``: the percentage of positions whose most likely class or token agrees with float (the report's
  ``token_agreement``): an LLM's next-token logits, or a classifier's, a float output of shape [batch, classes];
  blank for other outputs (hidden states, boxes), where an argmax means nothing;
* ``mean_kld``: with it, the mean KL divergence of the two distributions.

Inputs are ``torch_ir.inputs.random_inputs`` (normal floats, valid token ids; the example's values for other
integers), seeded: ``CALIBRATION_SEEDS`` calibrate, ``EVAL_SEEDS`` evaluate (different seeds: a model is not
judged on the samples that set its scales). An LLM is calibrated and evaluated on windows of seeded token ids run
from position 0 (``text_samples``). A seeded network's accuracy measures the quantization of that network, not of
a trained one: compare precisions and layers with it, not a deployment's accuracy.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_ir.ir import NPU_IR

#: The cost model's precision -> the quantizer's preset that makes it (None: a float precision, nothing to measure).
QUANT_PRESETS: dict[str, str | None] = {"fp32": None, "fp16": None, "bf16": None, "w8a8": "w8a8", "w4a8": "w4a8",
                                        "w8a16": "w8a16", "w4a16": "w4a16", "w8a16_int": "16a8w"}
CALIBRATION_SEEDS = (0, 1, 2, 3)
EVAL_SEEDS = (100, 101, 102, 103)
#: An LLM's windows: this many tokens each.
LM_WINDOW = 16
ACCURACY_COLUMNS = ("sqnr_db", "top1_agreement", "mean_kld")


def quant_preset(precision: str) -> str | None:
    """The quantizer's preset for a sweep precision (None: a float one)."""
    return QUANT_PRESETS.get(precision)


def seeded_samples(ir: NPU_IR, spec: Any, seeds: tuple[int, ...]) -> list[dict[str, torch.Tensor]]:
    """One input set per seed, by input name (module docstring)."""
    from npu_compiler.llm import is_lm
    from torch_ir.inputs import index_bounds, random_inputs

    if is_lm(ir):
        from npu_compiler.quantize import text_samples

        vocab = int(ir.metadata.get("vocab_size") or min(index_bounds(ir).values(), default=2))
        g = torch.Generator().manual_seed(seeds[0])
        ids = torch.randint(0, vocab, (LM_WINDOW * len(seeds),), generator=g).tolist()
        return text_samples(ir, ids, len(seeds), LM_WINDOW)
    examples = list(spec.args) if spec is not None and not spec.kwargs else None
    names = [t.name for t in ir.graph_inputs]
    return [dict(zip(names, random_inputs(ir, seed, examples=examples))) for seed in seeds]


def classifier_output(ir: NPU_IR) -> str | bool | None:
    """What ``compare_quantized`` takes as ``logits``: None (an LLM's logits, found by name), a classifier's
    [batch, classes] float output, or False (neither: no top-1)."""
    from npu_compiler.quantize.report.tokens import find_logits

    if find_logits(ir, None) is not None:
        return None
    outs = ir.graph_outputs
    if len(outs) == 1 and outs[0].rank == 2 and outs[0].dtype in ("float32", "float16", "bfloat16"):
        shape = outs[0].shape
        if isinstance(shape[-1], int) and shape[-1] > 1:
            return outs[0].name
    return False


def measure(float_ir: NPU_IR, weights: Any, preset: str, calibration: list, evaluation: list,
            times: dict[str, float]) -> dict[str, Any]:
    """Quantize ``float_ir`` (normalized) with ``preset`` calibrated on ``calibration``, compare on ``evaluation``;
    the accuracy columns. ``times`` gets ``t_calibrate`` (quantize and calibrate) and ``t_evaluate``."""
    import time

    from npu_compiler.quantize import quantize
    from npu_compiler.quantize.report import compare_quantized

    start = time.perf_counter()
    qir, qweights = quantize(float_ir, weights, preset, calibration)
    mid = time.perf_counter()
    report = compare_quantized(float_ir, weights, qir, qweights, evaluation, logits=classifier_output(float_ir))
    times["t_calibrate"] += mid - start
    times["t_evaluate"] += time.perf_counter() - mid
    tokens = report.tokens
    return {"sqnr_db": report.output_sqnr_db,
            "top1_agreement": tokens.top1_pct if tokens is not None else None,
            "mean_kld": tokens.mean_kld if tokens is not None else None}


__all__ = ["ACCURACY_COLUMNS", "CALIBRATION_SEEDS", "EVAL_SEEDS", "QUANT_PRESETS", "classifier_output", "measure",
           "quant_preset", "seeded_samples"]
