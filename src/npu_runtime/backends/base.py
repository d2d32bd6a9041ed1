"""The backend interface: what the executors need from a device, and nothing more.

A backend allocates device memory, copies host arrays in and out, views a tensor inside an allocation,
and turns a dispatch into a kernel it can run. The executors are written against this interface only,
so a compute-shader backend (WebGPU) plugs in beside the CPU one without changing them or the compiler.
Handles (``Any`` below) are whatever the backend uses for device memory: ``torch.Tensor`` on the CPU.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from npu_program.program import Dispatch, TensorSpec


class Kernel(Protocol):
    """One dispatch bound to a backend: ``prepare`` once per weight set, ``run`` per inference."""

    def prepare(self, weights: dict[str, Any]) -> None: ...

    def run(self, inputs: list[Any], outputs: list[Any]) -> None: ...


class Backend(Protocol):
    #: short name, e.g. "cpu"
    name: str
    #: the compiler target whose kernels this backend implements (``npu_compiler.compile(target=...)``)
    target: str

    @property
    def kernels(self) -> frozenset[str]:
        """The kernels it implements; ``check_program`` refuses a dispatch of any other before anything runs."""

    def allocate(self, nbytes: int) -> Any:
        """Device memory of ``nbytes`` bytes (the activation arena)."""

    def view(self, storage: Any, offset: int, spec: TensorSpec) -> Any:
        """The tensor ``spec`` stored at byte ``offset`` of ``storage``, in the spec's layout."""

    def copy_in(self, dst: Any, array: np.ndarray) -> None:
        """Copy a host array (logical order) into the device tensor ``dst``, converting to its dtype and layout."""

    def from_bytes(self, data: bytes, spec: TensorSpec) -> Any:
        """A constant from its little-endian bytes (the ``.npubin`` constant section)."""

    def copy(self, dst: Any, src: Any) -> None:
        """Device-to-device copy between two tensors of one shape (layouts may differ)."""

    def clone(self, src: Any) -> Any:
        """A new device tensor holding a copy of ``src``."""

    def download(self, handle: Any, spec: TensorSpec) -> np.ndarray:
        """Copy a device tensor back to a host array in logical (row-major) order."""

    def kernel(self, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> Kernel:
        """The kernel that runs ``dispatch``; ``weight_names`` are the inputs bound before the first run."""

    def begin_run(self) -> None:
        """A run starts: a GPU backend opens its command encoder; every dispatch until ``end_run`` is recorded."""

    def end_run(self) -> None:
        """A run ends: a GPU backend submits the recorded dispatches at once (one submission per run)."""

    def synchronize(self) -> None:
        """Wait for all submitted work (a no-op on a synchronous backend); profiling calls it."""
