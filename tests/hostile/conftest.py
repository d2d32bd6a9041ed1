"""The hostile corpus, built once per session into pytest's temporary directory by scripts/make_hostile_corpus.py.

The generator is a script, not a package module: it is loaded by path and registered under its own name,
so that ``torch-ir verify make_hostile_corpus:tiny_factory`` (the reference model of the corpus) resolves
in-process.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py as the module ``name`` (loaded once)."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def load_generator() -> ModuleType:
    """scripts/make_hostile_corpus.py as the module ``make_hostile_corpus``."""
    return load_script("make_hostile_corpus")


def _corpus(config: pytest.Config) -> tuple[Path, list]:
    """(directory, cases), built on first use; the directory is a numbered dir of pytest's basetemp."""
    cached = getattr(config, "_hostile_corpus", None)
    if cached is None:
        factory = getattr(config, "_tmp_path_factory", None)  # the factory behind the tmp_path fixtures
        directory = factory.mktemp("hostile_corpus") if factory else Path(tempfile.mkdtemp(prefix="hostile_corpus"))
        cached = (directory, load_generator().build_corpus(directory))
        config._hostile_corpus = cached
    return cached


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A ``case`` parameter: every case of the corpus, its id as the test id."""
    if "case" in metafunc.fixturenames:
        _, cases = _corpus(metafunc.config)
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])


@pytest.fixture(scope="session")
def corpus_dir(request: pytest.FixtureRequest) -> Path:
    return _corpus(request.config)[0]


@pytest.fixture(scope="session")
def cases(request: pytest.FixtureRequest) -> list:
    return _corpus(request.config)[1]


@pytest.fixture(scope="session")
def generator() -> ModuleType:
    return load_generator()


@pytest.fixture(scope="session")
def fuzz() -> ModuleType:
    return load_script("fuzz_loaders")


@pytest.fixture(scope="session", autouse=True)
def _warm_kernels(request: pytest.FixtureRequest) -> None:
    """Run the corpus' valid program once in this process before any test forks: children then inherit
    oneDNN's generated kernels instead of generating them again each (about a second per child)."""
    if any("case" in item.fixturenames or "fuzz" in item.fixturenames for item in request.session.items):
        load_script("fuzz_loaders").Seeds(_corpus(request.config)[0]).warm_up()
