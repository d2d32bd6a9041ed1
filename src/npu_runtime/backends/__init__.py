"""Runtime backends: the interface (``base.Backend``) and the CPU backend, the default that needs nothing."""

from .base import Backend, Kernel
from .cpu import CPUBackend

BACKENDS = {"cpu": CPUBackend}


def get_backend(name: str) -> Backend:
    """A new backend by name ("cpu")."""
    try:
        return BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(sorted(BACKENDS))}") from None


__all__ = ["BACKENDS", "Backend", "CPUBackend", "Kernel", "get_backend"]
