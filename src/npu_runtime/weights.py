"""``load_weights``: bind a weights file (or dict) to a program's weight slots, checking every one."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from npu_program.dynamic import DynamicProgram
from npu_program.program import CompiledProgram, TensorSpec
from torch_ir import dtypes
from torch_ir.errors import TorchIRError
from torch_ir.ir import TensorMeta
from torch_ir.weights import build_buffer, find_weight_key, load_state_dict, reverse_aliases, tied_keys
from torch_ir.weights_messages import key_lines, nonpersistent_why

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


def already_loaded(weights: Any) -> bool:
    """Whether ``weights`` are on a device already (a ``load_weights`` result, or buffers by slot name), rather than
    a source ``load_weights`` reads."""
    return isinstance(weights, Weights) or (isinstance(weights, Mapping) and
                                            all(isinstance(v, NPUBuffer) for v in weights.values()))


def weights_required(program: CompiledProgram | DynamicProgram) -> RuntimeInputError:
    """The error of a run without weights of a program that has weight slots."""
    return RuntimeInputError(f"program {program.model_name!r} has {len(program.weight_specs)} weight slots and no "
                             "weights were given: pass weights=npu_runtime.load_weights(path, program, device)")


def load_weights(source: WeightsInput, program: CompiledProgram | DynamicProgram,
                 device: Device | Any = None) -> Weights:
    """Load every weight slot of ``program`` from ``source`` onto ``device``.

    ``source`` is a ``.safetensors`` (or ``.pt``/``.pth`` state dict) file, a dict of tensors or arrays
    keyed by state-dict key (the IR's weight names are accepted too), or a module. Every slot is looked
    up (``torch_ir.weights.find_weight_key``: its key, the other names of a tied tensor, its graph name)
    and its shape and dtype checked; all problems are reported in one error naming the source. Keys
    the program does not read are allowed and listed in ``Weights.unused``.

    A slot that is a non-persistent buffer (BERT's ``position_ids``: ``model.state_dict()`` and checkpoints never
    hold one) and that the source lacks is rebuilt from the program's recipe
    (``metadata["non_persistent_buffers"]``, carried over from the IR), so the model's own state dict loads; one
    without a recipe is named as such, with the fix. A ``DynamicProgram``'s variants share one weight table: it is
    loaded once for all of them.
    """
    if isinstance(program, DynamicProgram):
        program = program.weight_program
    device = as_device(device if device is not None else "cpu")
    where = str(source) if isinstance(source, (str, os.PathLike)) else type(source).__name__
    state = _read(source, where)
    tied = program.metadata.get("weight_aliases", {})
    recipes = program.metadata.get("non_persistent_buffers", {})
    reverse = reverse_aliases(tied)
    cast = _cast_slots(program)
    buffers, missing, unknown_buffers, wrong, used = {}, [], [], [], set()
    for spec in program.weight_specs:
        key = program.weight_keys.get(spec.name, spec.name)
        found = find_weight_key(key, spec.name, tied, state, reverse)  # the IR's matcher: same files load
        if found is None and recipes.get(key) is not None:
            array = _rebuilt(recipes[key], spec, key, program)
        elif found is None:
            (unknown_buffers if key in recipes else missing).append(f"{key} ({spec.dtype}{list(spec.shape)})")
            continue
        else:
            used |= tied_keys(found, tied, reverse)
            array = _host(state[found], found, where)  # only the tensors a slot reads are converted
            if spec.name in cast:
                array = _into_precision(array, spec, cast[spec.name])
            problem = _mismatch(array, spec)
            if problem:
                wrong.append(f"{found}: {problem}")
                continue
        buffers[spec.name] = NPUBuffer(new_tensor(device, spec, array), spec, device)
    if missing or unknown_buffers or wrong:
        python, cli = _report(where, program, missing, unknown_buffers, wrong, len(state))
        raise RuntimeInputError(python, cli=cli)
    return Weights(program, buffers, sorted(set(state) - used))


def _cast_slots(program: CompiledProgram) -> dict[str, str]:
    """The weight slots a ``CompileOptions.precision`` program computes in another float dtype than the model's
    weights have: slot -> the model's dtype (``metadata["precision"]["weights"]``; anything else there is ignored,
    and the slot's dtype is then checked as usual)."""
    record = program.metadata.get("precision")
    weights = record.get("weights") if isinstance(record, dict) else None
    if not isinstance(weights, dict):
        return {}
    return {k: v for k, v in weights.items() if isinstance(k, str) and isinstance(v, str)}


def _into_precision(value: Any, spec: TensorSpec, source_dtype: str) -> Any:
    """A weight of the model's float dtype rounded (to nearest even) into the program's compute dtype; a value of
    any other dtype is left for the usual check, which names both."""
    if not hasattr(value, "dtype") or dtypes.name_of(value.dtype) != source_dtype:
        return value
    target = dtypes.torch_dtype(spec.dtype)
    if not (target.is_floating_point and dtypes.torch_dtype(source_dtype).is_floating_point):
        return value  # only float to float: a program file cannot turn integer codes into values this way
    return torch.as_tensor(value).to(target)


def _rebuilt(recipe: dict[str, Any], spec: TensorSpec, key: str, program: CompiledProgram) -> Any:
    """A non-persistent buffer made from its recipe: data evaluated by ``build_buffer``'s fixed table of kinds
    (arange, fill, values), checked against the slot and ``torch_ir.limits`` before anything is allocated."""
    what = f"non-persistent buffer {key!r} of program {program.model_name!r}"
    try:
        value = build_buffer(recipe, TensorMeta(spec.name, list(spec.shape), spec.dtype), what)
    except TorchIRError as e:
        raise RuntimeInputError(str(e)) from None
    return _host(value, key, what)


def _read(source: WeightsInput, where: str) -> Mapping[str, Any]:
    """The source's tensors (or arrays) by key, unconverted: a tensor of a dtype numpy lacks (float8, ...)
    under a key no slot reads must not stop the load. Any unreadable source -> RuntimeInputError naming it."""
    if isinstance(source, Mapping):
        bad = [k for k in source if not isinstance(k, str)]
        if bad:
            raise RuntimeInputError(f"weights dict has {len(bad)} key(s) that are not names (first: {bad[0]!r:.60}); "
                                    "key it by state-dict name (model.state_dict())")
        return source
    try:
        return load_state_dict(source)
    except (TorchIRError, OSError, ValueError, TypeError) as e:
        message = str(e) if where in str(e) else f"cannot read weights from {where}: {e}"
        raise RuntimeInputError(message) from None


def _host(value: Any, key: str, where: str) -> Any:
    """numpy for everything numpy has; a tensor numpy cannot hold (bfloat16, float8, ...) stays a tensor and
    is then checked against the slot's dtype like any other."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise RuntimeInputError(f"weight {key!r} from {where} is an array of Python objects, not numbers; "
                                    "pass numeric arrays or tensors")
        return value
    if not isinstance(value, torch.Tensor):
        try:
            array = np.asarray(value)
        except Exception as e:  # noqa: BLE001 - any value can be passed in a dict
            raise RuntimeInputError(f"weight {key!r} from {where} is a {type(value).__name__}, not an array "
                                    f"({e}); pass tensors or numpy arrays") from None
        return _host(array, key, where)
    t = value.detach()
    if t.dtype == torch.bfloat16 or t.device.type == "meta" or t.layout != torch.strided:
        return t
    try:
        return t.cpu().numpy()
    except TypeError:  # a dtype numpy has no type for
        return t


def _mismatch(value: Any, spec: TensorSpec) -> str | None:
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        return "is on the meta device (no data); load the real weights"
    if isinstance(value, torch.Tensor) and value.layout != torch.strided:
        return f"is a {str(value.layout).removeprefix('torch.')} tensor; store it dense (tensor.to_dense())"
    dtype = dtypes.name_of(value.dtype)
    want_dtype, want_shape = spec.storage  # 4-bit codes are stored packed, two per byte, as uint8
    packed = "" if want_dtype == spec.dtype else f" ({spec.dtype}{list(spec.shape)} packed two per byte)"
    if list(value.shape) != list(want_shape):
        return f"shape {list(value.shape)}, the program expects {list(want_shape)}{packed}"
    if dtype != want_dtype:
        return f"dtype {dtype}, the program expects {want_dtype}{packed}"
    return None


def _report(where: str, program: CompiledProgram, missing: list[str], unknown_buffers: list[str], wrong: list[str],
            held: int) -> tuple[str, str]:
    """A short summary (the first few of each list; ``TORCH_IR_FULL_ERRORS=1`` lists every key) and its fix, in
    Python's words and in the command line's."""
    lines = [f"weights from {where} do not match program {program.model_name!r}"]
    if len(missing) == len(program.weight_specs) and not wrong:
        lines.append(f"  none of its {len(missing)} weights is in the file, which holds {held} other tensor(s): "
                     "these are the weights of another model")
    lines += key_lines([("missing", missing), ("missing non-persistent buffers", unknown_buffers),
                        ("wrong shape/dtype", wrong)])
    python, cli = list(lines), list(lines)
    if unknown_buffers:
        why = nonpersistent_why("the program")  # the IR executor's diagnosis, for the same cause
        python.append(f"{why} Fix: pass the module itself, load_weights(model, program, device), or its state with "
                      "every buffer, {**model.state_dict(), **dict(model.named_buffers())}; or build the model for "
                      "extraction under torch_ir.build_on_meta() and compile again: the program then rebuilds them.")
        cli.append(f"{why} Fix: extract and compile the model again with torch-ir (it builds models under "
                   "build_on_meta, which records how to rebuild them), or save the weights with every buffer: "
                   "torch_ir.save_weights(torch_ir.weights.module_state(model), FILE).")
    if missing or wrong:
        fix = ("Fix: give the weights of the model the program was compiled from (torch-ir extract MODEL "
               "--save-weights FILE writes seeded ones; from Python, torch_ir.save_weights(module_state(model), FILE))")
        python.append(fix)
        cli.append(fix)
    return "\n".join(python), "\n".join(cli)
