"""Weights: load them from files or dicts, match them to an IR, save them as safetensors.

The IR names each weight by its graph name (``p_fc1_weight``) and maps it to the state-dict key
(``fc1.weight``); matching goes through that map, tolerates tied weights stored under one of
their names, and reports every problem in one error. ``find_weight_key`` is the one lookup of a
weight among a source's keys; the runtime's ``load_weights`` uses it too, so an IR and a program
compiled from it accept the same files.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

import torch

from .errors import InputNotFoundError, WeightsMismatchError
from .fileio import atomic_write, check_output_path
from .ir import NPU_IR, TensorMeta
from .ops.values import dtype_from_name, dtype_name

WeightsSource = str | os.PathLike | Mapping[str, torch.Tensor] | torch.nn.Module


def load_state_dict(source: WeightsSource) -> dict[str, torch.Tensor]:
    """A ``.safetensors`` or ``.pt``/``.pth``/``.bin`` file, a dict of tensors, or a module.

    A ``.pt`` file is read with ``torch.load(weights_only=True)``: tensors and plain containers only, never
    arbitrary pickled objects. Anything but a mapping of names to tensors raises ``WeightsMismatchError``.
    """
    if isinstance(source, torch.nn.Module):
        return module_state(source)
    if isinstance(source, Mapping):
        return _checked_state(source, "weights dict")
    if not isinstance(source, (str, os.PathLike)):
        raise WeightsMismatchError(
            f"weights source is a {type(source).__name__}; pass a state dict (a mapping of names to tensors), "
            "a module, or the path of a .safetensors/.pt file")
    path = Path(source)
    if path.is_dir():
        raise WeightsMismatchError(
            f"weights path {str(path)!r} is a directory; a weights file is expected (.safetensors, .pt or .pth), "
            "e.g. one written by torch_ir.save_weights")
    if not path.is_file():
        raise InputNotFoundError(f"weights file {str(path)!r} does not exist; check the path")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError, TypeError) as e:
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
        return _checked_state(state, str(path))
    raise WeightsMismatchError(f"{path}: unknown weights format {path.suffix!r}; use .safetensors, .pt or .pth")


_SAVE_HINT = "save with torch.save(model.state_dict(), path) or torch_ir.save_weights"


def _checked_state(state: object, where: str) -> dict[str, torch.Tensor]:
    """``state`` as a dict of tensors keyed by name, or WeightsMismatchError naming ``where`` and the fix."""
    if not isinstance(state, Mapping):
        raise WeightsMismatchError(
            f"{where} holds {_kind(state)}, not a state dict (a mapping of names to tensors); {_SAVE_HINT}")
    bad_keys = [k for k in state if not isinstance(k, str)]
    if bad_keys:
        raise WeightsMismatchError(
            f"{where} has {len(bad_keys)} key(s) that are not names (first: {_kind(bad_keys[0])} {bad_keys[0]!r:.60}); "
            f"a state dict maps str names to tensors; {_SAVE_HINT}")
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        shown = ", ".join(f"{k!r:.80} ({_kind(state[k])})" for k in bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise WeightsMismatchError(
            f"{where} holds {len(bad)} value(s) that are not tensors: {shown}; a state dict maps names to "
            f"tensors; {_SAVE_HINT}")
    return dict(state)


def _kind(value: object) -> str:
    """"a list", "a Tensor", "an int": how a message names a value's type."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def module_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by its state-dict key, non-persistent buffers included."""
    state = dict(model.state_dict(keep_vars=False))
    for name, buf in model.named_buffers():
        state.setdefault(name, buf)
    return {k: v.detach() for k, v in state.items()}


def reverse_aliases(aliases: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """``weight_aliases`` (state-dict key -> the other keys of the same tensor) turned round: alias -> key."""
    return {alias: key for key, others in aliases.items() for alias in others}


def weight_key_candidates(key: str, graph_name: str | None, aliases: Mapping[str, Iterable[str]],
                          reverse: Mapping[str, str] | None = None) -> list[str]:
    """The names a weight may be stored under, in the order they are tried.

    ``key`` (its state-dict key), then the other names of the same tensor (tied weights): the aliases
    of ``key``, or, when ``key`` is itself an alias, the key it is an alias of and that key's other
    aliases; then ``graph_name`` (the IR's name for it, ``p_fc1_weight``). ``aliases`` is
    ``weight_aliases`` (key -> other keys); pass ``reverse=reverse_aliases(aliases)`` when looking up
    many weights, so it is built once.
    """
    reverse = reverse_aliases(aliases) if reverse is None else reverse
    primary = reverse.get(key, key)
    names = [key, *aliases.get(key, ()), primary, *aliases.get(primary, ()), graph_name]
    return list(dict.fromkeys(n for n in names if n))


def find_weight_key(key: str, graph_name: str | None, aliases: Mapping[str, Iterable[str]],
                    available: Collection[str], reverse: Mapping[str, str] | None = None) -> str | None:
    """The name under which ``available`` (a source's keys) holds the weight, or None.

    The one matcher for IR weights (``match_weights``) and program weight slots
    (``npu_runtime.load_weights``). Example: with ``aliases = {"emb.weight": ["head.weight"]}`` a file
    that stored the tied tensor once as ``emb.weight`` serves a weight keyed ``head.weight``::

        find_weight_key("head.weight", "p_head_weight", aliases, {"emb.weight"})  # -> "emb.weight"
    """
    return next((k for k in weight_key_candidates(key, graph_name, aliases, reverse) if k in available), None)


def tied_keys(key: str, aliases: Mapping[str, Iterable[str]], reverse: Mapping[str, str] | None = None) -> set[str]:
    """Every state-dict name of the tensor stored under ``key`` (itself included): a source's keys
    that one weight accounts for, so its tied names are not reported as unused."""
    reverse = reverse_aliases(aliases) if reverse is None else reverse
    primary = reverse.get(key, key)
    return {key, primary, *aliases.get(primary, ())}


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
    aliases = ir.weight_aliases
    reverse = reverse_aliases(aliases)
    out: dict[str, torch.Tensor] = {}
    missing, wrong, used = [], [], set()
    for meta in wanted:
        key = ir.weight_name_mapping.get(meta.name, meta.name)
        found = find_weight_key(key, meta.name, aliases, state, reverse)
        if found is None:
            missing.append(f"{key} ({meta.dtype}{meta.shape})")
            continue
        used |= tied_keys(found, aliases, reverse)
        tensor = state[found]
        problem = _mismatch(meta, tensor)
        if problem:
            wrong.append(f"{key}: {problem}")
        out[meta.name] = tensor
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
    """Save a state dict as ``.safetensors``, keeping one copy of tied tensors.

    Atomic (``torch_ir.fileio.atomic_write``): a temp file with a random name beside ``path``, fsynced, then
    renamed, so concurrent writers and a crash never leave a partial file. An unwritable path raises
    ``OutputWriteError`` before any tensor is copied.
    """
    from safetensors.torch import save

    path = Path(path)
    check_output_path(path, "weights file")
    seen: dict[tuple[int, int], str] = {}
    unique: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise WeightsMismatchError(f"weight {name!r} is {_kind(t)}, not a tensor; save_weights takes a state dict")
        if t.device.type == "meta":
            raise WeightsMismatchError(f"weight {name!r} is on the meta device and has no data to save")
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else (id(t), 0)
        if key in seen:
            continue  # tied: the IR's weight_aliases find it under the first name
        seen[key] = name
        unique[name] = t.detach().contiguous().cpu()
    # bytes, not safetensors.torch.save_file: that one renames its own temp file onto the name it is given
    atomic_write(path, save(unique), what="weights file")
