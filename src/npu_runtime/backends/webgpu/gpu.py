"""The WebGPU device: one adapter and one logical device per process, with the limits and features we use.

wgpu-py (``wgpu``, a binding of wgpu-native) picks the adapter: Metal on macOS, Vulkan on Linux (NVIDIA, AMD,
Intel, or Mesa's lavapipe on a machine without a GPU), D3D12 on Windows, OpenGL as the last resort. The
device is made once and shared by every backend instance: pipelines and weights then outlive one backend.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

from torch_ir.errors import TorchIRError


class NoAdapterError(TorchIRError, RuntimeError):
    """No WebGPU adapter could be had (wgpu is not installed, or no driver offers one); the message says why."""


# Backends tried in order of preference: the native compute APIs before OpenGL (whose compute shaders lack
# features we use, e.g. shader-f16, on Mesa).
_PREFERRED = ("Metal", "Vulkan", "D3D12", "OpenGL")
#: Optional features requested when the adapter has them.
OPTIONAL_FEATURES = ("shader-f16", "timestamp-query", "subgroup")
_LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
           "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
           "max-compute-workgroup-size-x", "max-compute-workgroups-per-dimension")


@dataclass(frozen=True)
class GPU:
    """The device and what it can do."""

    wgpu: Any  # the wgpu module
    adapter: Any
    device: Any
    features: frozenset[str]
    limits: dict[str, int]
    backend_type: str  # "Vulkan", "Metal", ...
    summary: str

    @property
    def has_f16(self) -> bool:
        return "shader-f16" in self.features

    @property
    def has_timestamps(self) -> bool:
        return "timestamp-query" in self.features


def _import_wgpu() -> Any:
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # Mesa's drivers warn without it
    try:
        import wgpu
    except ImportError as e:
        raise NoAdapterError(f"the WebGPU backend needs the wgpu package (pip install 'wgpu==0.32.*'): {e}") from None
    return wgpu


def _choose(adapters: list[Any], want: str | None) -> Any:
    def backend_of(a: Any) -> str:
        return str(a.info.get("backend_type", ""))

    if want is not None:
        chosen = [a for a in adapters if backend_of(a).lower() == want.lower()]
        if not chosen:
            have = ", ".join(sorted({backend_of(a) for a in adapters})) or "none"
            raise NoAdapterError(f"no WebGPU adapter through {want}; this machine has: {have}")
        adapters = chosen
    rank = {name: i for i, name in enumerate(_PREFERRED)}
    discrete = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
    return min(adapters, key=lambda a: (rank.get(backend_of(a), 9),
                                        discrete.get(str(a.info.get("adapter_type", "")), 4)))


@cache
def get_gpu(api: str | None = None) -> GPU:
    """The process's WebGPU device (``api``: "Vulkan", "Metal", ... to insist on one; None picks the best).

    Raises NoAdapterError with the reason when there is none. Also read from ``TORCH_IR_WEBGPU_API``."""
    wgpu = _import_wgpu()
    api = api or os.environ.get("TORCH_IR_WEBGPU_API") or None
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # noqa: BLE001 - a missing driver surfaces as anything from wgpu-native
        raise NoAdapterError(f"wgpu found no adapter: {type(e).__name__}: {e}") from None
    if not adapters:
        raise NoAdapterError("wgpu found no adapter (no GPU driver, and no Mesa lavapipe/llvmpipe: "
                             "apt-get install mesa-vulkan-drivers)")
    adapter = _choose(adapters, api)
    features = frozenset(f for f in OPTIONAL_FEATURES if f in adapter.features)
    limits = {name: adapter.limits[name] for name in _LIMITS}
    device = adapter.request_device_sync(required_features=sorted(features), required_limits=limits)
    return GPU(wgpu, adapter, device, features, limits, str(adapter.info.get("backend_type", "")), adapter.summary)


#: False makes the int8 kernels use their emulated dot products even where the adapter has the packed ones (tests
#: run both paths; ``TORCH_IR_WEBGPU_DOT4=0`` sets it for a process).
USE_PACKED_DOT4 = os.environ.get("TORCH_IR_WEBGPU_DOT4", "1") != "0"
_DOT4: dict[int, bool] = {}
# a probe of signed, unsigned and mixed bytes with a known answer: 4·1 + 3·1 + 2·1 + 1·(-1), 255·255 + 128·2
_DOT4_PROBE = """
@group(0) @binding(0) var<storage, read_write> o: array<i32>;
@compute @workgroup_size(1) fn main() {
  o[0] = dot4I8Packed(0x01020304u, 0xff010101u); o[1] = i32(dot4U8Packed(0x80ffu, 0x02ffu));
}
"""


def has_packed_dot4(gpu: GPU) -> bool:
    """Whether WGSL's ``dot4I8Packed`` / ``dot4U8Packed`` (the ``packed_4x8_integer_dot_product`` language feature)
    compile and give the right answer on this device: read from ``wgsl_language_features`` where wgpu reports them,
    else found by compiling and running a probe once (wgpu-native 0.32 reports none, while its compiler has them).
    False with ``USE_PACKED_DOT4`` off."""
    if not USE_PACKED_DOT4:
        return False
    key = id(gpu.device)
    if key not in _DOT4:
        reported = getattr(gpu.wgpu.gpu, "wgsl_language_features", None) or set()
        _DOT4[key] = "packed_4x8_integer_dot_product" in reported or _probe_dot4(gpu)
    return _DOT4[key]


def _probe_dot4(gpu: GPU) -> bool:
    wgpu, device = gpu.wgpu, gpu.device
    try:
        module = device.create_shader_module(code=_DOT4_PROBE)
        pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        buffer = device.create_buffer(size=8, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                         entries=[{"binding": 0, "resource": {"buffer": buffer}}])
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(1)
        compute.end()
        device.queue.submit([encoder.finish()])
        got = bytes(device.queue.read_buffer(buffer, 0, 8))
    except Exception:  # noqa: BLE001 - a compiler without the builtins rejects the probe: use the emulation
        return False
    return got == (8).to_bytes(4, "little") + (255 * 255 + 256).to_bytes(4, "little")


def adapter_problem() -> str | None:
    """Why there is no WebGPU adapter here (None when there is one): tests skip with this reason."""
    try:
        get_gpu()
    except NoAdapterError as e:
        return str(e)
    return None
