"""Hostile corpus, second pass: (family filled in by its author)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from make_hostile_corpus import Case, _Builder

#: API kinds of this family's cases: name -> call(case, corpus_dir).
API: dict[str, Callable[[Case, Path], None]] = {}


def build(b: _Builder) -> None:
    """Add this family's cases to ``b``."""
