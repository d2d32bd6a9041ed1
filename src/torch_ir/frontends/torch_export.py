"""PyTorch frontend: ``torch.export`` on the meta device, then ExportedProgram -> NPU_IR.

The model's parameters live on the meta device, so export only ever sees shapes and dtypes and
no weight is materialized, however large the model. ``from_exported_program`` does the graph
conversion and is public for users who already hold an ``ExportedProgram``.

The conversion itself lives beside this module: ``export_convert`` (the graph walk), ``export_nodes`` (what
one FX node holds), ``export_values`` (values computed from constants) and ``export_symbols`` (dimension names
and ranges).
"""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from ..errors import ExtractionError
from ..ir import NPU_IR, check_integrity
from .constants import ConstantRecorder, build_on_meta, known_value
from .export_convert import ProgramConverter
from .export_errors import explain_export_failure
from .export_nodes import DROPPED_TARGETS
from .export_quant import decompose_dynamic_qparams
from .export_values import attribute
from .hf import without_dynamic_cache
from .meta_model import attributes_kept, named_state, on_cpu, refuse_leaked_trace_tensors, strays_on_meta

__all__ = ["build_on_meta", "export_program", "extract_ir", "from_exported_program"]


def extract_ir(
    model: torch.nn.Module,
    example_inputs: Sequence[Any] = (),
    model_name: str | None = None,
    dynamic_shapes: Any = None,
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    allow_real_weights: bool = False,
    strict: bool = False,
) -> NPU_IR:
    """Export ``model`` with ``torch.export`` on the meta device and convert it to IR.

    Example::

        with torch.device("meta"):
            model = MyModel()
        ir = extract_ir(model.eval(), (torch.randn(1, 3, 224, 224, device="meta"),))

    ``example_inputs`` are the positional inputs and ``example_kwargs`` the keyword inputs, as
    ``torch.export.export`` takes them; they are moved to the meta device. Weights must be on the
    meta device, so that extraction never needs memory for them; ``allow_real_weights=True`` accepts
    a model with real weights (torch.export then traces with fake copies; nothing is computed).
    A few small real tensors on a model otherwise on the meta device (made in ``__init__`` without the
    default device, as ``torch.Tensor(n).uniform_()`` does) are traced as meta tensors, with a warning
    that names them. Build the model under :func:`build_on_meta` rather than ``torch.device("meta")`` to
    have the IR record how to rebuild its non-persistent buffers, and the values of its tensor attributes.

    Dynamic dimensions keep the names of their ``torch.export.Dim`` (``Dim("batch")`` is ``batch`` in the
    IR). The model is left as it was found: attributes its ``forward`` sets while traced (a detection head
    caching anchors for the input shape) are restored afterwards.
    """
    if not isinstance(model, torch.nn.Module):
        raise ExtractionError(f"extract_ir expects a torch.nn.Module, got {type(model).__name__}")
    name = model_name or type(model).__name__
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    refuse_leaked_trace_tensors(model, name)
    _refuse_shared_inputs(example_inputs, example_kwargs or {}, name)
    with contextlib.nullcontext() if allow_real_weights else strays_on_meta(model, name):
        # Inputs go where the weights are: meta normally, the real device behind the flag.
        device = next((t.device for _, t in named_state(model)), torch.device("meta"))
        args = tuple(_to_device(a, device) for a in example_inputs)
        kwargs = {k: _to_device(v, device) for k, v in (example_kwargs or {}).items()}
        if model.training:
            model = model.eval()  # dropout and batch-norm statistics as in inference
        try:
            ep = export_program(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
        except Exception as e:  # noqa: BLE001 - every export failure is explained, then re-raised
            ep = _export_on_cpu(model, example_inputs, example_kwargs, dynamic_shapes, strict) \
                if device.type == "meta" and _needs_cpu_inputs(e) else None
            if ep is None:
                raise explain_export_failure(e, name) from e
        else:
            if device.type == "meta" and _unknown_constants(ep, model):
                # A tensor an op made from Python data in C++ (the index list of ``x[[1, 2]]``) has no value on
                # meta, and would become a weight nobody has; traced with CPU inputs, it is real.
                retry = _export_on_cpu(model, example_inputs, example_kwargs, dynamic_shapes, strict)
                if retry is not None and not _unknown_constants(retry, model):
                    ep = retry
        return from_exported_program(ep, model_name=name, model=model)


def _refuse_shared_inputs(args: Sequence[Any], kwargs: Mapping[str, Any], name: str) -> None:
    """One tensor object given for two example inputs: torch.export traces one graph input for both (the last), so
    the IR would read one tensor where the model reads two, and any run with two different values would be wrong."""
    seen: dict[int, str] = {}
    for where, value in [*((f"example input {i}", a) for i, a in enumerate(args)),
                         *((f"example keyword input {k!r}", v) for k, v in kwargs.items())]:
        for leaf in pytree.tree_leaves(value):
            if not isinstance(leaf, torch.Tensor):
                continue
            if id(leaf) in seen:
                raise ExtractionError(
                    f"model {name!r}: {seen[id(leaf)]} and {where} are the same tensor object; torch.export would "
                    "trace one input for both and the IR would compute with one value where the model reads two. "
                    "Fix: pass a distinct tensor for each input (e.g. x.clone(), or torch.zeros(...) twice)")
            seen[id(leaf)] = where


def _unknown_constants(ep: ExportedProgram, model: torch.nn.Module) -> bool:
    """Whether a lifted tensor constant of ``ep`` made inside an op is a meta tensor whose value extraction does
    not know. A constant that is a model attribute (a plain tensor attribute) is not: the model supplies it at
    run time, as a weight slot."""
    return any(isinstance(t, torch.Tensor) and t.is_meta and known_value(t) is None
               and not isinstance(attribute(model, key), torch.Tensor) for key, t in ep.constants.items())


#: An export on the meta device that failed for want of a Meta kernel (``geqrf``, ``histogram``, sparse ops)
#: or because an op asserts that an argument is on the CPU (``tensor_split``'s tensor of indices).
_META_ONLY_FAILURE = re.compile(r"Meta tensors|Meta kernel|DispatchKey\.\w*Meta\b|must be on CPU, got meta")


def _needs_cpu_inputs(error: Exception) -> bool:
    return isinstance(error, (NotImplementedError, AssertionError, RuntimeError)) and \
        _META_ONLY_FAILURE.search(f"{error}") is not None


def _export_on_cpu(model: torch.nn.Module, example_inputs: Sequence[Any], example_kwargs: Mapping[str, Any] | None,
                   dynamic_shapes: Any, strict: bool) -> ExportedProgram | None:
    """Export again with the example inputs on the CPU, where an op has no Meta kernel; None when that fails too.

    Only for a model without weights or buffers, so no weight is ever allocated (a model with meta weights would
    mix devices and keeps the meta export's error). torch.export traces the CPU inputs as fake tensors: the CPU
    kernels' shape rules run, no op computes. Meta example inputs become zeros of their shape on the CPU.
    """
    if next(iter(named_state(model)), None) is not None:
        return None
    try:
        args = tuple(on_cpu(a) for a in example_inputs)
        kwargs = {k: on_cpu(v) for k, v in (example_kwargs or {}).items()}
    except Exception:  # noqa: BLE001 - an input that has no CPU form (a meta sparse tensor)
        return None
    try:
        with _recursion_capped(_RETRY_RECURSION_LIMIT):
            return export_program(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception:  # noqa: BLE001 - the meta export's error is the one to explain
        return None


# torch 2.13 can recurse without end tracing some graphs with CPU inputs (``aten.to.dtype_layout`` of a lifted
# constant); under Python's default limit that is a RecursionError the retry reports as "no retry", but a library
# that raised the limit (tinygrad sets 10000) lets it overflow the C stack and kill the process.
_RETRY_RECURSION_LIMIT = 3000


@contextlib.contextmanager
def _recursion_capped(limit: int) -> Iterator[None]:
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(min(previous, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


def export_program(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any] | None = None, *,
                   dynamic_shapes: Any = None, strict: bool = False) -> ExportedProgram:
    """``torch.export`` exactly as ``extract_ir`` runs it (the verifier re-exports with it, so names match).

    Traced with grad disabled, as inference runs. A model that switches grad mode itself
    (Hugging Face's rotary embedding is @torch.no_grad()) would otherwise leave a
    wrap_with_set_grad_enabled higher-order op, which only run_decompositions removes: a second
    full trace, as slow as the export. Constants made in forward from Python data keep their values.
    """
    recorder = ConstantRecorder()
    kwargs = dict(kwargs or {})
    with torch.no_grad(), attributes_kept(model), recorder, warnings.catch_warnings():
        # torch.export puts tensor attributes set by forward back, and says so; attributes_kept does the rest.
        warnings.filterwarnings("ignore", message=r"The tensor attributes? .* (was|were) assigned during export")
        try:
            ep = torch.export.export(model, args, kwargs=kwargs or None, dynamic_shapes=dynamic_shapes, strict=strict)
        except RuntimeError as e:
            retry = without_dynamic_cache(model, kwargs, e)
            if retry is None:
                raise
            ep = torch.export.export(model, args, kwargs=retry, dynamic_shapes=dynamic_shapes, strict=strict)
    if _needs_functionalization(ep):
        ep = ep.run_decompositions({})
    recorder.fill(ep)
    return ep


def from_exported_program(
    ep: ExportedProgram, model_name: str = "model", *, model: torch.nn.Module | None = None
) -> NPU_IR:
    """Convert an ``ExportedProgram`` into IR; its state dict keys become the weight names.

    The weights to run the IR with are the program's own: ``IRExecutor(ir, ep)`` (or
    ``torch_ir.weights.exported_program_state(ep)``, which is ``ep.state_dict`` plus the tensors of
    ``ep.constants``). Small lifted constants are held inline by the IR (``constant_values``); their keys
    are recorded in ``inlined_constant_keys``, so a source that still holds them is accepted.

    In-place ops and higher-order ops (``wrap_with_set_grad_enabled``) are first removed by
    functionalizing the program (``run_decompositions({})``), which is only paid for when the graph
    needs it. That step decomposes nothing from the decomposition table, but it does lower
    CompositeImplicit ops: ``reshape`` becomes ``view``, ``contiguous`` becomes ``clone``, ``to``
    becomes ``_to_copy``.

    A PT2E-quantized program's ``quantized_decomposed`` ops become ``QUANTIZE``/``DEQUANTIZE``, and dynamic
    quantization's ``choose_qparams.tensor`` the ATen ops it computes with (``export_quant``).
    """
    ep = decompose_dynamic_qparams(ep)
    if _needs_functionalization(ep):
        ep = ep.run_decompositions({})
    ir = ProgramConverter(ep, model_name, model).convert()
    check_integrity(ir)
    return ir


def _to_device(value: Any, device: torch.device) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), value)


def _needs_functionalization(ep: ExportedProgram) -> bool:
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator):
            return True
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable and target not in DROPPED_TARGETS:
            return True
    return False
