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


def adapter_problem() -> str | None:
    """Why there is no WebGPU adapter here (None when there is one): tests skip with this reason."""
    try:
        get_gpu()
    except NoAdapterError as e:
        return str(e)
    return None
