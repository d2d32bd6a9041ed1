"""Fixtures the runtime's test modules share."""

from __future__ import annotations

import pytest

from npu_runtime.backends import cpu_gemv, cpu_gemv_build


@pytest.fixture(scope="module")
def native() -> cpu_gemv_build.Library:
    """The compiled GEMV library; the test is skipped, with the reason, where none can be built."""
    library = cpu_gemv._load()
    if library is None:
        pytest.skip(f"no native GEMV here: {cpu_gemv.native_status()}")
    return library
