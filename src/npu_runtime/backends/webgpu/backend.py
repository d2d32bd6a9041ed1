"""``WebGPUBackend``: compiled programs as WGSL compute dispatches on any GPU wgpu can drive.

Device memory is wgpu buffers: the activation arena is one buffer (every tensor a 256-byte-aligned range
of it, as the ``webgpu`` target plans), each weight and state slot its own buffer, uploaded once. A run
records every dispatch into one command encoder (one compute pass) and submits it once at ``end_run``;
only what the caller downloads is read back. Anything that must see the GPU's results mid-run (a host
dispatch's download, a copy) first submits what was recorded, so the order of work is always the
program's.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from npu_program.kernels import KERNELS, kernels_for
from npu_program.program import Dispatch, TensorSpec
from torch_ir.ops.values import dtype_from_name

from ..base import HostKernel, Kernel
from .contraction.blocks import check_block_call
from .gpu import GPU, NoAdapterError, get_gpu, has_packed_dot4
from .wgsl import Call, Shader, UnsupportedCall

NAME = "webgpu"


@dataclass(eq=False)
class GPUTensor:
    """A tensor in GPU memory: ``nbytes`` bytes at byte ``offset`` of ``buffer``, stored as ``spec`` says."""

    buffer: Any
    offset: int
    nbytes: int
    spec: TensorSpec | None = None

    def __repr__(self) -> str:
        what = f"{self.spec.dtype}{list(self.spec.shape)}" if self.spec is not None else "bytes"
        return f"GPUTensor({what}, {self.nbytes} B at {self.offset})"


def _round4(n: int) -> int:
    return max(4, (n + 3) // 4 * 4)


class WebGPUBackend:
    """Runs compiled programs (target ``webgpu``) as WGSL compute shaders; see the module docstring.

    ``api`` insists on a graphics API ("Vulkan", "Metal", "D3D12", "OpenGL"); None takes the best adapter.
    Raises ``NoAdapterError`` (with the reason) on a machine without one.
    """

    name = NAME
    target = NAME

    def __init__(self, api: str | None = None) -> None:
        self.gpu: GPU = get_gpu(api)
        self.device = self.gpu.device
        self._usage = (self.gpu.wgpu.BufferUsage.STORAGE | self.gpu.wgpu.BufferUsage.COPY_SRC
                       | self.gpu.wgpu.BufferUsage.COPY_DST)
        self._encoder: Any = None
        self._pass: Any = None
        self._timer: _Timer | None = None
        self._fence: Any = None
        self._pipeline: Any = None  # the pipeline set last in the open pass
        self._handle: Any = None  # the open pass's native handle (None: no pass open)
        self._native = _Native.load()
        self._recorded = 0
        #: Command buffers submitted that held dispatches (one per run: tests and profiles read it).
        self.dispatch_submissions = 0
        #: What the next recorded passes belong to (profiling sets the dispatch index).
        self.tag: int = -1

    @property
    def kernels(self) -> frozenset[str]:
        return kernels_for(NAME)

    @property
    def adapter(self) -> str:
        return self.gpu.summary

    # -- memory -------------------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> GPUTensor:
        limit = self.gpu.limits["max-buffer-size"]
        if nbytes > limit:
            raise ValueError(f"{nbytes} bytes exceed this adapter's largest buffer ({limit} bytes, {self.adapter})")
        return GPUTensor(self.device.create_buffer(size=_round4(nbytes), usage=self._usage), 0, nbytes)

    def view(self, storage: GPUTensor, offset: int, spec: TensorSpec) -> GPUTensor:
        return GPUTensor(storage.buffer, storage.offset + offset, spec.nbytes, spec)

    def copy_in(self, dst: GPUTensor, array: np.ndarray | torch.Tensor) -> None:
        self.write_bytes(dst, _to_storage(array, dst.spec))

    def write_bytes(self, dst: GPUTensor, data: bytes) -> None:
        """``data``, exactly ``dst``'s bytes, into its buffer: a tensor's storage bytes, or a kernel's table made
        when the weights are bound (``Shader.bind_data``)."""
        self.flush()
        if len(data) != dst.nbytes:
            raise ValueError(f"{len(data)} bytes for a tensor of {dst.nbytes}")
        if data:
            self.device.queue.write_buffer(dst.buffer, dst.offset, data + bytes(_round4(len(data)) - len(data)))

    def from_bytes(self, data: bytes, spec: TensorSpec) -> GPUTensor:
        padded = bytes(data) + bytes(_round4(len(data)) - len(data))
        buffer = self.device.create_buffer_with_data(data=padded, usage=self._usage)
        return GPUTensor(buffer, 0, len(data), TensorSpec(spec.name, spec.shape, spec.dtype, spec.layout,
                                                          quant=spec.quant))

    def copy(self, dst: GPUTensor, src: GPUTensor) -> None:
        if dst.spec is not None and src.spec is not None and dst.spec.layout != src.spec.layout:
            self.copy_in(dst, self.download(src, src.spec))  # a layout change: through the host (rare)
            return
        self.flush()
        if src.nbytes:
            encoder = self.device.create_command_encoder()
            encoder.copy_buffer_to_buffer(src.buffer, src.offset, dst.buffer, dst.offset, _round4(src.nbytes))
            self.device.queue.submit([encoder.finish()])

    def clone(self, src: GPUTensor) -> GPUTensor:
        out = self.allocate(src.nbytes)
        out.spec = src.spec
        self.copy(out, src)
        return out

    def download(self, handle: GPUTensor, spec: TensorSpec) -> np.ndarray:
        self.flush()
        raw = bytes(self.device.queue.read_buffer(handle.buffer, handle.offset, _round4(handle.nbytes)))
        return _from_storage(raw[:spec.nbytes], spec)

    # -- kernels ------------------------------------------------------------------------------------

    def kernel(self, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> Kernel:
        if dispatch.host is not None:
            return self.host_kernel(dispatch, specs)
        record = KERNELS[dispatch.kernel]
        impl = record.impls.get(NAME)
        if impl is None:
            raise KeyError(f"kernel {dispatch.kernel} has no WebGPU implementation")
        module, _, function = impl.partition(":")
        generate = getattr(importlib.import_module(module), function)
        call = Call(dispatch, record, tuple(specs[n] for n in dispatch.inputs),
                    tuple(specs[n] for n in dispatch.outputs), self.gpu.has_f16, has_packed_dot4(self.gpu))
        self._check_bindable(dispatch, (*call.ins, *call.outs))
        check_block_call(call)  # GGUF block bytes go only to the kernels that decode them
        shaders = generate(call)
        return ShaderKernel(self, dispatch, shaders if isinstance(shaders, list) else [shaders])

    def _check_bindable(self, dispatch: Dispatch, specs: tuple[TensorSpec, ...]) -> None:
        """Refuse, naming the tensor and the limit, a dispatch whose tensor is larger than one storage binding."""
        from ...device import RuntimeInputError  # the device module imports the backends

        limit = self.gpu.limits["max-storage-buffer-binding-size"]
        for spec in specs:
            if spec.nbytes > limit:
                raise RuntimeInputError(
                    f"dispatch {dispatch.kernel} (node {dispatch.node!r}) binds tensor {spec.name!r} of {spec.nbytes} "
                    f"bytes; {self.adapter} binds at most {limit} bytes: run it on an adapter with a larger "
                    "max-storage-buffer-binding-size, or on the CPU backend")

    def host_kernel(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> Kernel:
        return HostKernel(self, dispatch, specs)

    # -- the run boundary ---------------------------------------------------------------------------

    def record(self, pipeline: Any, bind_group: Any, workgroups: tuple[int, int, int],
               handles: tuple[Any, Any] | None = None) -> None:
        """Record one dispatch into the open run (a run opens on the first dispatch after ``begin_run``).
        ``handles``: the pipeline's and the bind group's native handles, when the caller keeps them."""
        handle = self._handle
        if handle is None or self._timer is not None:
            handle = self._open_pass()
        self._recorded += 1
        native = self._native
        if native is not None:  # the three C calls themselves: wgpu-py's wrappers cost twice as much
            pipeline_handle, group_handle = handles or (native.handle(pipeline), native.handle(bind_group))
            if pipeline is not self._pipeline:
                native.set_pipeline(handle, pipeline_handle)
            native.set_bind_group(handle, 0, group_handle, 0, native.null)
            native.dispatch(handle, *workgroups)
        else:
            if pipeline is not self._pipeline:
                self._pass.set_pipeline(pipeline)
            self._pass.set_bind_group(0, bind_group)
            self._pass.dispatch_workgroups(*workgroups)
        self._pipeline = pipeline
        if self._timer is not None:
            self._pass.end()
            self._pass = self._handle = None

    def _open_pass(self) -> Any:
        """Open a compute pass (with a timestamp pair around it when profiling); its native handle."""
        if self._encoder is None:
            self._encoder = self.device.create_command_encoder()
        if self._timer is not None:
            self._pass = self._encoder.begin_compute_pass(timestamp_writes=self._timer.writes(self.tag))
        else:
            self._pass = self._encoder.begin_compute_pass()
        self._pipeline = None
        self._handle = self._native.handle(self._pass) if self._native is not None else self._pass
        return self._handle

    @property
    def can_timestamp(self) -> bool:
        """Whether GPU time per dispatch can be measured (the adapter has ``timestamp-query``)."""
        return self.gpu.has_timestamps

    def start_timing(self, capacity: int) -> None:
        """Timestamp every dispatch recorded from now on (at most ``capacity``), tagged with ``self.tag``."""
        if not self.can_timestamp:
            raise RuntimeError(f"{self.adapter} has no timestamp queries")
        self.flush()
        self._timer = _Timer(self, capacity)

    def stop_timing(self) -> dict[int, float]:
        """GPU µs per tag of the dispatches recorded since ``start_timing`` (summed over a tag's passes)."""
        self.flush()
        timer, self._timer = self._timer, None
        return timer.read() if timer is not None else {}

    def begin_run(self) -> None:
        self.flush()

    def end_run(self) -> None:
        self.flush()

    def flush(self) -> None:
        """Submit what was recorded (nothing happens when nothing was)."""
        if self._pass is not None:
            self._pass.end()
            self._pass = self._handle = None
        if self._encoder is not None:
            encoder, self._encoder = self._encoder, None
            if self._timer is not None:
                self._timer.resolve(encoder)
            self.device.queue.submit([encoder.finish()])
            self.dispatch_submissions += self._recorded > 0
            self._recorded = 0

    def synchronize(self) -> None:
        """Wait for everything submitted: a read of a small buffer completes after all earlier work (queue
        order). (wgpu 0.32's ``on_submitted_work_done_sync`` does not run against its own wgpu-native.)"""
        self.flush()
        if self._fence is None:
            self._fence = self.device.create_buffer(size=4, usage=self._usage)
        self.device.queue.read_buffer(self._fence, 0, 4)

    def __repr__(self) -> str:
        return f"WebGPUBackend({self.adapter})"


class _Native:
    """wgpu-native's C functions for recording a dispatch, called directly (wgpu-py's wrappers check their
    arguments in Python: about 8 µs per dispatch against 3 µs). None where wgpu-py is not the wgpu-native
    backend this was written against (then the public API records)."""

    def __init__(self, api: Any) -> None:
        self.set_pipeline = api.lib.wgpuComputePassEncoderSetPipeline
        self.set_bind_group = api.lib.wgpuComputePassEncoderSetBindGroup
        self.dispatch = api.lib.wgpuComputePassEncoderDispatchWorkgroups
        self.null = api.ffi.NULL

    @staticmethod
    def handle(obj: Any) -> Any:
        """The wgpu-native handle of a wgpu-py object."""
        return obj._internal

    @classmethod
    def load(cls) -> _Native | None:
        try:
            from wgpu.backends.wgpu_native import _api

            return cls(_api)
        except (ImportError, AttributeError):
            return None


class _Timer:
    """Timestamp queries around each recorded pass: two per pass, resolved into a buffer as each encoder is
    submitted and read once at the end (values in nanoseconds, as wgpu reports them)."""

    def __init__(self, backend: WebGPUBackend, capacity: int) -> None:
        wgpu, device = backend.gpu.wgpu, backend.device
        self.backend = backend
        self.count = 2 * max(capacity, 1)
        self.queries = device.create_query_set(type=wgpu.QueryType.timestamp, count=self.count)
        self.results = device.create_buffer(size=8 * self.count,
                                            usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.tags: list[int] = []
        self.resolved = 0

    def writes(self, tag: int) -> dict[str, Any]:
        k = len(self.tags)
        if 2 * k + 2 > self.count:
            raise RuntimeError(f"more than {self.count // 2} timed dispatches in one profile run")
        self.tags.append(tag)
        return {"query_set": self.queries, "beginning_of_pass_write_index": 2 * k,
                "end_of_pass_write_index": 2 * k + 1}

    def resolve(self, encoder: Any) -> None:
        end = 2 * len(self.tags)
        if end > self.resolved:
            encoder.resolve_query_set(self.queries, self.resolved, end - self.resolved, self.results, 8 * self.resolved)
            self.resolved = end

    def read(self) -> dict[int, float]:
        if not self.tags:
            return {}
        raw = self.backend.device.queue.read_buffer(self.results, 0, 16 * len(self.tags))
        stamps = np.frombuffer(raw, dtype=np.uint64).astype(np.int64).reshape(-1, 2)
        out: dict[int, float] = {}
        for tag, (start, end) in zip(self.tags, stamps):
            out[tag] = out.get(tag, 0.0) + max(int(end - start), 0) / 1e3
        return out


class ShaderKernel:
    """One dispatch as its compute pipelines (usually one) with the bind groups of the tensors it ran on."""

    _pipelines: dict[tuple[int, str], Any] = {}  # by device and source: one compile per distinct shader
    _layouts: dict[tuple[int, int], Any] = {}

    def __init__(self, backend: WebGPUBackend, dispatch: Dispatch, shaders: list[Shader]) -> None:
        self.backend = backend
        self.dispatch = dispatch
        self.shaders = shaders
        self.pipelines = [self._pipeline(s) for s in shaders]
        self.scratch = [[backend.allocate(n) for n in s.scratch] for s in shaders]
        # what ``run`` records, for the argument lists it was last given (the executor passes the same ones)
        self._bound: tuple[Any, Any, list[tuple[Any, ...]]] = (None, None, [])

    def _pipeline(self, shader: Shader) -> Any:
        device = self.backend.device
        key = (id(device), shader.code)
        if key not in self._pipelines:
            n = len(self.dispatch.inputs) + len(self.dispatch.outputs) + len(shader.scratch)
            group_layout, layout = self._layout(n)
            try:
                module = device.create_shader_module(code=shader.code)
                pipeline = device.create_compute_pipeline(layout=layout, compute={"module": module,
                                                                                  "entry_point": "main"})
            except Exception as e:  # noqa: BLE001 - wgpu reports WGSL errors as GPUValidationError
                raise UnsupportedCall(f"the WGSL of {self.dispatch.kernel} did not compile: {e}\n{shader.code}") from e
            self._pipelines[key] = (pipeline, group_layout)
        return self._pipelines[key]

    def _layout(self, n: int) -> Any:
        device, wgpu = self.backend.device, self.backend.gpu.wgpu
        key = (id(device), n)
        if key not in self._layouts:
            entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "storage"}}
                       for i in range(n)]
            group = device.create_bind_group_layout(entries=entries)
            self._layouts[key] = (group, device.create_pipeline_layout(bind_group_layouts=[group]))
        return self._layouts[key]

    def prepare(self, weights: dict[str, Any]) -> None:
        for shader, scratch in zip(self.shaders, self.scratch):
            if shader.bind_check is not None:
                shader.bind_check(lambda i: self._bound_value(weights, i))
            if shader.bind_data is not None:
                for buffer, data in zip(scratch, shader.bind_data(lambda i: self._bound_value(weights, i))):
                    self.backend.write_bytes(buffer, data)

    def _bound_value(self, weights: dict[str, Any], index: int) -> np.ndarray | None:
        """Input ``index``'s values when they are bound before any run (a weight, a constant), else None."""
        handle = weights.get(self.dispatch.inputs[index])
        if not isinstance(handle, GPUTensor) or handle.spec is None:
            return None
        return self.backend.download(handle, handle.spec)

    def _bind_group(self, index: int, tensors: list[GPUTensor]) -> Any:
        """The bind group of shader ``index`` over ``tensors`` (inputs, outputs, then its scratch buffers)."""
        entries = []
        for i, t in enumerate(tensors):
            size = _round4(t.nbytes)  # the backend checked every size against the binding limit
            if t.nbytes == 0:  # never read or written; WebGPU binds no empty range
                entries.append({"binding": i, "resource": {"buffer": t.buffer, "offset": 0, "size": 4}})
                continue
            entries.append({"binding": i, "resource": {"buffer": t.buffer, "offset": t.offset, "size": size}})
        return self.backend.device.create_bind_group(layout=self.pipelines[index][1], entries=entries)

    def run(self, inputs: list[GPUTensor], outputs: list[GPUTensor]) -> None:
        last_inputs, last_outputs, commands = self._bound
        if inputs is not last_inputs or outputs is not last_outputs:  # a new binding: make its bind groups
            groups = [self._bind_group(i, [*inputs, *outputs, *scratch]) for i, scratch in enumerate(self.scratch)]
            native = self.backend._native
            commands = [(pipeline, group, shader.workgroups,
                         (native.handle(pipeline), native.handle(group)) if native is not None else None)
                        for (pipeline, _), group, shader in zip(self.pipelines, groups, self.shaders)]
            self._bound = (inputs, outputs, commands)
        record = self.backend.record
        for command in commands:
            record(*command)


