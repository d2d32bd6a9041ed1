"""File names made from names inside files.

A model name comes from the IR or program file (``model_name``), which is untrusted: used as it is
for a default output path, ``../escaped`` or ``/abs/path`` would write outside the working directory.
"""

from __future__ import annotations

import re
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
MAX_STEM = 100


def safe_stem(name: object, fallback: str = "model") -> str:
    """``name`` as one path component: separators and other unsafe characters become ``_``, no leading dot,
    at most ``MAX_STEM`` characters; an empty result becomes ``fallback``."""
    stem = _UNSAFE.sub("_", str(name)).lstrip(".")[:MAX_STEM]
    return stem if stem.strip("_") else fallback


def default_output(name: object, suffix: str) -> Path:
    """The default output path for a model called ``name``: always a file in the working directory."""
    return Path(safe_stem(name) + suffix)


__all__ = ["default_output", "safe_stem"]
