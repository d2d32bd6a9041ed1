"""Calibration: the inputs (in memory, a directory of ``.npz`` files, token ids of a text) and the pass that runs
the float IR on them in the reference executor, observing every tensor that will be quantized."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_ir.executor import IRExecutor
from torch_ir.ir import NPU_IR, TensorMeta
from torch_ir.weights import WeightsSource

from .observers import Observer
from .presets import QuantConfig, QuantizeError

Progress = Callable[[int, int], None]
MAX_NPZ_BYTES = 1 << 30  # one calibration file; a larger one is refused before it is read


def samples_from(ir: NPU_IR, calibration: Any, limit: int | None = None) -> list[dict[str, torch.Tensor]]:
    """Calibration samples as dicts of input name -> tensor: a directory of ``.npz`` files (each a dict of input
    name -> array), or a list of dicts, of tuples in input order, or of tensors (a one-input IR)."""
    if isinstance(calibration, (str, os.PathLike)):
        return npz_samples(ir, Path(calibration), limit)
    names = [m.name for m in ir.graph_inputs]
    out = []
    for i, sample in enumerate(calibration):
        if limit is not None and i >= limit:
            break
        if isinstance(sample, Mapping):
            values = dict(sample)
        elif isinstance(sample, (list, tuple)):
            values = dict(zip(names, sample))
        else:
            values = {names[0]: sample} if len(names) == 1 else {}
        out.append(_checked(ir, {k: torch.as_tensor(v) for k, v in values.items()}, f"calibration sample {i}"))
    return out


def npz_samples(ir: NPU_IR, directory: Path, limit: int | None = None) -> list[dict[str, torch.Tensor]]:
    if not directory.is_dir():
        raise QuantizeError(f"calibration directory {str(directory)!r} does not exist or is not a directory; give a "
                            "directory of .npz files (one per sample, input name -> array)")
    files = sorted(directory.glob("*.npz"))
    if not files:
        raise QuantizeError(f"calibration directory {str(directory)!r} holds no .npz file; write one per sample, "
                            f"each with the arrays {[m.name for m in ir.graph_inputs]}")
    out = []
    for path in files[:limit]:
        if path.stat().st_size > MAX_NPZ_BYTES:
            raise QuantizeError(f"calibration file {path}: {path.stat().st_size} bytes, over the "
                                f"{MAX_NPZ_BYTES} bytes one sample may have")
        try:
            with np.load(path, allow_pickle=False) as data:
                values = {k: torch.from_numpy(np.array(data[k])) for k in data.files}
        except (OSError, ValueError) as e:
            raise QuantizeError(f"calibration file {path}: not a readable .npz file ({e})") from None
        out.append(_checked(ir, values, f"calibration file {path}"))
    return out


def _checked(ir: NPU_IR, values: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """One clear error for a sample that does not fit the IR's inputs: the input, what it is and what it needs."""
    names = [m.name for m in ir.graph_inputs]
    missing, extra = [n for n in names if n not in values], [n for n in values if n not in names]
    if missing or extra:
        raise QuantizeError(f"{where}: the IR takes inputs {names}; missing {missing}, unexpected {extra}")
    symbols: dict[str, int] = {}
    for meta in ir.graph_inputs:
        problem = _mismatch(meta, values[meta.name], symbols)
        if problem:
            raise QuantizeError(f"{where}: input {meta.name!r} {problem}; the IR declares {meta.dtype}{meta.shape}")
    return {n: values[n] for n in names}


def _mismatch(meta: TensorMeta, value: torch.Tensor, symbols: dict[str, int]) -> str | None:
    got = str(value.dtype).removeprefix("torch.")
    if got != meta.dtype:
        return f"is {got}"
    if value.dim() != len(meta.shape):
        return f"has shape {list(value.shape)} (rank {value.dim()})"
    for want, size in zip(meta.shape, value.shape):
        if isinstance(want, int) and want != size or isinstance(want, str) and symbols.setdefault(want, size) != size:
            return f"has shape {list(value.shape)}"
    return None


def text_samples(ir: NPU_IR, ids: Sequence[int], samples: int, length: int) -> list[dict[str, torch.Tensor]]:
    """An LLM's calibration samples from a text's token ids: consecutive windows of ``length`` tokens, each run
    from cache position 0 (``input_ids`` [1, T], ``cache_position`` [T])."""
    names = {m.name for m in ir.graph_inputs}
    if names != {"input_ids", "cache_position"}:
        raise QuantizeError(f"calibration text needs an LLM IR (inputs input_ids and cache_position), this one takes "
                            f"{sorted(names)}; give --calibration DIR of .npz files instead")
    if len(ids) < 2:
        raise QuantizeError("the calibration text has fewer than 2 tokens; give a longer text")
    length = max(1, min(length, len(ids)))
    out = []
    for start in range(0, len(ids) - length + 1, length):
        window = torch.tensor(list(ids[start:start + length]), dtype=torch.int64)
        out.append({"input_ids": window[None], "cache_position": torch.arange(length)})
        if len(out) >= samples:
            break
    return out


def calibrate(ir: NPU_IR, weights: WeightsSource, wanted: dict[str, QuantConfig],
              samples: Iterable[dict[str, torch.Tensor]], progress: Progress | None = None,
              ) -> dict[str, tuple[float, float]]:
    """The range (lo, hi) of each tensor in ``wanted`` (name -> the config whose observer watches it), seen by
    running ``ir`` on ``samples`` in the reference executor."""
    samples = list(samples)
    observers = {name: Observer(c.act_observer, c.percentile, seed=i) for i, (name, c) in enumerate(wanted.items())}
    executor = IRExecutor(ir, weights, strict_weights=False)

    def on_node(node: Any, outs: list[torch.Tensor]) -> None:
        for meta, value in zip(node.outputs, outs):
            if meta.name in observers:
                observers[meta.name].observe(value)

    for i, sample in enumerate(samples):
        for name, value in sample.items():
            if name in observers:
                observers[name].observe(value)
        executor.run_traced(sample, on_node)
        if progress is not None:
            progress(i + 1, len(samples))
    return {name: obs.range(str(wanted[name].act_dtype), wanted[name].act_symmetric)
            for name, obs in observers.items()}