# -- host <-> storage bytes ---------------------------------------------------------------------------------

def _to_storage(array: np.ndarray | torch.Tensor, spec: TensorSpec | None) -> bytes:
    """Little-endian bytes of ``array`` in ``spec``'s dtype and layout."""
    t = array.detach().cpu() if isinstance(array, torch.Tensor) else torch.from_numpy(np.array(array, copy=True))
    if spec is None:
        return t.contiguous().numpy().tobytes()
    if spec.quant is not None and spec.quant.block:  # GGUF blocks: their bytes as they lie (spec.storage)
        if t.dtype != torch.uint8:
            raise ValueError(f"{spec.name!r} holds {spec.quant.block} blocks: give their bytes (uint8), not {t.dtype}")
        return t.reshape([int(d) for d in spec.storage[1]]).contiguous().numpy().tobytes()
    t = t.to(dtype_from_name(spec.dtype)).reshape([int(d) for d in spec.shape])
    if spec.layout == "NHWC":
        t = t.permute(0, 2, 3, 1)
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def _from_storage(raw: bytes, spec: TensorSpec) -> np.ndarray:
    """The logical-order host array of storage bytes (bfloat16 widened exactly to float32)."""
    if spec.quant is not None and spec.quant.block:  # GGUF blocks: their bytes
        return np.frombuffer(raw, dtype=np.uint8).reshape([int(d) for d in spec.storage[1]]).copy()
    shape = [int(d) for d in spec.shape]
    stored = [shape[0], shape[2], shape[3], shape[1]] if spec.layout == "NHWC" else shape
    dtype = dtype_from_name(spec.dtype)
    if dtype == torch.bfloat16:
        t = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16).float() if raw else \
            torch.empty(0)
    else:
        t = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    t = t.reshape(stored)
    if spec.layout == "NHWC":
        t = t.permute(0, 3, 1, 2)
    return t.contiguous().numpy().copy()


class MetalBackend(WebGPUBackend):
    """Seed 004's Metal backend: the WebGPU backend on a Metal adapter (macOS). Elsewhere it says to use
    ``WebGPUBackend``, which runs the same kernels through Vulkan, D3D12 or Mesa."""

    def __init__(self) -> None:
        try:
            super().__init__(api="Metal")
        except NoAdapterError as e:
            raise NoAdapterError(f"MetalBackend needs a Metal adapter (macOS): {e}. On this machine use "
                                 "npu_runtime.WebGPUBackend() (or Device('webgpu')), which runs the same WGSL "
                                 "kernels through Vulkan, D3D12 or OpenGL") from None


__all__ = ["GPUTensor", "MetalBackend", "ShaderKernel", "WebGPUBackend"]
