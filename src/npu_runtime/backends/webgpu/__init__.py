"""The WebGPU backend: compiled programs as WGSL compute shaders on any GPU (Metal, Vulkan, D3D12, Mesa).

Importing this package does not import wgpu; making a backend does (``NoAdapterError`` says why not)."""

from .backend import GPUTensor, MetalBackend, WebGPUBackend
from .gpu import NoAdapterError, adapter_problem

__all__ = ["GPUTensor", "MetalBackend", "NoAdapterError", "WebGPUBackend", "adapter_problem"]
