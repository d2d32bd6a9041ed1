"""``DAGExecutor``: run a partition plan, NPU parts as compiled programs and CPU parts on the reference executor.

    plan = partition(ir_dict, is_op_supported)
    dag = DAGExecutor(plan, CPUBackend())
    dag.load_weights(state_dict)
    result = dag.execute(inputs={"x": array})      # output name -> numpy array

Every NPU partition is compiled once, at construction, for the backend's target; tensors that cross
between partitions go through host memory (on a real NPU that is the DMA between the two).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from npu_compiler import CompileOptions
from npu_compiler import compile as compile_ir
from npu_compiler.partition import NPU, Partition, PartitionPlan
from torch_ir.executor import IRExecutor
from torch_ir.weights import load_state_dict

from .backends import Backend
from .device import Device, RuntimeInputError, as_device
from .executor import Executor
from .weights import load_weights


class _Stage:
    """One partition, ready to run: a compiled program on the device, or the reference executor."""

    def __init__(self, part: Partition, device: Device) -> None:
        self.part = part
        self.executor: Executor | None = None
        self.reference: IRExecutor | None = None
        if part.device == NPU:
            options = CompileOptions(normalize=False, public_output_names=False)
            self.executor = Executor(compile_ir(part.ir, target=device.backend.target, options=options), device)

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

    def __init__(self, plan: PartitionPlan, backend: Backend | Device | str | None = None) -> None:
        self.device = as_device(backend if backend is not None else "cpu")
        if self.device.backend.target != plan.target:
            plan = _replace(plan, self.device.backend.target)
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


def _replace(plan: PartitionPlan, target: str) -> PartitionPlan:
    """``plan`` placed again for ``target``: a plan made with ``partition(ir, is_op_supported)`` (the default
    target, cpu) given to another backend (seed 004's ``DAGExecutor(plan, MetalBackend())``) runs on that
    backend's kernels, what it lacks on the CPU. Nodes the first plan kept off the NPU stay off it."""
    from npu_compiler import is_op_supported
    from npu_compiler import partition as place

    refused = {p.node for p in plan.placements if p.device != NPU}
    kept_off = {n.op_type for n in plan.ir.nodes if n.name in refused}
    warnings.warn(f"the partition plan of {plan.ir.model_name!r} was made for target {plan.target!r}; placed again "
                  f"for {target!r} (partition(..., target={target!r}) avoids this)", stacklevel=3)
    return place(plan.ir, lambda op: is_op_supported(op, target) and op not in kept_off, target=target,
                 normalize=False, public_output_names=False)


def _tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "to_numpy"):  # an NPUBuffer
        return torch.from_numpy(value.to_numpy())
    return torch.from_numpy(np.ascontiguousarray(value))


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).contiguous().numpy()
