"""npu_runtime: run compiled programs (``Executor``) and partitioned graphs (``DAGExecutor``) on a backend.

    from npu_runtime import Device, Executor, NPUBuffer, load_weights
    device = Device()                                       # the CPU backend; Device("webgpu"): WGSL on a GPU
    executor = Executor(program, device)
    weights = load_weights("model.safetensors", program, device)
    buf = NPUBuffer.from_numpy(x, device, spec=program.input_specs[0])
    out = executor.run(inputs={"input": buf}, weights=weights)["output"].to_numpy(spec=program.output_specs[0])
"""

from .backends import Backend, CPUBackend, get_backend
from .backends.webgpu import MetalBackend, NoAdapterError, WebGPUBackend
from .dag import DAGExecutor
from .device import Device, NPUBuffer, RuntimeInputError
from .executor import DispatchError, Executor
from .generate import Generation, Generator
from .profile import Profile
from .state import State
from .validate import ValidationError
from .weights import Weights, load_weights

__all__ = [
    "Backend", "CPUBackend", "DAGExecutor", "Device", "DispatchError", "Executor", "Generation", "Generator",
    "MetalBackend", "NPUBuffer", "NoAdapterError", "Profile", "RuntimeInputError", "State", "ValidationError",
    "WebGPUBackend", "Weights", "get_backend", "load_weights",
]

