"""``package.module:factory`` model specs: find the factory, call it, check what it returned.

A spec is code, not data: resolving it imports ``package.module`` (running its top level) and calling
the factory runs the factory. Only use specs you trust, as you would only ``torch.load(weights_only=False)``
files you trust. What this module guarantees is that whatever the code does wrong (it exits, raises, returns
something else) ends as one :class:`ExtractionError` naming the spec, never as a silent exit.
"""

from __future__ import annotations

import importlib
import reprlib
from collections.abc import Callable
from typing import Any

from .errors import ExtractionError

SPEC_FORM = "'package.module:factory' (a function returning (model, args[, kwargs]))"
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlevel = 2


def load_factory(spec: str) -> Callable[[], Any]:
    """Import the module of ``spec`` and return its factory; ExtractionError if it is missing or not callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ExtractionError(f"cannot load model factory {spec!r}: a spec is {SPEC_FORM}")
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except ImportError as e:
        raise ExtractionError(f"cannot load model factory {spec!r}: cannot import module {module_name!r} ({e}); "
                              f"check the module is on sys.path and the spec is {SPEC_FORM}") from None
    except BaseException as e:  # noqa: BLE001 - the module's own code failed (SystemExit included)
        raise ExtractionError(f"cannot load model factory {spec!r}: importing module {module_name!r} raised {_exc(e)}; "
                              "fix the module so that importing it has no such effect") from None
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise ExtractionError(f"cannot load model factory {spec!r}: module {module_name!r} has no attribute {attr!r}; "
                              f"expected {SPEC_FORM}") from None
    if not callable(factory):
        raise ExtractionError(f"cannot load model factory {spec!r}: {attr!r} is {describe(factory)}, not callable; "
                              f"point the spec at {SPEC_FORM}")
    return factory


def call_factory(factory: Callable[[], Any], spec: str) -> Any:
    """``factory()``; anything it raises but KeyboardInterrupt (SystemExit, exit(), an error) -> ExtractionError."""
    try:
        return factory()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - exit() or sys.exit() in a factory must not end the program silently
        raise ExtractionError(f"factory {spec!r} raised {_exc(e)}; a factory must return (model, args[, kwargs]) "
                              "(run it in Python to see the whole error)") from None


def check_torch_factory_result(made: Any, spec: str) -> tuple[Any, tuple, dict]:
    """``(model, args[, kwargs])`` with ``model`` a ``torch.nn.Module``, ``args`` a tuple (or list) and
    ``kwargs`` a dict; anything else is an ExtractionError naming the spec and what it returned."""
    import torch

    expected = "expected (model: torch.nn.Module, args: tuple[, kwargs: dict])"
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise ExtractionError(f"factory {spec!r} returned {describe(made)}; {expected}")
    problems = []
    if not isinstance(made[0], torch.nn.Module):
        problems.append(f"model is {describe(made[0])}")
    if not isinstance(made[1], (tuple, list)):
        problems.append(f"args is {describe(made[1])}")
    if len(made) == 3 and not (isinstance(made[2], dict) and all(isinstance(k, str) for k in made[2])):
        problems.append(f"kwargs is {describe(made[2])}")
    if problems:
        raise ExtractionError(f"factory {spec!r} returned a {len(made)}-tuple whose {', '.join(problems)}; {expected}")
    return made[0], tuple(made[1]), dict(made[2]) if len(made) == 3 else {}


def describe(value: Any) -> str:
    """"an int (5)", "a Linear (Linear(in_features=...))": what a message says a value is, on one line."""
    if isinstance(value, type):
        return f"the class {value.__name__}"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name} ({_short(value)})"


def _exc(e: BaseException) -> str:
    """``SystemExit(3)``, ``ValueError('bad')``: an exception as the message shows it."""
    args = e.args[0] if len(e.args) == 1 else e.args
    text = _short(args)
    return f"{type(e).__name__}({text if len(e.args) == 1 else text[1:-1]})"


def _short(value: Any) -> str:
    return " ".join(_repr.repr(value).split())


__all__ = ["SPEC_FORM", "call_factory", "check_torch_factory_result", "describe", "load_factory"]
