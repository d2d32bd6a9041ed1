"""``load_weights``: bind a weights file (or dict) to a program's weight slots, checking every one."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from npu_compiler.compiled_program import CompiledProgram, TensorSpec
from torch_ir.ops.values import dtype_name
from torch_ir.weights import load_state_dict

from .device import Device, NPUBuffer, RuntimeInputError, as_device, new_tensor

WeightsInput = str | os.PathLike | Mapping[str, Any] | torch.nn.Module


class Weights(Mapping[str, NPUBuffer]):
    """A program's weights on a device, by slot name. Made by ``load_weights``; reusable across runs."""

    def __init__(self, program: CompiledProgram, buffers: dict[str, NPUBuffer], unused: list[str]) -> None:
        self.program = program
        self.buffers = buffers
        #: keys of the source that no slot of this program reads (other heads, training-only buffers, ...)
        self.unused = unused

    def __getitem__(self, name: str) -> NPUBuffer:
        return self.buffers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.buffers)

    def __len__(self) -> int:
        return len(self.buffers)

    def __repr__(self) -> str:
        return f"Weights({self.program.model_name!r}, {len(self)} tensors, {len(self.unused)} unused keys)"


def load_weights(source: WeightsInput, program: CompiledProgram, device: Device | Any = None) -> Weights:
    """Load every weight slot of ``program`` from ``source`` onto ``device``.

    ``source`` is a ``.safetensors`` (or ``.pt``/``.pth`` state dict) file, a dict of tensors or arrays
    keyed by state-dict key (the IR's weight names are accepted too), or a module. Every slot is looked
    up and its shape and dtype checked; all problems are reported in one error naming the source. Keys
    the program does not read are allowed and listed in ``Weights.unused``.
    """
    device = as_device(device if device is not None else "cpu")
    where = str(source) if isinstance(source, (str, os.PathLike)) else type(source).__name__
    state = _read(source, where)
    tied = program.metadata.get("weight_aliases", {})
    buffers, missing, wrong, used = {}, [], [], set()
    for spec in program.weight_specs:
        key = program.weight_keys.get(spec.name, spec.name)
        found = next((k for k in [key, *tied.get(key, []), spec.name] if k in state), None)
        if found is None:
            missing.append(f"{key} ({spec.dtype}{list(spec.shape)})")
            continue
        used.add(found)
        array = state[found]
        problem = _mismatch(array, spec)
        if problem:
            wrong.append(f"{found}: {problem}")
            continue
        buffers[spec.name] = NPUBuffer(new_tensor(device, spec, array), spec, device)
    if missing or wrong:
        raise RuntimeInputError(_report(where, program, missing, wrong))
    return Weights(program, buffers, sorted(set(state) - used))


def _read(source: WeightsInput, where: str) -> dict[str, np.ndarray]:
    if isinstance(source, (str, os.PathLike)) and not Path(source).is_file():
        raise RuntimeInputError(f"weights file {where!r} does not exist")
    if isinstance(source, Mapping):
        source = {k: torch.from_numpy(np.asarray(v)) if not isinstance(v, torch.Tensor) else v
                  for k, v in source.items()}
    try:
        state = load_state_dict(source)
    except (OSError, ValueError) as e:
        raise RuntimeInputError(f"cannot read weights from {where}: {e}") from None
    return {k: _host(v) for k, v in state.items()}


def _host(t: torch.Tensor) -> Any:
    """numpy for everything numpy has; bfloat16 stays a tensor (numpy has no bfloat16)."""
    t = t.detach()
    return t if t.dtype == torch.bfloat16 or t.device.type == "meta" else t.cpu().numpy()


def _mismatch(value: Any, spec: TensorSpec) -> str | None:
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        return "is on the meta device (no data); load the real weights"
    dtype = dtype_name(value.dtype) if isinstance(value, torch.Tensor) else value.dtype.name
    if list(value.shape) != list(spec.shape):
        return f"shape {list(value.shape)}, the program expects {list(spec.shape)}"
    if dtype != spec.dtype:
        return f"dtype {dtype}, the program expects {spec.dtype}"
    return None


def _report(where: str, program: CompiledProgram, missing: list[str], wrong: list[str]) -> str:
    lines = [f"weights from {where} do not match program {program.model_name!r}:"]
    for title, items in (("missing", missing), ("wrong shape/dtype", wrong)):
        if items:
            shown = items[:15] + ([f"... and {len(items) - 15} more"] if len(items) > 15 else [])
            lines.append(f"  {title} ({len(items)}): " + "; ".join(shown))
    lines.append("Fix: pass the state dict of the model the program was compiled from "
                 "(torch_ir.save_weights(torch_ir.weights.module_state(model), 'model.safetensors')).")
    return "\n".join(lines)
