"""Check a ``CompiledProgram`` as untrusted data before anything is allocated or run.

A ``.npubin`` file may come from anywhere, and its header says how much memory to allocate, where
each tensor lives and which kernel each dispatch runs. :func:`check_program` re-derives what the
compiler guaranteed, from scratch, so a hostile or corrupt file is refused with a message instead of
allocating a petabyte, reading through Python's negative slicing, overlapping two live tensors (a
silently wrong answer) or naming a kernel the target does not have:

* every spec: a known dtype, dimensions and byte size within ``torch_ir.limits``;
* every state slot: a spec as above, a known initial value, a name no other tensor has, and all the
  state together within the allocation limit;
* every dispatch: a kernel of the kernel table (and of the target that will run it: the kernel set the
  runtime's backend passes in) whose params fit the kernel record's declarations (no unknown param, every
  value of its declared type, a string among its choices, every required param given:
  ``npu_program.params.check_params``, plain data, no torch); or, for a host dispatch (``Dispatch.host``
  set), a bounded name shaped like an op type and params that are bounded JSON (they are the IR node's
  attributes: whether the op registry has the op, may run it and takes those attributes is the runtime's
  check, ``npu_runtime.reference``, which imports the registry); tensors that exist, outputs that are
  activations or state slots (never weights or constants), window params (strides, padding) in range;
* the memory plan: an arena within the limits, every activation at an aligned offset inside it, views
  no larger than their base, and no two tensors live at the same step sharing bytes (the memory
  planner's own independent checker, :func:`~npu_program.memory_check.check_plan`, run again).

Every check is linear (or n log n) in the size of the program: a small file must not cost quadratic time.
The views' roots, for one, are resolved once for all (:func:`~npu_program.memory_check.alias_roots`), not
by walking a view's chain at each use.

Loading a file (``CompiledProgram.load``) and constructing an ``Executor`` both call it. It lives in
``npu_program`` (not the compiler) so that the runtime can run it without importing the compiler.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from torch_ir.dtypes import get_dtype
from torch_ir.errors import IRValidationError, TorchIRError
from torch_ir.ir.validate import check_buffer_recipes
from torch_ir.limits import check_alloc, check_shape
from torch_ir.quant.spec import PACKED, QuantSpec, check_fits, check_spec, stored

from .kernels import KERNELS
from .memory_check import MemoryPlanError, alias_roots, check_plan, lifetimes
from .npubin import NpubinError
from .params import check_json_value, check_params
from .program import STATE_INITS, CompiledProgram, StateSpec, TensorSpec, dtype_size

_FIX = "recompile the model to produce a fresh .npubin file"

#: A host dispatch's kernel is an op type: ``namespace.name.overload`` (an ATen or custom op) or one name (an
#: NPU op such as ``GEMM`` in a dtype the target lacks); identifiers only, so no path or expression passes.
HOST_OP_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*)?")
MAX_HOST_OP_CHARS = 200
MAX_HOST_REASON_CHARS = 2000


def _fail(where: str, problem: str, fix: str = _FIX) -> NpubinError:
    return NpubinError(f"{where}: {problem}; {fix}")


def check_program(program: CompiledProgram, where: str | None = None, *,
                  kernels: Collection[str] | None = None) -> None:
    """Raise ``NpubinError`` (naming ``where``, the rule and the fix) unless ``program`` is safe to run.

    ``kernels`` is the kernel set of the target that will run the program (the runtime's backend passes
    its own, e.g. ``npu_program.kernels.kernels_for("cpu")``): every dispatch must name one of them.
    None (loading a file) checks everything else and leaves the kernel names to whoever runs it.
    """
    where = where or f"program {program.model_name!r}"
    specs = _check_specs(program, where)
    roots = _alias_roots(program, where)
    _check_dispatches(program, specs, roots, where, kernels)
    _check_memory(program, roots, where)


def _check_spec(spec: Any, what: str, where: str) -> None:
    if not isinstance(spec, (TensorSpec, StateSpec)) or not isinstance(spec.name, str) or not spec.name:
        raise _fail(where, f"{what} is not a tensor spec with a name")
    if not isinstance(spec.shape, list):
        raise _fail(where, f"{what} {spec.name!r}: shape {spec.shape!r} is not a list")
    try:
        get_dtype(spec.dtype)
        # 4-bit codes: uint8, two per byte along the last dim; a block layout: its bytes
        dtype, shape = stored(spec.dtype, spec.shape, getattr(spec, "quant", None))
        itemsize = dtype_size(dtype)
    except (ValueError, TypeError) as e:
        raise _fail(where, f"{what} {spec.name!r}: {e}") from None
    odd = not spec.shape or not isinstance(spec.shape[-1], int) or spec.shape[-1] % 2
    if dtype != spec.dtype and spec.dtype in PACKED and odd:
        raise _fail(where, f"{what} {spec.name!r}: {spec.dtype} is stored two per byte along the last dim, which "
                           f"must be even (shape {spec.shape})")
    layout = getattr(spec, "layout", None)  # a state slot has the default layout
    if layout not in (None, "NHWC") or (layout == "NHWC" and len(spec.shape) != 4):
        raise _fail(where, f"{what} {spec.name!r}: layout {layout!r} is not a storage layout of a "
                           f"{len(spec.shape)}-d tensor (None, or NHWC for 4-d)")
    try:
        check_shape(shape, itemsize, f"{where}: {what} {spec.name!r}")
    except TorchIRError as e:
        raise NpubinError(str(e)) from None


def _check_specs(program: CompiledProgram, where: str) -> dict[str, TensorSpec]:
    for name, spec in program.tensors.items():
        _check_spec(spec, "tensor", where)
        if spec.name != name:
            raise _fail(where, f"tensor entry {name!r} holds the spec of {spec.name!r}")
    for spec in program.weight_specs:
        _check_spec(spec, "weight slot", where)
    for kind, items in (("input", program.input_specs), ("output", program.output_specs)):
        for spec in items:
            _check_spec(spec, kind, where)
            known = program.tensors.get(spec.name)
            if known is None or known.shape != spec.shape or known.dtype != spec.dtype:
                raise _fail(where, f"{kind} {spec.name!r} is not a tensor of the program with that shape and dtype")
    weights = {spec.name: spec for spec in program.weight_specs}
    clash = sorted(set(weights) & set(program.tensors))
    if clash:
        raise _fail(where, f"{clash[:5]} are both weight slots and activations")
    state = _check_state(program, weights, where)
    if not isinstance(program.weight_keys, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in program.weight_keys.items()):
        raise _fail(where, "weight_keys must map slot names to state-dict keys (strings)")
    tied = program.metadata.get("weight_aliases", {})
    if not isinstance(tied, dict) or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in tied.values()):
        raise _fail(where, "metadata.weight_aliases must map state-dict keys to lists of tied keys")
    _check_buffer_recipes(program, where)
    _check_quant_specs(program, where)
    return {**program.tensors, **weights, **state}


def _check_quant_specs(program: CompiledProgram, where: str) -> None:
    """Each quantized tensor's spec by the IR's rules (``torch_ir.quant.spec``): a spec of its own (known type,
    granularity fields that agree, constant scales and zero points that fit), of the tensor's dtype and shape, and
    of the shape of each scale or zero-point tensor it names that the program holds. A named tensor the program
    does not hold (no dispatch reads it) is allowed: the spec describes the codes, the ops take their scales as
    inputs."""
    specs = [*program.tensors.values(), *program.weight_specs, *program.input_specs, *program.output_specs]
    shapes = {s.name: s.shape for s in specs}
    for spec in specs:
        quant = getattr(spec, "quant", None)
        if quant is None:
            continue
        here = f"{where}: tensor {spec.name!r} quant"
        if not isinstance(quant, QuantSpec):
            raise _fail(here, f"expected a quantization spec, got {type(quant).__name__}")
        try:
            check_spec(quant, here)
            check_fits(quant, spec.shape, spec.dtype, here, {n: shapes[n] for n in quant.names() if n in shapes})
        except IRValidationError as e:
            raise NpubinError(f"{e}; {_FIX}") from None


def _check_buffer_recipes(program: CompiledProgram, where: str) -> None:
    """``metadata.non_persistent_buffers``: for weight slots that are non-persistent buffers (no checkpoint holds
    them), how ``load_weights`` rebuilds each (null: nobody can). Checked by the IR's own rules (a recipe is data of
    a fixed table of kinds, never code) and against its slot: a recipe that made another shape or dtype would be
    refused at load time anyway, but a file is refused as a whole, before anything is allocated."""
    recipes = program.metadata.get("non_persistent_buffers", {})
    try:
        check_buffer_recipes(recipes, f"{where}: metadata")
    except IRValidationError as e:
        raise NpubinError(f"{e}; {_FIX}") from None
    slots = {program.weight_keys.get(spec.name, spec.name): spec for spec in program.weight_specs}
    for key, recipe in recipes.items():
        spec = slots.get(key)
        if spec is None:
            raise _fail(where, f"metadata.non_persistent_buffers names {key[:80]!r}, which is no weight slot's key")
        if recipe is not None and (recipe["shape"] != spec.shape or recipe["dtype"] != spec.dtype):
            raise _fail(where, f"metadata.non_persistent_buffers[{key[:80]!r}] makes {recipe['dtype']}"
                               f"{recipe['shape']}, its weight slot {spec.name!r} is {spec.dtype}{spec.shape}")


def _check_state(program: CompiledProgram, weights: dict[str, TensorSpec], where: str) -> dict[str, Any]:
    """State slots: valid specs and initial values, names of their own, within the allocation limit together."""
    state: dict[str, Any] = {}
    keys: dict[str, StateSpec] = {}
    for spec in program.state_specs:
        _check_spec(spec, "state slot", where)
        if not isinstance(spec, StateSpec):
            raise _fail(where, f"state slot {spec.name!r} is not a state spec")
        if spec.init not in STATE_INITS:
            raise _fail(where, f"state slot {spec.name!r}: initial value {str(spec.init)[:40]!r} is not one of "
                               f"{', '.join(STATE_INITS)}")
        if spec.shared_key is not None and (not isinstance(spec.shared_key, str) or not spec.shared_key):
            raise _fail(where, f"state slot {spec.name!r}: shared_key must be a non-empty string or null")
        if spec.name in state or spec.name in weights or spec.name in program.tensors:
            raise _fail(where, f"state slot {spec.name!r} has the name of another slot or tensor")
        if spec.key in keys:
            raise _fail(where, f"state slots {keys[spec.key].name!r} and {spec.name!r} share the key {spec.key!r}")
        state[spec.name] = spec
        keys[spec.key] = spec
    try:
        check_alloc(sum(spec.nbytes for spec in program.state_specs), f"{where}: the state slots together")
    except TorchIRError as e:
        raise NpubinError(str(e)) from None
    return state


def _check_dispatches(program: CompiledProgram, specs: dict[str, Any], roots: dict[str, str], where: str,
                      kernels: Collection[str] | None) -> None:
    state = {spec.name for spec in program.state_specs}
    bound = {w.name for w in program.weight_specs} | set(program.constants)  # what exists at bind time
    read_by_runs = state | {s.name for s in program.output_specs}  # what a bind-time dispatch must not write
    for i, d in enumerate(program.dispatches):
        what = f"dispatch {i}"
        if d.at_bind is not False:
            _check_bind_time(d, bound, roots, read_by_runs, what, where)
        if getattr(d, "host", None) is not None:
            _check_host_dispatch(d, what, where)  # an op run on the host: not a kernel of the target
        elif not isinstance(d.kernel, str) or d.kernel not in KERNELS or (kernels is not None
                                                                         and d.kernel not in kernels):
            raise _fail(where, f"{what} names kernel {str(d.kernel)[:80]!r}, which target {program.target!r} does "
                               "not have (a program may only run kernels of its target's table)")
        for name in [*d.inputs, *d.outputs]:
            if not isinstance(name, str) or name not in specs:
                raise _fail(where, f"{what} ({d.kernel}) uses tensor {str(name)[:80]!r}, which has no spec")
        for name in d.outputs:
            if name in state:
                continue
            if name not in program.tensors or name in program.constants:
                raise _fail(where, f"{what} ({d.kernel}) writes {name!r}, which is a weight or constant; "
                                   "dispatches write activations and state slots only")
        _check_params(d, f"{where}: {what} ({d.kernel})")


def _check_params(d: Any, where: str) -> None:
    """A kernel dispatch's params against its record's declarations; a host dispatch's as bounded JSON (its op's
    schema judges them when the runtime binds it). Window params are checked in range either way."""
    if not isinstance(d.params, dict):
        raise NpubinError(f"{where}: params must be an object; {_FIX}")
    host = getattr(d, "host", None) is not None
    declared = {} if host else KERNELS[d.kernel].params
    try:
        if host:
            check_json_value(d.params, f"{where} params")
        else:
            check_params(declared, d.params, len(d.inputs), where)
        for key, value in d.params.items():
            # an empty list is a window param's ATen default (max_pool2d's stride: the kernel size)
            empty_ok = key in declared and declared[key].default == []
            _check_window_param(key, value, f"{where} param {key!r}", empty_ok)
    except ValueError as e:  # a ParamError, or a window param out of range
        raise NpubinError(f"{e}; {_FIX}") from None


def _check_bind_time(d: Any, bound: set[str], roots: dict[str, str], read_by_runs: set[str], what: str,
                     where: str) -> None:
    """A dispatch run once at bind time may read only what exists then (weights, constants, what earlier such
    dispatches wrote) and must not write a graph output or a state slot (``read_by_runs``): otherwise a run
    would read stale bytes."""
    if d.at_bind is not True:
        raise _fail(where, f"{what}: at_bind must be true or false, got {str(d.at_bind)[:40]!r}")
    late = [n for n in d.inputs if roots.get(n, n) not in bound and n not in bound]
    if late or not read_by_runs.isdisjoint(d.outputs):
        raise _fail(where, f"{what} ({d.kernel}) runs at bind time but reads {late[:3] or 'nothing late'} or writes "
                           "a program output or state slot; a bind-time dispatch reads weights and constants only")
    bound.update(d.outputs)


def _check_host_dispatch(d: Any, what: str, where: str) -> None:
    """A host dispatch names an op type (bounded, identifiers and dots only) and says why, briefly."""
    if not isinstance(d.host, str) or not d.host or len(d.host) > MAX_HOST_REASON_CHARS:
        raise _fail(where, f"{what}: host must be a non-empty string of at most {MAX_HOST_REASON_CHARS} characters "
                           "(why the dispatch runs on the host) or null")
    if not isinstance(d.kernel, str) or len(d.kernel) > MAX_HOST_OP_CHARS or not HOST_OP_PATTERN.fullmatch(d.kernel):
        raise _fail(where, f"{what} is a host dispatch naming {str(d.kernel)[:80]!r}, which is not an op type "
                           f"(namespace.name.overload or an NPU op name, identifiers only, at most "
                           f"{MAX_HOST_OP_CHARS} characters)")


#: Window parameters (convolution, pooling) and the least value each element may take. A kernel given a
#: zero stride divides by it in native code (a crash, not an exception), so they are checked here.
_WINDOW_PARAMS = {"stride": 1, "dilation": 1, "kernel_size": 1, "groups": 1, "padding": 0, "output_padding": 0}


def _check_window_param(key: str, value: Any, where: str, empty_ok: bool = False) -> None:
    least = _WINDOW_PARAMS.get(key)
    if least is None or value is None or (key == "padding" and isinstance(value, str)):
        return
    items = value if isinstance(value, list) else [value]
    if (not items and not empty_ok) or not all(type(v) is int and least <= v <= (1 << 31) for v in items):
        raise ValueError(f"{where}: {str(value)[:80]} must be an integer (or a list of integers) of at least {least}")


def _alias_roots(program: CompiledProgram, where: str) -> dict[str, str]:
    """The root of every view of the memory plan, once for all checks; the links must join tensors of the
    program, without a cycle."""
    for name, base in program.memory.aliases.items():
        if name not in program.tensors or not isinstance(base, str) or base not in program.tensors:
            raise _fail(where, f"memory.aliases: {name!r} -> {base!r} links tensors the program does not have")
    try:
        return alias_roots(program.memory.aliases)
    except MemoryPlanError as e:
        raise _fail(where, f"memory.aliases: {e}") from None


def _check_memory(program: CompiledProgram, view_roots: dict[str, str], where: str) -> None:
    memory = program.memory
    for name, value, least in (("arena_bytes", memory.arena_bytes, 0), ("alignment", memory.alignment, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise _fail(where, f"memory.{name} is {value!r}; expected an integer of at least {least}")
    try:
        check_alloc(memory.arena_bytes, f"{where}: the activation arena (memory.arena_bytes)")
    except TorchIRError as e:
        raise NpubinError(str(e)) from None
    roots = {name: view_roots.get(name, name) for name in program.tensors}
    for name, root in roots.items():
        if name != root and program.tensors[name].nbytes > program.tensors[root].nbytes:
            raise _fail(where, f"view {name!r} ({program.tensors[name].nbytes} bytes) is larger than its base "
                               f"{root!r} ({program.tensors[root].nbytes} bytes)")
    used = {n for d in program.dispatches for n in [*d.inputs, *d.outputs]}
    used |= {s.name for s in [*program.input_specs, *program.output_specs]}
    unplaced = [n for n, root in roots.items()
                if n in used and root not in memory.offsets and n not in program.constants]
    if unplaced:
        raise _fail(where, f"tensors {unplaced[:5]} have no offset in the memory plan")
    sizes = {name: program.tensors[name].nbytes for name in memory.offsets if name in program.tensors}
    stray = sorted(set(memory.offsets) - set(sizes))
    if stray:
        raise _fail(where, f"memory.offsets places {stray[:5]}, which are not tensors of the program")
    try:
        pinned = program.bind_outputs  # computed once at bind time, read by every run
        lives = lifetimes([(d.inputs, d.outputs) for d in program.dispatches], sizes,
                          live_in=[*(s.name for s in program.input_specs), *pinned],
                          live_out=[*(s.name for s in program.output_specs), *pinned], aliases=memory.aliases)
        check_plan(lives, memory.offsets, memory.arena_bytes, alignment=memory.alignment)
    except MemoryPlanError as e:
        raise _fail(where, f"the memory plan is invalid: {e}") from None
    for name, offset in memory.offsets.items():  # placed but never touched: still inside the arena
        if not isinstance(offset, int) or offset < 0 or offset + sizes[name] > memory.arena_bytes:
            raise _fail(where, f"tensor {name!r} at offset {offset!r} lies outside the {memory.arena_bytes}-byte arena")


__all__ = ["check_program"]
