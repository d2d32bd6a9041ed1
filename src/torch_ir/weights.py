"""Weights: load them from files or dicts, match them to an IR, save them as safetensors.

The IR names each weight by its graph name (``p_fc1_weight``) and maps it to the state-dict key
(``fc1.weight``); matching goes through that map, tolerates tied weights stored under one of
their names, and reports every problem in one error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from .errors import WeightsMismatchError
from .ir import NPU_IR, TensorMeta
from .ops.values import dtype_from_name, dtype_name

WeightsSource = str | os.PathLike | Mapping[str, torch.Tensor] | torch.nn.Module


def load_state_dict(source: WeightsSource) -> dict[str, torch.Tensor]:
    """A ``.safetensors`` or ``.pt``/``.pth``/``.bin`` file, a dict of tensors, or a module."""
    if isinstance(source, torch.nn.Module):
        return module_state(source)
    if isinstance(source, Mapping):
        bad = [k for k, v in source.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise WeightsMismatchError(f"weights dict has non-tensor values under {bad[:5]}; pass a state dict")
        return dict(source)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise WeightsMismatchError(f"{path}: not a readable safetensors file ({e})") from None
    if path.suffix in (".pt", ".pth", ".bin"):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch.load raises many kinds; the message is what matters
            raise WeightsMismatchError(
                f"{path}: cannot load as a state dict with weights_only=True ({type(e).__name__}: {e}). "
                "Only plain state dicts are read (never arbitrary pickles); save with torch.save(model.state_dict())"
            ) from None
        if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
            state = state["state_dict"]
        return load_state_dict(state)
    raise WeightsMismatchError(f"{path}: unknown weights format {path.suffix!r}; use .safetensors, .pt or .pth")


def module_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by its state-dict key, non-persistent buffers included."""
    state = dict(model.state_dict(keep_vars=False))
    for name, buf in model.named_buffers():
        state.setdefault(name, buf)
    return {k: v.detach() for k, v in state.items()}


def match_weights(ir: NPU_IR, source: WeightsSource | None, *, strict: bool = True) -> dict[str, torch.Tensor]:
    """Map the IR's weights (and constants without inline values) to tensors, checking every one.

    Raises WeightsMismatchError listing all missing, wrong-shape, wrong-dtype and (when ``strict``)
    unexpected entries at once.
    """
    state = load_state_dict(source) if source is not None else {}
    wanted = list(ir.weights) + [c for c in ir.constants if c.name not in ir.constant_values]
    if isinstance(source, torch.nn.Module):
        # plain tensor attributes (self.c = torch.tensor(...)) are lifted constants, not in the state dict
        for meta in wanted:
            key = ir.weight_name_mapping.get(meta.name, meta.name)
            value = _tensor_attribute(source, key)
            if key not in state and value is not None:
                state[key] = value.detach()
    aliases = {alias: key for key, others in ir.weight_aliases.items() for alias in others}
    out: dict[str, torch.Tensor] = {}
    missing, wrong, used = [], [], set()
    for meta in wanted:
        key = ir.weight_name_mapping.get(meta.name, meta.name)
        candidates = [key, *ir.weight_aliases.get(key, []), aliases.get(key), meta.name]
        found = next((k for k in candidates if k is not None and k in state), None)
        if found is None:
            missing.append(f"{key} ({meta.dtype}{meta.shape})")
            continue
        used.add(found)
        tensor = state[found]
        problem = _mismatch(meta, tensor)
        if problem:
            wrong.append(f"{key}: {problem}")
        out[meta.name] = tensor
    used |= {a for k in used for a in ir.weight_aliases.get(k, [])} | {aliases[k] for k in used if k in aliases}
    unexpected = sorted(set(state) - used) if strict else []
    if missing or wrong or unexpected:
        raise WeightsMismatchError(_mismatch_report(ir, missing, wrong, unexpected))
    for name, value in ir.constant_values.items():
        meta = next(c for c in ir.constants if c.name == name)
        out[name] = torch.tensor(value, dtype=dtype_from_name(meta.dtype))
    return out


def _tensor_attribute(model: torch.nn.Module, path: str) -> torch.Tensor | None:
    obj: object = model
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, torch.Tensor) else None


def _mismatch(meta: TensorMeta, tensor: torch.Tensor) -> str | None:
    if list(tensor.shape) != list(meta.shape):
        return f"shape {list(tensor.shape)}, IR expects {meta.shape}"
    if dtype_name(tensor.dtype) != meta.dtype:
        return f"dtype {dtype_name(tensor.dtype)}, IR expects {meta.dtype}"
    if tensor.device.type == "meta":
        return "is on the meta device (no data); load the real weights"
    return None


def _mismatch_report(ir: NPU_IR, missing: list, wrong: list, unexpected: list) -> str:
    lines = [f"weights do not match IR {ir.model_name!r}:"]
    for title, items in (("missing", missing), ("wrong shape/dtype", wrong), ("unexpected", unexpected)):
        if items:
            shown = items[:15] + ([f"... and {len(items) - 15} more"] if len(items) > 15 else [])
            lines.append(f"  {title} ({len(items)}): " + "; ".join(shown))
    lines.append(
        "Fix: pass the state dict of the model the IR was extracted from (model.state_dict()); "
        "unexpected keys can be allowed with strict=False."
    )
    return "\n".join(lines)


def save_weights(state: Mapping[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Save a state dict as ``.safetensors``, keeping one copy of tied tensors; atomic."""
    from safetensors.torch import save_file

    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot save weights to {str(path)!r}: directory {str(path.parent)!r} does not exist")
    seen: dict[tuple[int, int], str] = {}
    unique: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if t.device.type == "meta":
            raise WeightsMismatchError(f"weight {name!r} is on the meta device and has no data to save")
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else (id(t), 0)
        if key in seen:
            continue  # tied: the IR's weight_aliases find it under the first name
        seen[key] = name
        unique[name] = t.detach().contiguous().cpu()
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_file(unique, str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

