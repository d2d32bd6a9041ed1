"""``DAGExecutor``: run a partition plan, NPU parts as compiled programs and CPU parts on the reference executor.

    plan = partition(ir_dict, is_op_supported)
    dag = DAGExecutor(plan, CPUBackend())
    dag.load_weights(state_dict)
    result = dag.execute(inputs={"x": array})      # output name -> numpy array

The plan compiles its NPU partitions for the backend's target (``PartitionPlan.compiled``, the compiler's own
method): the runtime runs programs and never imports the compiler. Tensors that cross between partitions go
through host memory (on a real NPU that is the DMA between the two).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from torch_ir.executor import IRExecutor
from torch_ir.weights import load_state_dict

from .backends import Backend
from .device import Device, RuntimeInputError, as_device
from .executor import Executor
from .weights import load_weights


class _Stage:
    """One partition, ready to run: a compiled program on the device, or the reference executor."""

    def __init__(self, part: Any, device: Device) -> None:
        self.part = part  # an npu_compiler.partition.Partition; its program is None for a CPU part
        self.executor = Executor(part.program, device) if part.program is not None else None
        self.reference: IRExecutor | None = None

    def load(self, state: dict[str, torch.Tensor], device: Device) -> None:
        if self.executor is not None:
            self.executor.bind(load_weights(state, self.executor.program, device))
        else:
            self.reference = IRExecutor(self.part.ir, state, strict_weights=False)

    def run(self, env: dict[str, torch.Tensor]) -> None:
        inputs = {name: env[name] for name in self.part.inputs}
        if self.executor is not None:
            outputs = self.executor.run(inputs)
            env.update({name: torch.from_numpy(buf.to_numpy()) for name, buf in outputs.items()})
        else:
            assert self.reference is not None
            env.update(zip(self.part.outputs, self.reference.run(inputs)))


class DAGExecutor:
    """Runs every partition of ``plan`` in order on ``backend`` (a backend, a ``Device`` or a name)."""

    def __init__(self, plan: Any, backend: Backend | Device | str | None = None) -> None:
        """``plan``: an ``npu_compiler.partition.PartitionPlan`` (typed loosely: the runtime does not import the
        compiler); its NPU parts are compiled for the backend's target by the plan itself."""
        self.device = as_device(backend if backend is not None else "cpu")
        plan = plan.compiled(self.device.backend.target)
        self.plan = plan
        self.stages = [_Stage(part, self.device) for part in plan.partitions]
        self.loaded = False

    @property
    def programs(self) -> list[Any]:
        """The compiled programs of the NPU partitions."""
        return [s.executor.program for s in self.stages if s.executor is not None]

    @property
    def dispatch_count(self) -> int:
        return sum(p.dispatch_count for p in self.programs)

    def load_weights(self, weights: Any) -> None:
        """Bind the model's weights (a state dict of tensors or arrays, a file, or a module) to every part."""
        if isinstance(weights, Mapping):
            weights = {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v))
                       for k, v in weights.items()}
        state = load_state_dict(weights)
        for stage in self.stages:
            stage.load(state, self.device)
        self.loaded = True

    def execute(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the whole graph; returns the graph outputs by name as numpy arrays."""
        if not self.loaded:
            raise RuntimeInputError("no weights: call dag.load_weights(state_dict) before dag.execute(...)")
        names = [t.name for t in self.plan.ir.graph_inputs]
        missing, extra = [n for n in names if n not in inputs], [n for n in inputs if n not in names]
        if missing or extra:
            raise RuntimeInputError(f"model {self.plan.ir.model_name!r} takes inputs {names}; "
                                    f"missing {missing}, unexpected {extra}")
        env = {name: _tensor(value) for name, value in inputs.items()}
        for stage in self.stages:
            stage.run(env)
        return {t.name: _numpy(env[t.name]) for t in self.plan.ir.graph_outputs}


def _tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "to_numpy"):  # an NPUBuffer
        return torch.from_numpy(value.to_numpy())
    return torch.from_numpy(np.ascontiguousarray(value))


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).contiguous().numpy()
