"""The code stays easy to see: ruff is clean, no source file over ~500 lines, no function over ~60 lines.

The exceptions are declarative tables and argument parsers, each named here with why; a new one is a
decision someone writes down, not drift (tinygrad gates its CI on a line count the same way).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60

# path under src -> why it may be longer
LONG_FILES: dict[str, str] = {}
# "path:function" -> why it may be longer
LONG_FUNCTIONS = {
    "torch_ir/frontends/tinygrad/idioms.py:idiom_rules": "builds rule data: one pattern per tinygrad idiom",
    "npu_tools/cli.py:build_parser": "argparse: one line per subcommand and flag",
}


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_source_file_is_over_the_line_budget() -> None:
    long = {str(p.relative_to(SRC)): p.read_text().count("\n") for p in _sources()}
    over = {p: n for p, n in long.items() if n > MAX_FILE_LINES and p not in LONG_FILES}
    assert not over, f"split these files (or add a table to LONG_FILES, saying why): {over}"


def test_no_function_is_over_the_line_budget() -> None:
    over = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                key = f"{path.relative_to(SRC)}:{node.name}"
                if lines > MAX_FUNCTION_LINES and key not in LONG_FUNCTIONS:
                    over[key] = lines
    assert not over, f"split these functions (or add a table or parser to LONG_FUNCTIONS, saying why): {over}"


def test_the_exceptions_are_still_needed() -> None:
    """An exception whose file or function shrank below the budget is removed from the list."""
    stale = [p for p in LONG_FILES if (SRC / p).read_text().count("\n") <= MAX_FILE_LINES]
    for key in LONG_FUNCTIONS:
        path, name = key.split(":")
        tree = ast.parse((SRC / path).read_text())
        sizes = [n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
        if not sizes or max(sizes) <= MAX_FUNCTION_LINES:
            stale.append(key)
    assert not stale, f"no longer over the budget; remove from the exceptions: {stale}"


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the test extra)")
    out = subprocess.run([ruff, "check", "src", "tests", "bench", "scripts"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
