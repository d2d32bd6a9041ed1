"""``Device`` (a backend, chosen by name) and ``NPUBuffer`` (a tensor in device memory with its spec)."""

from __future__ import annotations

from typing import Any

import numpy as np

from npu_program.program import TensorSpec
from torch_ir import dtypes
from torch_ir.errors import TorchIRError

from .backends import Backend, get_backend


class RuntimeInputError(TorchIRError, ValueError):
    """An input, a weight or a buffer does not match what the program expects; the message says which."""


class Device:
    """Where programs run. ``Device()`` is the CPU backend; ``Device("cpu")`` or ``Device(backend)`` choose."""

    def __init__(self, backend: str | Backend = "cpu") -> None:
        self.backend: Backend = get_backend(backend) if isinstance(backend, str) else backend

    @property
    def name(self) -> str:
        return self.backend.name

    def __repr__(self) -> str:
        return f"Device({self.backend!r})"


def as_device(device_or_backend: Device | Backend | str) -> Device:
    """Accept a Device, a backend object or a backend name wherever a device is wanted."""
    if isinstance(device_or_backend, Device):
        return device_or_backend
    return Device(device_or_backend)


def numpy_dtype_name(array: np.ndarray) -> str:
    """The program's name (``torch_ir.dtypes``) of the array's dtype; numpy's own name for one it lacks."""
    return dtypes.name_of(array.dtype)


class NPUBuffer:
    """A tensor in a device's memory, stored in its spec's layout (NHWC for a convolution's input, say)."""

    def __init__(self, data: Any, spec: TensorSpec, device: Device) -> None:
        self.data = data
        self.spec = spec
        self.device = device

    @classmethod
    def from_numpy(cls, array: Any, device: Device, spec: TensorSpec | None = None) -> NPUBuffer:
        """Copy ``array`` (logical order, e.g. NCHW) to ``device`` in the layout of ``spec``.

        With a spec, the shape and dtype must match it (float32 is accepted for a bfloat16 spec, since
        numpy has no bfloat16); without one, the array's own shape and dtype are used.
        """
        array = np.asarray(array)
        if spec is None:
            dtype = numpy_dtype_name(array)
            if not dtypes.is_dtype(dtype):
                raise RuntimeInputError(f"array of dtype {dtype} cannot be a device buffer; "
                                        f"use one of {', '.join(dtypes.DTYPES)}")
            spec = TensorSpec("buffer", list(array.shape), dtype)
        else:
            check_array(array, spec, f"array for {spec.name!r}")
        return cls(new_tensor(device, spec, array), spec, device)

    def to_numpy(self, spec: TensorSpec | None = None) -> np.ndarray:
        """Copy back to the host in logical order (bfloat16 is widened to float32)."""
        spec = spec or self.spec
        if list(spec.shape) != list(self.spec.shape) or spec.dtype != self.spec.dtype:
            raise RuntimeInputError(
                f"buffer {self.spec.name!r} is {_describe(self.spec)}; cannot read it as {_describe(spec)}")
        return self.device.backend.download(self.data, self.spec)

    @property
    def shape(self) -> list[int]:
        return list(self.spec.shape)

    def __repr__(self) -> str:
        return f"NPUBuffer({self.spec.name!r}, {_describe(self.spec)}, {self.device.name})"


def host_array(value: Any) -> np.ndarray:
    """An input value as a host array: a device buffer read back, a torch tensor (bfloat16 widened to float32, which
    numpy lacks), anything else through ``np.asarray``."""
    if isinstance(value, NPUBuffer):
        return value.to_numpy()
    if hasattr(value, "detach"):  # a torch.Tensor
        value = value.detach().cpu()
        return value.float().numpy() if str(value.dtype) == "torch.bfloat16" else value.numpy()
    return np.asarray(value)


def new_tensor(device: Device, spec: TensorSpec, array: Any) -> Any:
    """Device memory for ``spec``, holding ``array``."""
    backend = device.backend
    data = backend.view(backend.allocate(spec.nbytes), 0, spec)
    backend.copy_in(data, array)
    return data


def check_array(array: np.ndarray, spec: TensorSpec, what: str) -> None:
    """Raise RuntimeInputError naming ``what`` unless ``array`` has the spec's shape and dtype."""
    dtype = numpy_dtype_name(array)
    want_dtype, want_shape = spec.storage  # 4-bit codes travel packed, two per byte, as uint8
    dtype_ok = dtype == want_dtype or (want_dtype == "bfloat16" and dtype == "float32")
    if list(array.shape) != list(want_shape) or not dtype_ok:
        raise RuntimeInputError(
            f"{what} must be {_describe(spec)}, got {dtype}{list(array.shape)}; "
            "convert or reshape it first")


def _describe(spec: TensorSpec) -> str:
    layout = f" ({spec.layout})" if spec.layout else ""
    return f"{spec.dtype}{list(spec.shape)}{layout}"
