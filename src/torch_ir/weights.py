"""Weights: load them from files or dicts, match them to an IR, save them as safetensors.

The IR names each weight by its graph name (``p_fc1_weight``) and maps it to the state-dict key
(``fc1.weight``); matching goes through that map, tolerates tied weights stored under one of
their names, and reports every problem in one error. ``find_weight_key`` is the one lookup of a
weight among a source's keys; the runtime's ``load_weights`` uses it too, so an IR and a program
compiled from it accept the same files.

:func:`as_tensor` is the one conversion of a value given as a weight or an input (a torch tensor, a
numpy array, anything with ``__dlpack__`` or ``__array__``) into a torch tensor. Non-persistent buffers,
which no state dict holds, are rebuilt from the IR's recipes (:func:`buffer_recipe`, :func:`build_buffer`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram

from .errors import IRValidationError, TorchIRError, WeightsMismatchError
from .fileio import atomic_write, check_output_path, check_regular_file
from .ir import NPU_IR, TensorMeta
from .limits import check_shape
from .ops.values import INLINE_DTYPES, dtype_from_name, dtype_name
from .quant.spec import stored
from .weights_messages import key_lines, nonpersistent_why

WeightsSource = str | os.PathLike | Mapping[str, Any] | torch.nn.Module | ExportedProgram

#: Non-persistent buffers up to this many elements are recorded by value when no shorter recipe fits.
RECIPE_VALUES_LIMIT = 4096


# -- one conversion of array-likes to torch tensors ------------------------------------------------------

def is_array_like(value: Any) -> bool:
    """A value :func:`as_tensor` takes: a tensor, a numpy array or scalar, or an object with ``__dlpack__`` or
    ``__array__`` (Python numbers, strings and containers are not)."""
    if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
        return True
    if isinstance(value, (type, str, bytes, int, float, complex, bool, list, tuple, dict)) or value is None:
        return False
    return hasattr(value, "__dlpack__") or hasattr(value, "__array__")


def as_tensor(value: Any, what: str, error: type[TorchIRError] = WeightsMismatchError) -> torch.Tensor:
    """``value`` as a torch tensor: a ``torch.Tensor`` as it is, a numpy array (or numpy scalar) through
    ``torch.from_numpy``, an object with ``__dlpack__`` (JAX, CuPy, TensorFlow...) through ``torch.from_dlpack``,
    one with ``__array__`` through ``numpy.asarray``. Memory is shared where the source allows it (a read-only or
    negatively strided numpy array is copied). Anything else raises ``error`` naming ``what``.

    Example::

        as_tensor(np.zeros((2, 3), np.float32), "input 'x'")   # tensor of shape [2, 3], float32

    Dtypes are kept as they are: a float64 array stays float64 (the executor then says which dtype it wants).
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return _from_numpy(np.asarray(value), what, error)
    problem = None
    if not isinstance(value, type) and hasattr(value, "__dlpack__"):
        try:
            return torch.from_dlpack(value)
        except Exception as e:  # noqa: BLE001 - a device or dtype torch cannot read; __array__ may still work
            problem = f"torch.from_dlpack failed: {type(e).__name__}: {e}"
    if not isinstance(value, type) and hasattr(value, "__array__") and is_array_like(value):
        try:
            array = np.asarray(value)
        except Exception as e:  # noqa: BLE001 - the object's own conversion failed
            raise error(f"{what}: {_kind(value)} whose __array__ failed ({type(e).__name__}: {e})") from None
        return _from_numpy(array, what, error)
    raise error(
        f"{what} is {_kind(value)}, not a tensor: pass a torch.Tensor, a numpy array, or an object with "
        f"__array__ or __dlpack__" + (f" ({problem})" if problem else ""))


def _from_numpy(array: np.ndarray, what: str, error: type[TorchIRError]) -> torch.Tensor:
    if array.dtype == object or array.dtype.kind in "USV":
        raise error(f"{what} is a numpy array of dtype {array.dtype}, which holds no numbers; pass numbers")
    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        array = np.array(array)  # torch.from_numpy needs writable memory with non-negative strides
    try:
        return torch.from_numpy(array)
    except TypeError as e:
        raise error(f"{what}: numpy dtype {array.dtype} has no torch equivalent ({e})") from None


