"""The backend interface: what the executors need from a device, and nothing more.

A backend allocates device memory, copies host arrays in and out, views a tensor inside an allocation,
and turns a dispatch into a kernel it can run. The executors are written against this interface only,
so a compute-shader backend (WebGPU) plugs in beside the CPU one without changing them or the compiler.
Handles (``Any`` below) are whatever the backend uses for device memory: ``torch.Tensor`` on the CPU.

*Host dispatches* (``Dispatch.host`` set, made by ``compile(fallback="cpu")``) are not kernels of the
target: their ``kernel`` is an op type, run on the host CPU by the op's reference implementation. A
backend's ``kernel()`` hands them to its ``host_kernel()``; :class:`HostKernel` is the implementation any
backend can return there (download the inputs, run the reference on CPU tensors, upload the outputs).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from npu_program.program import Dispatch, TensorSpec
from torch_ir.ops.values import dtype_from_name


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
        """The kernel that runs ``dispatch``; ``weight_names`` are the inputs bound before the first run.

        A host dispatch (``dispatch.host`` set) is not a kernel of this backend: return ``host_kernel``'s."""

    def host_kernel(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> Kernel:
        """The kernel of a host dispatch: the op's reference implementation run on the host CPU, reading and
        writing this backend's tensors (``HostKernel(self, dispatch, specs)`` works for any backend; one whose
        tensors are host memory already can run the reference on them directly)."""

    def begin_run(self) -> None:
        """A run starts: a GPU backend opens its command encoder; every dispatch until ``end_run`` is recorded."""

    def end_run(self) -> None:
        """A run ends: a GPU backend submits the recorded dispatches at once (one submission per run)."""

    def synchronize(self) -> None:
        """Wait for all submitted work (a no-op on a synchronous backend); profiling calls it."""


class HostKernel:
    """A host dispatch on any backend: its inputs downloaded (logical order), the op's reference implementation
    run on CPU tensors, its outputs uploaded (``copy_in`` converts to each output's dtype and layout).

    The executor has already checked the op (``npu_runtime.reference.check_host_dispatches``) and its output
    shapes (``check_output_shapes``) before this is made.
    """

    def __init__(self, backend: Backend, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        from ..reference import bind_reference  # the reference module imports the device, which imports backends

        self.backend = backend
        self.in_specs = [specs[name] for name in dispatch.inputs]
        self.fn = bind_reference(dispatch, specs, torch.device("cpu"))

    def prepare(self, weights: dict[str, Any]) -> None:
        pass

    def run(self, inputs: list[Any], outputs: list[Any]) -> None:
        host = [host_tensor(self.backend, handle, spec) for handle, spec in zip(inputs, self.in_specs)]
        for out, value in zip(outputs, self.fn(host, {})):
            self.backend.copy_in(out, value.detach().contiguous().numpy() if value.dtype != torch.bfloat16
                                 else value.float().numpy())


def host_tensor(backend: Backend, handle: Any, spec: TensorSpec) -> torch.Tensor:
    """A device tensor as a logical-order CPU tensor of its spec's dtype (``download`` widens bfloat16 to float32;
    this narrows it back, exactly)."""
    array = backend.download(handle, spec)
    return torch.from_numpy(np.ascontiguousarray(array)).to(dtype_from_name(spec.storage[0]))  # 4-bit: packed
