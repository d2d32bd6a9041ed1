"""The model zoo: small models, by name, for demos, the CLI and the tests.

Each entry builds its model on any device: on ``meta`` for extraction (no weight is allocated),
on ``cpu`` with seeded weights (or the real pretrained ones) for reference runs::

    entry = get_model("convnet")
    meta_model, real_model = build_pair(entry)
    args, kwargs = entry.example_inputs()
    ir = torch_ir.extract_ir(meta_model, args, model_name=entry.name, example_kwargs=kwargs,
                             dynamic_shapes=entry.dynamic_shapes)
    outputs = torch_ir.IRExecutor(ir, real_model).run(...)

Hugging Face entries need the optional ``transformers`` dependency; ``entry.available()`` says
whether an entry's packages are installed, and nothing is imported until a model is built.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class ZooEntry:
    """One model: how to build it, what it eats, and which extra packages it needs."""

    name: str
    category: str
    description: str
    factory: Callable[[], nn.Module]  # builds the architecture on the current default device
    inputs: Callable[[torch.Generator], Inputs]  # example (args, kwargs), drawn from the generator
    dynamic_shapes: Any = None  # as torch.export takes it, keyed by forward()'s argument names
    pretrained: Callable[[], nn.Module] | None = None  # loads real weights on the CPU
    requires: tuple[str, ...] = ()  # importable packages the entry needs
    seed: int = 0

    @property
    def real_weights(self) -> bool:
        """True when ``build("cpu")`` loads real pretrained weights instead of seeded random ones."""
        return self.pretrained is not None

    def available(self) -> bool:
        return all(importlib.util.find_spec(pkg) is not None for pkg in self.requires)

    def build(self, device: str | torch.device = "meta") -> nn.Module:
        """The model in eval mode; deterministic for a given entry (seeded, or pretrained)."""
        device = torch.device(device)
        if self.pretrained is not None and device.type != "meta":
            return self.pretrained().to(device).eval()
        # fork_rng: seeding for the build must not disturb the caller's random stream. On meta, build_on_meta
        # keeps the values of small tensors made in __init__ (non-persistent buffers, strides): the IR then
        # records how to rebuild them, and __init__ code that reads one into Python works as on the CPU.
        from torch_ir.frontends.constants import build_on_meta

        on_device = build_on_meta() if device.type == "meta" else torch.device(device)
        with torch.random.fork_rng(devices=[]), on_device:
            torch.manual_seed(self.seed)
            model = self.factory()
        return model.eval()

    def example_inputs(self) -> Inputs:
        """Real CPU tensors, the same on every call: ``(args, kwargs)``."""
        return self.inputs(torch.Generator().manual_seed(self.seed))


_REGISTRY: dict[str, ZooEntry] = {}


def register(entry: ZooEntry) -> ZooEntry:
    if entry.name in _REGISTRY:
        raise ValueError(f"zoo model {entry.name!r} is already registered")
    _REGISTRY[entry.name] = entry
    return entry


def get_model(name: str) -> ZooEntry:
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise KeyError(f"no zoo model named {name!r}; {hint}available: {', '.join(_REGISTRY)}") from None


def list_models(category: str | None = None) -> list[str]:
    """Names in registration order, optionally only one category's."""
    return [n for n, e in _REGISTRY.items() if category is None or e.category == category]


def categories() -> list[str]:
    return list(dict.fromkeys(e.category for e in _REGISTRY.values()))


def build_pair(entry: ZooEntry | str) -> tuple[nn.Module, nn.Module]:
    """``(meta_model, cpu_model)``: the model to extract and the one whose state dict runs the IR.

    Raises ValueError when the two disagree on a tensor's name, shape or dtype, so that a
    mismatch is caught here rather than as a confusing weights error in the executor.
    """
    if isinstance(entry, str):
        entry = get_model(entry)
    meta_model, real_model = entry.build("meta"), entry.build("cpu")
    want, got = _signature(meta_model), _signature(real_model)
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()), key=str)[:10]
        raise ValueError(f"zoo model {entry.name!r}: meta and cpu builds differ in {diff}")
    return meta_model, real_model


def _signature(model: nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    from torch_ir.weights import module_state

    return {k: (tuple(v.shape), v.dtype) for k, v in module_state(model).items()}


from . import basic, detection, hf  # noqa: E402,F401 - registers the entries

__all__ = ["Inputs", "ZooEntry", "build_pair", "categories", "get_model", "list_models", "register"]
