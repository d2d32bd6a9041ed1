"""The packages are layers: each imports only those below it.

    torch_ir       the IR, its ops and executor, the verifier, the frontends, the base utilities
    npu_program    the program schema, the .npubin format, the kernel table        (torch_ir, no frontend)
    npu_compiler   the NPU passes, lowering, memory planning, the cost model       (npu_program, torch_ir)
    npu_runtime    backends and the executor                       (npu_program, torch_ir, no frontend)
    npu_tools      what a user types: the CLI, bisect and repro, the zoo, the demo  (everything)

Each forbidden pair is checked twice: statically, every ``import`` statement of every module of the package,
those inside functions included (a lazy import is still a dependency); and in a fresh interpreter, that
importing every module of the package loads no module of the forbidden one (a dependency through a third
package shows there).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# package -> what it must never import (a module name, or a prefix of one)
FORBIDDEN = {
    "torch_ir": ["npu_program", "npu_compiler", "npu_runtime", "npu_tools"],
    "npu_program": ["npu_compiler", "npu_runtime", "npu_tools", "torch_ir.frontends"],
    "npu_compiler": ["npu_runtime", "npu_tools"],
    "npu_runtime": ["npu_compiler", "npu_tools", "torch_ir.frontends"],
}
PAIRS = [(package, forbidden) for package, all_forbidden in FORBIDDEN.items() for forbidden in all_forbidden]
PAIR_IDS = [f"{package}-not-{forbidden}" for package, forbidden in PAIRS]


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) of every import statement in ``path`` (``module`` is its dotted name)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            # ``from a import b`` may import the module a.b
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _modules(package: str) -> list[tuple[Path, str]]:
    root = SRC / package
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out.append((path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)))
    return out


def _matches(name: str, forbidden: str) -> bool:
    return name == forbidden or name.startswith(forbidden + ".")


@pytest.mark.parametrize(("package", "forbidden"), PAIRS, ids=PAIR_IDS)
def test_no_import_statement_reaches_a_higher_layer(package: str, forbidden: str) -> None:
    offenders = [f"{path.relative_to(SRC)}:{line} imports {name}"
                 for path, module in _modules(package) for line, name in _imports(path, module)
                 if _matches(name, forbidden)]
    assert not offenders, f"{package} must not import {forbidden}:\n" + "\n".join(offenders)


@pytest.mark.parametrize(("package", "forbidden"), PAIRS, ids=PAIR_IDS)
def test_importing_the_package_loads_no_higher_layer(package: str, forbidden: str) -> None:
    # every module of the package, in one fresh interpreter; a module whose optional framework is missing is
    # passed over (the check is about our modules, not theirs)
    modules = [m for _, m in _modules(package)]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ImportError as e:\n"
        "        if e.name and e.name.split('.')[0] in ('torch_ir', 'npu_program', 'npu_compiler', 'npu_runtime',"
        " 'npu_tools'):\n"
        "            raise\n"
        f"hit = [m for m in sys.modules if m == {forbidden!r} or m.startswith({forbidden!r} + '.')]\n"
        "print('\\n'.join(sorted(hit)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"importing {package} loaded {forbidden}:\n{out.stdout}"


def test_the_forbidden_list_covers_every_package() -> None:
    """A new package under src/ must be given its place in the layers."""
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(FORBIDDEN) | {"npu_tools"}, packages


def test_the_seeds_import_paths_still_work() -> None:
    """Seed 002 and 004's code, as written (docs/api.md lists where each name lives now)."""
    code = ("from torch_ir import extract_ir, verify_ir_with_state_dict\n"
            "import npu_compiler\n"
            "from npu_compiler.compiled_program import CompiledProgram\n"
            "from npu_compiler import partition, is_op_supported\n"
            "from npu_runtime import Device, Executor, NPUBuffer, load_weights\n"
            "from npu_runtime import DAGExecutor, MetalBackend\n"
            "assert callable(npu_compiler.compile) and CompiledProgram.load\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
