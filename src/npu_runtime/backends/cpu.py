"""The CPU backend: device memory is ``torch.Tensor`` in host memory, kernels are PyTorch's CPU kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from npu_program.kernels import kernels_for
from npu_program.program import Dispatch, TensorSpec
from torch_ir.ops.values import dtype_from_name

from ..threads import RunThreads
from .base import Kernel
from .cpu_kernels import Reference, make_kernel


def _nhwc(t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Logical NCHW view of NHWC bytes."""
    n, c, h, w = shape
    return t.view(n, h, w, c).permute(0, 3, 1, 2)


class CPUBackend:
    """Runs compiled programs with PyTorch's CPU kernels (oneDNN convolutions, BLAS GEMMs).

    ``threads`` sets PyTorch's intra-op thread count for the whole process (None leaves it as it is) and
    fixes every run to it. Without it, each executor's runs use all of torch's threads or one, whichever is
    faster while it runs (``npu_runtime.threads.RunThreads``: a neighbour process taking a core stalls
    PyTorch's OpenMP pool); ``adaptive=False`` keeps torch's count for every run.
    """

    name = "cpu"
    target = "cpu"

    @property
    def kernels(self) -> frozenset[str]:
        """Every kernel of the table with a CPU implementation (read when asked: a record added later counts)."""
        return kernels_for("cpu")

    def __init__(self, threads: int | None = None, *, adaptive: bool = True) -> None:
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be at least 1, got {threads}")
            torch.set_num_threads(threads)
        self.threads = threads
        self.adaptive = adaptive

    def run_threads(self) -> RunThreads | None:
        """A new per-executor thread policy for ``Executor.run`` (None: runs use torch's count as it is)."""
        if self.threads is not None:
            return RunThreads(fixed=self.threads)
        return RunThreads() if self.adaptive else None

    def allocate(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def view(self, storage: torch.Tensor, offset: int, spec: TensorSpec) -> torch.Tensor:
        dtype, shape = spec.storage  # 4-bit codes: uint8, two per byte along the last dim
        flat = storage[offset:offset + spec.nbytes].view(dtype_from_name(dtype))
        if spec.layout == "NHWC":
            return _nhwc(flat, shape)
        return flat.view(shape)

    def copy_in(self, dst: torch.Tensor, array: np.ndarray | torch.Tensor) -> None:
        if isinstance(array, torch.Tensor):
            value = array
        elif array.flags.writeable:  # share the array's memory: copy_ below is the only copy
            value = torch.from_numpy(np.ascontiguousarray(array))
        else:  # torch refuses to share read-only memory (a safetensors mapping, say)
            value = torch.tensor(array)
        dst.copy_(value.reshape(dst.shape))

    def from_bytes(self, data: bytes, spec: TensorSpec) -> torch.Tensor:
        storage = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else self.allocate(0)
        return self.view(storage, 0, TensorSpec(spec.name, spec.shape, spec.dtype, quant=spec.quant))

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def clone(self, src: torch.Tensor) -> torch.Tensor:
        return src.clone()

    def download(self, handle: torch.Tensor, spec: TensorSpec) -> np.ndarray:
        t = handle.detach()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: widen exactly to float32
            t = t.float()
        return t.contiguous().numpy().copy()

    def kernel(self, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> Kernel:
        if dispatch.host is not None:  # not a kernel of the table: the op itself, on the host
            return self.host_kernel(dispatch, specs)
        return make_kernel(dispatch, specs, weight_names)

    def host_kernel(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> Kernel:
        """The op's reference on the arena's tensors themselves: on this backend they are host memory already
        (an NHWC tensor is a logical strided view), so nothing is downloaded or uploaded."""
        return Reference(dispatch, specs)

    def chains(self, kernels: Sequence[Kernel], steps: Sequence[tuple], plannable: Sequence[bool]) -> Any:
        """An executor's steps, each run of dispatches with native calls made by one C call (:mod:`.cpu_chain`:
        a decode step's kernels); the executor runs them unless a hook must see every dispatch."""
        from .cpu_chain import Chains  # here: it imports every kernel module, which the backend need not

        return Chains(kernels, steps, plannable)

    def begin_run(self) -> None:  # kernels run as they are dispatched: nothing to record or submit
        pass

    def end_run(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"CPUBackend(threads={torch.get_num_threads()})"

