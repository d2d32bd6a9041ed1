"""Subjects from PyTorch: a zoo name, a ``module:factory`` or a Hugging Face model (``subject_from_spec``), and a
built model with its example inputs (``subject_from_torch``); eager PyTorch is trusted."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from torch_ir.errors import ExtractionError, TorchIRError
from torch_ir.inputs import random_inputs
from torch_ir.ir import NPU_IR

from .source_forms import SubjectError, bad_source
from .subject import Subject, WeightsUsed, given_inputs, given_weights


def subject_from_spec(spec: str, *, inputs: Sequence[Any] | None, seed: int, weights: Any = None) -> Subject:
    """The subject of a zoo name, a ``module:factory`` or a Hugging Face model (``load_subject``'s "torch" form);
    ``weights``, when given, are loaded into the model it builds."""
    from npu_tools.zoo.runner import resolve_spec
    from torch_ir.weights import load_state_dict, load_weights_into

    # given weights are read first: a missing or unreadable file is told before the factory runs
    state = load_state_dict(weights) if weights is not None else None
    try:
        resolved = resolve_spec(spec)
    except ExtractionError:
        raise
    except TorchIRError as e:  # an unknown zoo name: say every form, not only the two of a spec
        raise bad_source(f"cannot bisect {spec!r}: {e}; the source may be {{accepted}}") from None
    model = resolved.build("cpu")  # seeded by the build itself (the zoo entry's seed, 0 for a factory)
    if state is not None:
        load_weights_into(model, state, _weights_where(weights))
    used = given_weights(weights) if weights is not None else _own_weights(spec, resolved)
    return _torch_subject(_extract_spec(resolved, model), model, resolved.args, resolved.kwargs, name=resolved.name,
                          inputs=inputs, seed=seed, weights_used=used)


def _extract_spec(resolved: Any, model: torch.nn.Module) -> NPU_IR:
    """The IR of a spec's model, extracted from a second build on meta as every command extracts it; for a factory
    that cannot run under the meta device (``from_pretrained`` loads real tensors and refuses it), from meta copies
    of ``model``'s tensors instead, so such a factory can be the trusted source. (A factory that fails everywhere
    already failed building ``model``, with its whole error.)"""
    try:
        meta_model = resolved.build("meta")
    except ExtractionError:
        return _extract_on_meta_copies(model, resolved.args, resolved.kwargs, resolved.name, resolved.dynamic_shapes)
    return resolved.extract(meta_model)


def _own_weights(spec: str, resolved: Any) -> WeightsUsed:
    """The weights a zoo model, a factory or a Hugging Face model is built with when none are given."""
    if resolved.weights is not None:  # a Hugging Face model: its checkpoint's, or seeded ones for a config alone
        return WeightsUsed.own(resolved.weights)
    if ":" in spec:  # the factory runs after torch.manual_seed(0): random weights it draws are seeded
        return WeightsUsed.own("the factory's own weights")
    from npu_tools.zoo import get_model

    entry = get_model(spec)
    return WeightsUsed.own("the zoo model's pretrained weights") if entry.real_weights \
        else WeightsUsed.seeded(entry.seed)


def _weights_where(weights: Any) -> str:
    """How a message names given weights: the file, or what was passed in Python."""
    if isinstance(weights, (str, os.PathLike)):
        return f"weights file {os.fspath(weights)!r}"
    return f"the weights given (a {type(weights).__name__})"


def subject_from_torch(model: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None, *,
                       name: str | None = None, inputs: Sequence[Any] | None = None, seed: int = 0,
                       dynamic_shapes: Any = None) -> Subject:
    """A subject from a built PyTorch model (real weights) and its example inputs.

    Example::

        subject = subject_from_torch(MyNet().eval(), (torch.randn(2, 8),), name="mynet")

    The IR is extracted as the zoo does, on meta copies of the weights (``extract_ir`` never computes);
    eager PyTorch on the real weights is trusted, and the re-exported graph gives the values of every
    IR tensor (``trusted_values``).
    """
    name = name or type(model).__name__
    model = model.eval()
    kwargs = dict(kwargs or {})
    ir = _extract_on_meta_copies(model, tuple(args), kwargs, name, dynamic_shapes)
    return _torch_subject(ir, model, tuple(args), kwargs, name=name, inputs=inputs, seed=seed,
                          weights_used=WeightsUsed.own("the model's own weights"))


def _extract_on_meta_copies(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], name: str,
                            dynamic_shapes: Any) -> NPU_IR:
    from torch_ir.frontends import extract_ir
    from torch_ir.frontends.meta_model import on_meta

    with on_meta(model, remember=True):  # the conditions of a meta extraction, without a second model
        return extract_ir(model, tuple(args), model_name=name, example_kwargs=dict(kwargs),
                          dynamic_shapes=dynamic_shapes)


def _torch_subject(ir: NPU_IR, model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], *, name: str,
                   inputs: Sequence[Any] | None, seed: int, weights_used: WeightsUsed) -> Subject:
    from torch_ir.verify.verifier import in_ir_order, run_eager
    from torch_ir.weights import module_state

    kwargs = in_ir_order(ir, kwargs)
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    if len(slots) != len(ir.graph_inputs):
        raise SubjectError(f"model {name!r}: {len(slots)} example tensors but the IR has {len(ir.graph_inputs)} "
                           "graph inputs; pass the inputs the model was extracted with")
    examples = [leaves[i] for i in slots]
    values = given_inputs(ir, inputs, name) if inputs is not None else random_inputs(ir, seed, examples=examples)
    for i, value in zip(slots, values):
        leaves[i] = value
    args, kwargs = pytree.tree_unflatten(leaves, spec)

    def run_trusted() -> list[torch.Tensor]:
        return run_eager(model, args, kwargs)

    def trusted_values() -> dict[str, torch.Tensor]:
        return _torch_values(ir, model, args, kwargs)

    return Subject(name=name, ir=ir, weights=module_state(model), inputs=list(values), trusted="eager PyTorch",
                   run_trusted=run_trusted, trusted_values=trusted_values, frontend="torch.export",
                   weights_used=weights_used)


def _torch_values(ir: NPU_IR, model: torch.nn.Module, args: tuple,
                  kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Every IR tensor's value in the re-exported graph, by name; only the names that line up.

    The re-export whose names are the IR's is used (see ``verify/reference.py``). When neither lines up
    whole, the one with the later first misaligned node is used up to that node: after an extra node every
    later FX name shifts, so a same-named value further on may be another op's and is left out.
    """
    from torch_ir.verify.reference import EXPORT_MODES, aligned_prefix, export_reference, run_reference

    best: tuple[int, Any] | None = None
    for mode in EXPORT_MODES:
        try:
            ep = export_reference(ir, model, args, kwargs, mode)
        except Exception:  # noqa: BLE001 - a failed re-export leaves the other mode, or no intermediates
            continue
        good = aligned_prefix(ir, ep)
        if best is None or good > best[0]:
            best = (good, ep)
        if good == len(ir.nodes):
            break
    if best is None or best[0] == 0:
        return {}
    good, ep = best
    values = run_reference(ep, model, args, kwargs)
    names = {t.name: t for t in [*ir.graph_inputs, *ir.weights, *ir.constants]}
    names.update({t.name: t for node in ir.nodes[:good] for t in node.outputs})
    return {n: v for n, v in values.items() if n in names and list(v.shape) == _dims(names[n].shape, v)}


def _dims(shape: Sequence[Any], value: torch.Tensor) -> list[int]:
    """The IR shape with symbolic dimensions taken from the value (they are checked elsewhere)."""
    return [d if isinstance(d, int) else value.shape[i] for i, d in enumerate(shape)] if len(shape) == value.dim() \
        else list(shape)
