"""tinygrad frontend: ``import_tinygrad(model, example_inputs) -> (NPU_IR, weights)``; see docs/tinygrad.md.

tinygrad is an optional dependency (tested with 0.14). It is imported when ``import_tinygrad`` is
first looked up, so this package (and its ``cli`` module) can be imported without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["import_tinygrad", "import_tinygrad_traced"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from . import importer
    except ImportError as e:
        raise ImportError(f"the tinygrad frontend needs tinygrad ({e}): pip install 'tinygrad>=0.14,<0.15'") from e
    return getattr(importer, name)
