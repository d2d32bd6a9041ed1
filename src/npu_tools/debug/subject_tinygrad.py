"""Subjects from a tinygrad model and its example inputs; tinygrad is trusted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torch_ir.ir import NPU_IR

from .source_forms import SubjectError
from .subject import Subject, WeightsUsed


def tinygrad_factory(spec: str) -> tuple[Any, list[Any]]:
    from npu_tools.commands.import_tinygrad import default_device, load_factory

    default_device()
    return load_factory(spec)


def subject_from_tinygrad(model: Any, inputs: Sequence[Any], *, name: str | None = None, seed: int = 0,
                          randomize: bool = True) -> Subject:
    """A subject from a tinygrad model (any callable) and its example inputs; tinygrad is trusted.

    Example::

        subject = subject_from_tinygrad(MLP(), [Tensor.empty(2, 16)], name="mlp")

    With ``randomize`` the inputs are seeded random values of the examples' shapes and dtypes (integer
    examples are kept: tinygrad's ``Embedding`` compares with an arange, so nothing in the IR says their
    range); otherwise the given inputs are used as they are. The model is imported on those values, so
    the UOps the IR tensors came from compute exactly the trusted values: ``trusted_values`` realizes them.
    """
    from npu_tools.commands.import_tinygrad import default_device

    default_device()
    import numpy as np
    from tinygrad.tensor import Tensor

    name = name or getattr(model, "__name__", None) or type(model).__name__
    examples = [_to_torch(x) for x in inputs]
    values = _random_like(examples, seed) if randomize else examples
    tensors = [Tensor(np.ascontiguousarray(v.numpy())) for v in values]
    ir, weights, origins = _import_tinygrad_traced(model, tensors, name)
    missing = [t.name for t in ir.graph_outputs if t.name not in origins]
    if missing:  # an input returned as it is: the IR copies it, and no UOp of the model computes it
        raise SubjectError(f"tinygrad model {name!r}: outputs {missing} are computed by no UOp of the model (an "
                           "input returned as it is); return a computed tensor")
    outputs = [origins[t.name] for t in ir.graph_outputs]

    def run_trusted() -> list[torch.Tensor]:
        return [_to_torch(Tensor(u)) for u in outputs]

    def trusted_values() -> dict[str, torch.Tensor]:
        found: dict[str, torch.Tensor] = dict(zip((t.name for t in ir.graph_inputs), values))
        metas = {t.name: t for node in ir.nodes for t in node.outputs if t.name in origins}
        wanted = {n: Tensor(origins[n]) for n in metas}
        try:
            Tensor.realize(*wanted.values())  # one schedule for all: tinygrad compiles once, not once a tensor
        except Exception:  # noqa: BLE001 - a UOp that is no tensor value spoils the batch: each alone below
            pass
        for tensor_name, tensor in wanted.items():
            try:
                value = _to_torch(tensor)
            except Exception:  # noqa: BLE001 - best effort: a UOp that is no tensor value is left out
                continue
            if list(value.shape) == list(metas[tensor_name].shape):
                found[tensor_name] = value
        return found

    return Subject(name=name, ir=ir, weights={k: torch.from_numpy(v) for k, v in weights.items()}, inputs=values,
                   trusted="tinygrad", run_trusted=run_trusted, trusted_values=trusted_values, frontend="tinygrad",
                   weights_used=WeightsUsed.own("the factory's own weights"))


def _import_tinygrad_traced(model: Any, inputs: list[Any], name: str) -> tuple[NPU_IR, dict[str, Any], dict[str, Any]]:
    """What ``import_tinygrad`` returns (the simplified IR, weights) and IR tensor name -> the UOp it came from.

    ``import_tinygrad_traced`` gives the UOp of every tensor of the literal translation; the simplifying rules
    keep the names of the tensors they leave, so the map holds for every name still in the simplified IR
    (a value is used only where its shape is the IR's, see ``subject_from_tinygrad``).
    """
    from torch_ir.frontends.tinygrad.importer import import_tinygrad_traced
    from torch_ir.frontends.tinygrad.rules import simplify_ir
    from torch_ir.ir import check_integrity

    literal, weights, uops = import_tinygrad_traced(model, inputs, model_name=name)
    ir = simplify_ir(literal)
    check_integrity(ir, source=f"tinygrad import of {name!r}")
    live = {t.name for t in ir.tensors()}
    origins = {n: u for n, u in uops.items() if n in live}
    # an output that is an input, a weight or a constant as it is gets a clone node (made from no UOp): its
    # value is its source's; an input's own UOp is the buffer the model was called on
    sources = {n.outputs[0].name: n.inputs[0].name for n in literal.nodes if n.op_type == "aten.clone.default"}
    for meta in ir.graph_outputs:
        source = sources.get(meta.name)
        if meta.name not in origins and source in uops:
            origins[meta.name] = uops[source]
    return ir, weights, origins


def _to_torch(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if hasattr(x, "numpy"):  # a tinygrad Tensor: realizes it
        x = x.numpy()
    import numpy as np

    return torch.from_numpy(np.array(x, copy=True))


def _random_like(examples: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(x.shape, generator=g).to(x.dtype) if x.is_floating_point() else x.clone() for x in examples]
