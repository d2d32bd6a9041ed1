"""Runtime backends: the interface (``base.Backend``), the CPU backend (the default, which needs nothing) and
the WebGPU backend (``webgpu``: WGSL compute shaders through wgpu; made on first use)."""

from .base import Backend, Kernel
from .cpu import CPUBackend


def _webgpu() -> Backend:
    from .webgpu import WebGPUBackend

    return WebGPUBackend()


BACKENDS = {"cpu": CPUBackend, "webgpu": _webgpu}


def get_backend(name: str) -> Backend:
    """A new backend by name ("cpu", "webgpu")."""
    try:
        make = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(sorted(BACKENDS))}") from None
    return make()


__all__ = ["BACKENDS", "Backend", "CPUBackend", "Kernel", "get_backend"]
