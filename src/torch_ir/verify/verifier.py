"""Verify an IR against its model: run both on the same inputs, compare every output.

Eager PyTorch is the trusted implementation. When an output differs, ``localize.py`` finds the
first IR node that departs from the model's re-exported graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import InputMismatchError
from ..executor import IRExecutor
from ..ir import NPU_IR
from ..weights import WeightsSource, as_tensor, is_array_like, load_state_dict, module_state
from .compare import TensorDiff, compare_tensors
from .localize import localize
from .result import VerificationReport


def verify_ir(
    ir: NPU_IR,
    weights: WeightsSource | None,
    original_model: torch.nn.Module,
    test_inputs: Sequence[Any] | torch.Tensor,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    test_kwargs: Mapping[str, Any] | None = None,
) -> tuple[bool, VerificationReport]:
    """Run ``ir`` with ``weights`` and ``original_model`` eagerly on the same inputs; compare outputs.

    Example::

        ok, report = verify_ir(ir, "model.safetensors", model, (x,))
        assert ok, report.to_text()

    ``weights`` is anything ``IRExecutor`` takes (a file, a module, a complete state dict: see
    ``verify_ir_with_state_dict`` for one from ``model.state_dict()``); None takes the model's own.
    Inputs may be torch tensors, numpy arrays or other array-likes (``__array__``, ``__dlpack__``): both
    the IR and the model get them as torch tensors.
    Tolerances are per dtype (``tolerance.DEFAULT_TOLERANCES``) unless ``rtol``/``atol`` are given;
    integer and bool outputs must be equal. The model runs in eval mode without grad; its training
    flag and any buffer its forward mutates are restored afterwards. On failure the report names
    the first diverging IR node. Unsupported ops and mismatched weights raise as in IRExecutor.
    """
    if is_array_like(test_inputs):
        test_inputs = (test_inputs,)
    args = _as_tensors(tuple(test_inputs), "test_inputs")
    kwargs = in_ir_order(ir, _as_tensors(dict(test_kwargs or {}), "test_kwargs"))
    ir_inputs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    weights = module_state(original_model) if weights is None else weights
    actual = IRExecutor(ir, weights).run(ir_inputs)
    was_training = original_model.training
    original_model.eval()
    try:
        expected = run_eager(original_model, args, kwargs)
        outputs, note = _compare_outputs(ir, actual, expected, rtol, atol)
        ok = note is None and all(d.ok for d in outputs)
        where = None if ok else localize(ir, weights, original_model, args, kwargs, ir_inputs, rtol, atol)
    finally:
        original_model.train(was_training)
    return ok, VerificationReport(ir.model_name, ok, outputs, note, where)


def verify_ir_with_state_dict(
    ir: NPU_IR,
    state_dict: WeightsSource,
    original_model: torch.nn.Module,
    test_inputs: Sequence[Any] | torch.Tensor,
    rtol: float | None = None,
    atol: float | None = None,
    test_kwargs: Mapping[str, Any] | None = None,
) -> tuple[bool, VerificationReport]:
    """``verify_ir`` with a state dict that may lack the model's non-persistent buffers.

    Example::

        ok, report = verify_ir_with_state_dict(ir=ir, state_dict=model.state_dict(),
                                               original_model=model, test_inputs=(x,))

    ``model.state_dict()`` leaves out buffers registered with ``persistent=False`` (rotary
    ``inv_freq``, ``position_ids``), which the IR still reads; they are taken from ``original_model``.
    """
    state = load_state_dict(state_dict)
    wanted = set(ir.weight_name_mapping.values())
    for name, buffer in original_model.named_buffers():
        if name in wanted and name not in state:
            state[name] = buffer.detach()
    return verify_ir(ir, state, original_model, test_inputs, rtol, atol, test_kwargs=test_kwargs)


def _as_tensors(tree: Any, what: str) -> Any:
    """Every array-like leaf of ``tree`` as a torch tensor (``torch_ir.weights.as_tensor``); other leaves
    (``use_cache=False``) stay as they are."""
    def convert(path: Any, leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) or not is_array_like(leaf):
            return leaf
        return as_tensor(leaf, f"{what}{pytree.keystr(path)}", InputMismatchError)

    return pytree.tree_map_with_path(convert, tree)


def in_ir_order(ir: NPU_IR, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword inputs sorted as the IR's graph inputs are (they are named after the keywords).

    torch.export flattens keyword inputs in the order they were given, so a caller who passes them
    in another order than at extraction would otherwise feed the IR's inputs swapped.
    """
    position = {t.name: i for i, t in enumerate(ir.graph_inputs)}
    return dict(sorted(kwargs.items(), key=lambda kv: position.get(kv[0], len(position))))


def run_eager(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The model's output tensors, flattened as the IR's outputs are (``tree_leaves``).

    The inputs are cloned and the buffers put back afterwards, so that a forward that updates a
    KV cache or a counter in place leaves the state the IR and the reference graph start from.
    """
    saved = [(m, name, b, b.clone()) for m in model.modules() for name, b in m._buffers.items() if b is not None]
    clone = lambda tree: pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, tree)
    try:
        with torch.no_grad():
            out = model(*clone(args), **clone(dict(kwargs)))
    finally:
        with torch.no_grad():
            for module, name, buffer, copy in saved:
                buffer.copy_(copy)
                module._buffers[name] = buffer  # undoes a forward that rebinds the buffer
    return [t.detach() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _compare_outputs(ir: NPU_IR, actual: list[torch.Tensor], expected: list[torch.Tensor],
                     rtol: float | None, atol: float | None) -> tuple[list[TensorDiff], str | None]:
    diffs = [compare_tensors(m.name, a, e, rtol, atol) for m, a, e in zip(ir.graph_outputs, actual, expected)]
    note = None
    if len(actual) != len(expected):
        note = (f"the model returns {len(expected)} tensors and the IR {len(actual)}; "
                f"only the first {len(diffs)} are compared")
    return diffs, note
