"""The fixtures every test of a native CPU kernel module uses: its library, and each ISA this CPU runs."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


def isa_fixtures(module: ModuleType, isas: dict[str, int], env: str) -> tuple[Callable, Callable]:
    """``(qlib, isa)`` for ``module`` (a kernel module with ``_kernel`` and ``native_status``): ``qlib`` loads its
    library once per test module, or skips saying why there is none; ``isa`` runs a test once per kernel this CPU
    can run (the portable one always), capped through the environment variable ``env``. Assign both at module
    level under these names: pytest finds fixtures by name."""

    @pytest.fixture(scope="module")
    def qlib():
        library = module._kernel.load()
        if library is None:
            pytest.skip(f"no native kernel here: {module.native_status()}")
        return library

    @pytest.fixture(params=list(isas))
    def isa(request, qlib, monkeypatch) -> str:
        if isas[request.param] > qlib.isa:
            pytest.skip(f"this CPU has no {request.param}")
        monkeypatch.setenv(env, request.param)
        return request.param

    return qlib, isa