def exported_program_state(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    """Everything an ``ExportedProgram`` holds for its graph: ``ep.state_dict`` (parameters and persistent
    buffers) and the tensors of ``ep.constants`` (non-persistent buffers, lifted constants), by key.

    Example::

        ir = torch_ir.from_exported_program(ep, "model")
        IRExecutor(ir, exported_program_state(ep))       # or simply IRExecutor(ir, ep)

    Constants the IR holds inline (``lifted_tensor_0``) are accepted and unused.
    """
    state = {k: v.detach() for k, v in ep.state_dict.items()}
    state.update({k: v.detach() for k, v in ep.constants.items() if isinstance(v, torch.Tensor)})
    return state


def load_state_dict(source: WeightsSource) -> dict[str, torch.Tensor]:
    """A ``.safetensors`` or ``.pt``/``.pth``/``.bin`` file, a dict of tensors, a module or an ``ExportedProgram``.

    A dict's values may be numpy arrays or anything else :func:`as_tensor` takes.

    A ``.pt`` file is read with ``torch.load(weights_only=True)``: tensors and plain containers only, never
    arbitrary pickled objects. Anything but a mapping of names to tensors raises ``WeightsMismatchError``.
    """
    if isinstance(source, torch.nn.Module):
        return module_state(source)
    if isinstance(source, ExportedProgram):
        return exported_program_state(source)
    if isinstance(source, Mapping):
        return _checked_state(source, "weights dict")
    if not isinstance(source, (str, os.PathLike)):
        raise WeightsMismatchError(
            f"weights source is a {type(source).__name__}; pass a state dict (a mapping of names to tensors or "
            "arrays), a module, an ExportedProgram, or the path of a .safetensors/.pt file")
    path = Path(source)
    if path.is_dir():
        raise WeightsMismatchError(
            f"weights path {str(path)!r} is a directory; a weights file is expected (.safetensors, .pt or .pth), "
            "e.g. one written by torch_ir.save_weights")
    # not a FIFO or /dev/zero; a .pt is read whole (its size checked), a .safetensors mapped
    check_regular_file(path, "weights file", read_whole=path.suffix != ".safetensors")
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
    bad = [k for k, v in state.items() if not is_array_like(v)]
    if bad:
        shown = ", ".join(f"{k!r:.80} ({_kind(state[k])})" for k in bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise WeightsMismatchError(
            f"{where} holds {len(bad)} value(s) that are not tensors: {shown}; a state dict maps names to "
            f"tensors (or numpy arrays, or objects with __array__ or __dlpack__); {_SAVE_HINT}")
    return {k: as_tensor(v, f"weight {k!r} of the {where}") for k, v in state.items()}


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
    buffers = ir.non_persistent_buffers
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
    missing, unknown_buffers, wrong = [], [], []
    used = set(ir.inlined_constant_keys.values())  # the IR holds these values itself; a source may too
    for meta in wanted:
        key = ir.weight_name_mapping.get(meta.name, meta.name)
        found = find_weight_key(key, meta.name, aliases, state, reverse)
        if found is None and key in buffers and buffers[key] is not None:
            out[meta.name] = build_buffer(buffers[key], meta, f"non-persistent buffer {key!r} of IR {ir.model_name!r}")
            continue
        if found is None:
            (unknown_buffers if key in buffers else missing).append(f"{key} ({meta.dtype}{meta.shape})")
            continue
        used |= tied_keys(found, aliases, reverse)
        tensor = state[found]
        problem = _mismatch(meta, tensor)
        if problem:
            wrong.append(f"{key}: {problem}")
        out[meta.name] = tensor
    unexpected = sorted(set(state) - used) if strict else []
    if missing or unknown_buffers or wrong or unexpected:
        raise _mismatch_report(ir, missing, unknown_buffers, wrong, unexpected)
    constants = {c.name: c for c in ir.constants}
    for name, value in ir.constant_values.items():
        meta = constants.get(name)
        if meta is not None:  # a value of no declared constant is read by nothing
            out[name] = _inline_tensor(value, meta, f"constant {name!r} of IR {ir.model_name!r}")
    return out


def _inline_tensor(value: Any, meta: TensorMeta, what: str) -> torch.Tensor:
    """A value held in the IR (nested lists of numbers) as a tensor of ``meta``'s shape and dtype."""
    dtype = dtype_from_name(meta.dtype)
    try:
        tensor = torch.tensor(value, dtype=dtype)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise IRValidationError(f"{what}: its value is not a {meta.dtype} tensor ({e}); extract the IR again") from None
    if list(tensor.shape) != list(meta.shape):
        raise IRValidationError(f"{what}: its value has shape {list(tensor.shape)}, the IR declares {meta.shape}; "
                                "extract the IR again")
    return tensor


# -- non-persistent buffers: recipes ---------------------------------------------------------------------

def buffer_recipe(value: torch.Tensor | None) -> dict[str, Any] | None:
    """How to rebuild ``value`` without weights, or None: the IR's record of a non-persistent buffer.

    Tried in order: ``{"fill": v}`` (every element equal), ``{"arange": {"start", "end", "step"}}`` (an
    arange with integer start and step, reshaped to the shape or repeated along the leading dimensions, as
    ``torch.arange(n).expand(1, -1)``), ``{"values": nested list}`` (at most ``RECIPE_VALUES_LIMIT`` elements).
    Each also has ``dtype`` and ``shape``. Example::

        buffer_recipe(torch.arange(512).expand((1, -1)))
        # {"arange": {"start": 0, "end": 512, "step": 1}, "dtype": "int64", "shape": [1, 512]}
    """
    if not isinstance(value, torch.Tensor) or value.device.type == "meta" or value.is_complex():
        return None
    try:
        dtype = dtype_name(value.dtype)
    except ValueError:
        return None
    value = value.detach().cpu()
    base = {"dtype": dtype, "shape": list(value.shape)}
    flat = value.reshape(-1)
    if flat.numel() == 0:
        return {"fill": 0, **base}
    first = flat[0]
    same = flat == first if not (value.is_floating_point() and bool(first.isnan())) else flat.isnan()
    if bool(same.all()):
        return {"fill": first.item(), **base}
    arange = _as_arange(value, flat)
    if arange is not None:
        return {"arange": arange, **base}
    if flat.numel() <= RECIPE_VALUES_LIMIT and dtype in INLINE_DTYPES:
        return {"values": value.tolist(), **base}
    return None


def _as_arange(value: torch.Tensor, flat: torch.Tensor) -> dict[str, int] | None:
    if value.dtype == torch.bool or value.dim() == 0:
        return None
    for length in dict.fromkeys((flat.numel(), value.shape[-1])):
        if length < 2:
            continue
        start, second = flat[0].item(), flat[1].item()
        step = second - start
        if not (float(start).is_integer() and float(step).is_integer()) or step == 0:
            return None
        start, step = int(start), int(step)
        ref = torch.arange(start, start + step * length, step, dtype=value.dtype)
        if ref.numel() == length and torch.equal(flat.reshape(-1, length), ref.expand(flat.numel() // length, -1)):
            return {"start": start, "end": start + step * length, "step": step}
    return None


def build_buffer(recipe: dict[str, Any], meta: TensorMeta | None, what: str) -> torch.Tensor:
    """The tensor a recipe of :func:`buffer_recipe` describes, checked against ``meta`` (shape and dtype) and
    against ``torch_ir.limits`` before anything is allocated (recipes come from files)."""
    dtype = dtype_from_name(recipe["dtype"])
    shape = [int(d) for d in recipe["shape"]]
    if meta is not None and (shape != list(meta.shape) or recipe["dtype"] != meta.dtype):
        raise IRValidationError(f"{what}: the recipe makes {recipe['dtype']}{shape}, the IR declares "
                                f"{meta.dtype}{meta.shape}; extract the IR again")
    itemsize = torch.empty((), dtype=dtype).element_size()
    check_shape(shape, itemsize, what)
    numel = math.prod(shape)
    if "values" in recipe:
        return _inline_tensor(recipe["values"], TensorMeta(what, shape, recipe["dtype"]), what)
    try:
        if "fill" in recipe:
            return torch.full(shape, recipe["fill"], dtype=dtype)
        spec = recipe["arange"]
        start, end, step = (Fraction(spec[k]) for k in ("start", "end", "step"))
        length = max(0, math.ceil((end - start) / step))
        if length != numel and not (shape and length == shape[-1]):
            count = length if length < 1 << 63 else "more than 2**63"
            raise IRValidationError(f"{what}: arange({spec['start']}, {spec['end']}, {spec['step']}) has {count} "
                                    f"elements, which neither fill shape {shape} nor match its last dimension")
        ramp = torch.arange(spec["start"], spec["end"], spec["step"], dtype=dtype)
    except (RuntimeError, OverflowError, TypeError, ValueError, ZeroDivisionError) as e:
        if isinstance(e, IRValidationError):
            raise
        raise IRValidationError(f"{what}: the recipe cannot make a {recipe['dtype']} tensor ({e}); "
                                "extract the IR again") from None
    return ramp.reshape(shape) if length == numel else ramp.expand(shape).contiguous()


def _tensor_attribute(model: torch.nn.Module, path: str) -> torch.Tensor | None:
    obj: object = model
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, torch.Tensor) else None


def _mismatch(meta: TensorMeta, tensor: torch.Tensor) -> str | None:
    dtype, shape = stored(meta.dtype, meta.shape)  # 4-bit codes are stored packed, two per byte
    if list(tensor.shape) != list(shape):
        return f"shape {list(tensor.shape)}, IR expects {shape}" + ("" if dtype == meta.dtype else f" ({meta.dtype}"
                                                                     f"{meta.shape} packed)")
    if dtype_name(tensor.dtype) != dtype:
        return f"dtype {dtype_name(tensor.dtype)}, IR expects {dtype}"
    if tensor.device.type == "meta":
        return "is on the meta device (no data); load the real weights"
    return None


def load_weights_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Put the state dict ``state`` into ``model`` as ``torch-ir verify --weights`` does
    (``model.load_state_dict(state, strict=False)``), refusing what that lets pass silently.

    Example::

        load_weights_into(model, load_state_dict("tiny.safetensors"), "weights file 'tiny.safetensors'")

    A weight of the model that ``state`` lacks would keep its seeded random value and a key the model has no
    place for would be dropped, while the report says the file's weights were used: both are a
    ``WeightsMismatchError`` naming ``where`` (as is a shape that differs). Tied weights (one tensor under two
    names, stored once by ``torch_ir.save_weights``) load through either name; non-persistent buffers in
    ``state`` (``module_state`` saves them) are left to the values the model computed when built.
    """
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a shape that differs: refused even with strict=False
        raise WeightsMismatchError(f"{where} does not fit model {type(model).__name__}: {e}") from None
    missing = _not_loaded(model, result.missing_keys)
    buffers = {name for name, _ in model.named_buffers()}
    unexpected = [k for k in result.unexpected_keys if k not in buffers]
    if missing or unexpected:
        problems = [f"{len(keys)} {what} ({_first_keys(keys)})" for keys, what in (
            (missing, "of the model's weights are missing"), (unexpected, "keys name no weight of the model")) if keys]
        raise WeightsMismatchError(f"{where} does not hold the weights of model {type(model).__name__}: "
                                   f"{'; '.join(problems)}; give a file saved from this model's state_dict() "
                                   "(torch.save or torch_ir.save_weights)")


def _not_loaded(model: torch.nn.Module, missing: Sequence[str]) -> list[str]:
    """The ``missing`` keys whose tensor no loaded key shares: a tied weight is loaded through its other name."""
    tensors = model.state_dict(keep_vars=True)  # the tensors themselves: tied names give the same object
    absent = set(missing)
    loaded = {id(t) for k, t in tensors.items() if k not in absent}
    return [k for k in missing if id(tensors[k]) not in loaded]


def _first_keys(keys: Sequence[str], shown: int = 5) -> str:
    return ", ".join(keys[:shown]) + (f", ... and {len(keys) - shown} more" if len(keys) > shown else "")


def _mismatch_report(ir: NPU_IR, missing: list, unknown_buffers: list, wrong: list, unexpected: list
                     ) -> WeightsMismatchError:
    """The error, its fix in Python's words and (``.cli``) in the command line's."""
    lines = [f"weights do not match IR {ir.model_name!r}:"] + key_lines(
        [("missing", missing), ("missing non-persistent buffers", unknown_buffers), ("wrong shape/dtype", wrong),
         ("unexpected", unexpected)])
    python, cli = list(lines), list(lines)
    if unknown_buffers:
        why = nonpersistent_why("the IR")
        python.append(f"{why} Fix: pass the module itself, IRExecutor(ir, model), or its state with every buffer, "
                      "{**model.state_dict(), **dict(model.named_buffers())}; or build the model for extraction "
                      "under torch_ir.build_on_meta(), which records how to rebuild them in the IR.")
        cli.append(f"{why} Fix: extract the IR again with torch-ir extract, which records how to rebuild them.")
    if missing or wrong:
        python.append("Fix: pass the state dict of the model the IR was extracted from (model.state_dict()).")
        cli.append("Fix: give --weights the weights of the model the IR was extracted from.")
    if unexpected:
        python.append("Unexpected keys can be allowed with strict=False.")
        cli.append("Fix: give a weights file holding only this model's weights.")
    return WeightsMismatchError("\n".join(python), cli="\n".join(cli))


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
