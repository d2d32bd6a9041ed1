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
        raise ExtractionError(f"cannot load model factory {spec!r}: importing module {module_name!r} raised "
                              f"{describe_exception(e)}; fix the module so that importing it has no such effect") from e
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
        # the whole chain, and ``from e``: a factory that wraps its failure (from_pretrained wrapping a download
        # error) says what went wrong in the cause, and a traceback then shows the factory's own frames
        raise ExtractionError(f"factory {spec!r} raised {describe_exception(e)}; a factory must return "
                              "(model, args[, kwargs])") from e


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


_CHAIN_LIMIT = 8  # causes shown at most: a chain is rarely longer, and a hostile one may loop or be endless


def describe_exception(e: BaseException) -> str:
    """``SystemExit(3)``, ``RuntimeError('outer'), caused by ValueError('inner')``: an exception and the chain
    of its causes (``raise ... from``, or one raised while handling another), each with its whole message.

    Nothing is shortened: the cause is usually where the real error is (a download that failed inside
    ``from_pretrained``), and a message cut in the middle hides it. Each message is a repr, so it stays on
    one line."""
    parts = [_exception(e)]
    seen = {id(e)}
    link, cause = _next_in_chain(e)
    while cause is not None and id(cause) not in seen:
        if len(parts) > _CHAIN_LIMIT:
            parts.append(f"{link} ... (more causes)")
            break
        seen.add(id(cause))
        parts.append(f"{link} {_exception(cause)}")
        link, cause = _next_in_chain(cause)
    return ", ".join(parts)


def _next_in_chain(e: BaseException) -> tuple[str, BaseException | None]:
    """The exception ``e`` came from, as a traceback shows the chain: the explicit cause, else the context
    unless ``from None`` suppressed it."""
    if e.__cause__ is not None:
        return "caused by", e.__cause__
    if e.__context__ is not None and not e.__suppress_context__:
        return "raised while handling", e.__context__
    return "", None


def _exception(e: BaseException) -> str:
    """``ValueError('bad')``: the type and every argument in full."""
    return f"{type(e).__name__}({', '.join(_full_repr(a) for a in e.args)})"


def _full_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - an argument whose __repr__ fails must not hide the error it describes
        return f"<{type(value).__name__} whose repr() fails>"


def _short(value: Any) -> str:
    return " ".join(_repr.repr(value).split())


__all__ = ["SPEC_FORM", "call_factory", "check_torch_factory_result", "describe", "describe_exception",
           "load_factory"]
