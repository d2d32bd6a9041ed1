"""``Executor``: run a compiled program on a device, dispatch by dispatch, over one preallocated arena.

Construction does everything that can be done once: the arena is allocated, every tensor is given its
view of the arena (or of its base, for a view), every dispatch gets its kernel. Binding a weight set
prepares the kernels (batch norm folded, weights prepacked) and builds, per dispatch, the lists of
input and output tensors, so that a run is the input copy, a loop of ``kernel.run(inputs, outputs)``
and the output copies: nothing is looked up or allocated per dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from npu_compiler.compiled_program import CompiledProgram, TensorSpec
from npu_compiler.memory import resolve_alias
from npu_compiler.program_check import check_program
from torch_ir.errors import TorchIRError

from .device import Device, NPUBuffer, RuntimeInputError, as_device, check_array
from .weights import Weights, load_weights

Step = tuple[Callable[[list[Any], list[Any]], None], list[Any], list[Any]]
InputValue = NPUBuffer | np.ndarray | Any


class DispatchError(TorchIRError, RuntimeError):
    """A kernel failed; the message names the dispatch, its kernel and the IR node it came from."""


class Executor:
    """Runs one ``CompiledProgram`` on one device.

        executor = Executor(program, device)
        weights = load_weights("model.safetensors", program, device)
        outputs = executor.run(inputs={"input": buffer}, weights=weights)   # name -> NPUBuffer
    """

    def __init__(self, program: CompiledProgram, device: Device | Any = None) -> None:
        self.program = program
        self.device = as_device(device if device is not None else "cpu")
        backend = self.device.backend
        if backend.target != program.target:
            raise RuntimeInputError(
                f"program {program.model_name!r} was compiled for target {program.target!r}; the {backend.name} "
                f"backend runs target {backend.target!r}: compile with npu_compiler.compile(..., "
                f"target={backend.target!r})")
        check_program(program)  # a loaded program is untrusted data: re-check it before allocating anything
        self.arena = backend.allocate(program.arena_bytes)
        self.tensors = self._place()
        self.constants = {name: backend.from_bytes(data, program.tensors[name])
                          for name, data in program.constants.items()}
        self.specs: dict[str, TensorSpec] = {**program.tensors, **{w.name: w for w in program.weight_specs}}
        self.fixed = set(self.constants) | {w.name for w in program.weight_specs}
        self.kernels = [self._kernel(i, d) for i, d in enumerate(program.dispatches)]
        self.steps: list[Step] = []
        self.bound: Weights | Mapping[str, NPUBuffer] | None = None

    def _kernel(self, index: int, dispatch: Any) -> Any:
        try:
            return self.device.backend.kernel(dispatch, self.specs, self.fixed)
        except TorchIRError:
            raise
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
            raise RuntimeInputError(
                f"dispatch {index} ({dispatch.kernel}, node {dispatch.node!r}) of program {self.program.model_name!r} "
                f"has parameters its kernel cannot use ({type(e).__name__}: {e}); recompile the model") from None

    def _place(self) -> dict[str, Any]:
        """Every activation (and view) at its offset in the arena."""
        memory, backend = self.program.memory, self.device.backend
        placed = {}
        for name, spec in self.program.tensors.items():
            root = resolve_alias(name, memory.aliases)
            if root in memory.offsets:
                placed[name] = backend.view(self.arena, memory.offsets[root], spec)
        return placed

    # -- weights ------------------------------------------------------------------------------------

    def bind(self, weights: Weights | Mapping[str, NPUBuffer] | Any) -> None:
        """Prepare every kernel for ``weights`` (a ``load_weights`` result, or anything it accepts)."""
        if not isinstance(weights, Weights) and not _all_buffers(weights):
            weights = load_weights(weights, self.program, self.device)
        missing = sorted({w.name for w in self.program.weight_specs} - set(weights))
        if missing:
            raise RuntimeInputError(f"weights for program {self.program.model_name!r} lack slots {missing[:10]}; "
                                    "load them with npu_runtime.load_weights(path, program, device)")
        env = {**self.tensors, **self.constants, **{name: weights[name].data for name in self.fixed
                                                    if name not in self.constants}}
        self.steps = []
        for dispatch, kernel in zip(self.program.dispatches, self.kernels):
            kernel.prepare({name: env[name] for name in dispatch.inputs if name in self.fixed})
            self.steps.append((kernel.run, [env[n] for n in dispatch.inputs], [env[n] for n in dispatch.outputs]))
        self.bound = weights

    # -- running ------------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, InputValue],
            weights: Weights | Mapping[str, NPUBuffer] | None = None) -> dict[str, NPUBuffer]:
        """Run once; returns the outputs by name as new buffers (the next run does not overwrite them)."""
        self.ensure_bound(weights)
        self.copy_in(inputs)
        self.run_steps()
        return self.copy_out()

    def ensure_bound(self, weights: Any) -> None:
        """Bind ``weights`` if they are new; without weights, the ones bound before (a program without
        weight slots needs none)."""
        if weights is not None and weights is not self.bound:
            self.bind(weights)
        elif self.bound is None:
            if self.program.weight_specs:
                raise RuntimeInputError(
                    f"program {self.program.model_name!r} has {len(self.program.weight_specs)} weight slots and no "
                    "weights were given: pass weights=npu_runtime.load_weights(path, program, device)")
            self.bind({})

    def copy_in(self, inputs: Mapping[str, InputValue]) -> None:
        """Check every input against its spec and copy it into its arena slot."""
        specs = self.program.input_specs
        names = [s.name for s in specs]
        missing, extra = [n for n in names if n not in inputs], [n for n in inputs if n not in names]
        if missing or extra:
            raise RuntimeInputError(f"program {self.program.model_name!r} takes inputs {names}; "
                                    f"missing {missing}, unexpected {extra}")
        backend = self.device.backend
        for spec in specs:
            value = inputs[spec.name]
            where = f"input {spec.name!r} of program {self.program.model_name!r}"
            if isinstance(value, NPUBuffer):
                if list(value.spec.shape) != list(spec.shape) or value.spec.dtype != spec.dtype:
                    raise RuntimeInputError(f"{where} must be {spec.dtype}{list(spec.shape)}, got the buffer "
                                            f"{value!r}")
                backend.copy(self.tensors[spec.name], value.data)
            else:
                array = _as_numpy(value)
                check_array(array, spec, where)
                backend.copy_in(self.tensors[spec.name], array)

    def run_steps(self) -> None:
        """The dispatch loop itself."""
        try:
            for run, ins, outs in self.steps:
                run(ins, outs)
        except Exception as e:  # noqa: BLE001 - re-raised with the dispatch that failed
            index = next(i for i, step in enumerate(self.steps) if step[0] is run)
            dispatch = self.program.dispatches[index]
            raise DispatchError(f"dispatch {index} ({dispatch.kernel}, node {dispatch.node!r}) of program "
                                f"{self.program.model_name!r} failed: {type(e).__name__}: {e}") from e

    def copy_out(self) -> dict[str, NPUBuffer]:
        backend = self.device.backend
        return {spec.name: NPUBuffer(backend.clone(self.tensors[spec.name]), spec, self.device)
                for spec in self.program.output_specs}

    def profile(self, inputs: Mapping[str, InputValue], weights: Any = None, *, runs: int = 10,
                warmup: int = 2) -> Any:
        """Time every dispatch over ``runs`` runs (see ``npu_runtime.profile.Profile``)."""
        from .profile import profile_executor

        return profile_executor(self, inputs, weights, runs=runs, warmup=warmup)


def _all_buffers(weights: Any) -> bool:
    return isinstance(weights, Mapping) and all(isinstance(v, NPUBuffer) for v in weights.values())


def _as_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch.Tensor
        value = value.detach().cpu()
        return value.float().numpy() if str(value.dtype) == "torch.bfloat16" else value.numpy()
    return np.asarray(value)
