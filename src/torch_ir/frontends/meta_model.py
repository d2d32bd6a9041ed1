"""Preparing a model for extraction: real tensors a meta-built model holds by accident, attributes a trace
leaves behind, example inputs moved to the CPU for ops without a Meta kernel.

torch.export traces the model as it is; these helpers make sure that what it traces is the meta-device model
the user meant, and that the model is left as it was afterwards.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import ExtractionError
from .constants import remember_value

# Real elements a meta-built model may hold by accident (strays of __init__) and still be traced on meta.
_STRAY_LIMIT = 1 << 16


def on_cpu(value: Any) -> Any:
    """The tensors of ``value`` on the CPU; a meta tensor (no data) becomes zeros of its shape and dtype."""
    def move(t: torch.Tensor) -> torch.Tensor:
        if t.is_meta:
            return torch.zeros(t.shape, dtype=t.dtype).to_sparse(layout=t.layout) if t.layout != torch.strided \
                else torch.zeros(t.shape, dtype=t.dtype)
        return t.to("cpu")
    return pytree.tree_map_only(torch.Tensor, move, value)


@contextlib.contextmanager
def strays_on_meta(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Refuse a model with real weights; trace the few small real tensors of a meta-built model as meta.

    A model built under ``torch.device("meta")`` can still hold a real tensor made without the default
    device (transformers' Wav2Vec2 makes ``masked_spec_embed`` with ``torch.Tensor(n).uniform_()``); the user
    cannot fix that. When the model is otherwise on the meta device and the real tensors are few (at most
    ``_STRAY_LIMIT`` elements in all), they are swapped for meta copies during extraction, with a warning that
    names them, and put back afterwards. A model whose weights are real is refused, as before.
    """
    state = list(named_state(model))
    real = [(n, t) for n, t in state if t.device.type != "meta"]
    if not real:
        yield
        return
    distinct = {id(t): t for _, t in real}
    real_numel = sum(t.numel() for t in distinct.values())
    meta_numel = sum({id(t): t.numel() for _, t in state if t.device.type == "meta"}.values())
    names = [n for n, _ in real]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if meta_numel == 0 or real_numel > _STRAY_LIMIT or real_numel >= meta_numel:
        mixed = (f" The rest of the model is on the meta device: these {real_numel} real elements are too many to "
                 "be strays of __init__ (more than a few small tensors), so the model is refused rather than "
                 "guessed at." if meta_numel else "")
        raise ExtractionError(
            f"model {name!r} has weights that are not on the meta device ({shown}).{mixed} "
            "Extraction never needs weight values: build the model under the meta device, e.g.\n"
            "    with torch.device('meta'):\n        model = MyModel(config)\n"
            "(Hugging Face: build from the config inside that block). To extract a model that already "
            "holds real weights anyway, pass allow_real_weights=True."
        )
    warnings.warn(
        f"model {name!r} was built on the meta device but holds {len(names)} small real tensor(s): {shown} "
        f"({real_numel} elements; made in __init__ without the default device, e.g. torch.Tensor(n).uniform_()). "
        "They are traced on the meta device like the rest; the model itself is not changed.",
        UserWarning, stacklevel=4,
    )
    with on_meta(model, only=set(distinct), remember=True):
        yield


@contextlib.contextmanager
def on_meta(model: torch.nn.Module, *, only: set[int] | None = None, remember: bool = False) -> Iterator[None]:
    """Swap the model's parameters and buffers (those whose ``id`` is in ``only``; all by default) for meta
    copies, and put the real ones back after. One copy per tensor, so tied weights stay tied and export lifts
    them once. ``remember``: each copy keeps its value (``constants.known_value``), as a tensor made under
    ``build_on_meta`` does, so a stray non-persistent buffer still gets its recipe in the IR."""
    memo: dict[int, torch.Tensor] = {}
    saved = []
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for key, t in store.items():
                if t is None or (only is not None and id(t) not in only):
                    continue
                if id(t) not in memo:
                    fake = t.detach().to("meta")
                    if remember:
                        remember_value(fake, t)
                    memo[id(t)] = torch.nn.Parameter(fake, t.requires_grad) if isinstance(t, torch.nn.Parameter) \
                        else fake
                saved.append((store, key, t))
    try:
        for store, key, t in saved:
            store[key] = memo[id(t)]
        yield
    finally:
        for store, key, t in saved:
            store[key] = t


def refuse_leaked_trace_tensors(model: torch.nn.Module, name: str) -> None:
    """A module attribute holding a fake tensor is what an earlier trace cached and left behind.

    torch.export restores the attributes a module had before a trace, but one the trace added (a cache whose
    first value was a class attribute, as in Ultralytics' ``Detect``) keeps the trace's fake tensor. Traced
    again, it would become a constant whose value nobody has; the IR would be wrong, so extraction refuses.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    leaked = [f"{path + '.' if path else ''}{key}" for path, module in model.named_modules()
              for key, value in vars(module).items()
              if any(isinstance(v, FakeTensor) for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor))]
    if leaked:
        shown = ", ".join(leaked[:5]) + (f" and {len(leaked) - 5} more" if len(leaked) > 5 else "")
        raise ExtractionError(
            f"model {name!r}: {shown} holds a tensor of an earlier trace (a FakeTensor): the model cached it while "
            "torch.export (or torch.compile) traced its forward, and the trace left it behind. Extracting it would "
            "record a constant that has no value. Fix: build the model again (or delete the attribute) before "
            "extract_ir; extract_ir itself restores what its own trace sets."
        )


@contextlib.contextmanager
def attributes_kept(model: torch.nn.Module) -> Iterator[None]:
    """Put back every module attribute that a trace of ``forward`` set, added or removed.

    A module that caches what it computes from the input's shape on its first call (Ultralytics' ``Detect``
    keeps ``self.anchors`` and ``self.shape``) would otherwise keep values from the trace: torch.export puts
    tensor attributes back, but not plain ones, so the next trace (a second extraction, the verifier's
    re-export) would find ``self.shape`` set and reuse anchors that no longer exist. Only bindings are
    restored (a list the trace appended to stays appended); parameters, buffers and submodules are export's.
    """
    saved = [(m, dict(m.__dict__)) for m in model.modules()]
    try:
        yield
    finally:
        for module, attrs in saved:
            current = module.__dict__
            for key in [k for k in current if k not in attrs]:
                del current[key]
            for key, value in attrs.items():
                if current.get(key, _MISSING) is not value:
                    current[key] = value


_MISSING = object()


def named_state(model: torch.nn.Module):
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)
