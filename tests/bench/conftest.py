"""The compiled-kernel fixture the runtime's tests use, for the benchmarks' smoke tests of the native kernels."""

from tests.runtime.conftest import native  # noqa: F401
