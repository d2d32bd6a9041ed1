"""``DynamicExecutor``: run a ``DynamicProgram`` (shape buckets) with inputs of any shape it serves.

Per run: the symbols are read from the inputs' shapes, the program picks the variant
(``DynamicProgram.select``: exact sizes, or the smallest larger bucket where the compiler found padding
harmless), the inputs are padded with their pad values, the variant runs, and the outputs are cut back to the
actual sizes. An upper-bound program (``DynamicProgram.template``) is instead instantiated at the actual sizes
(``npu_program.template.instantiate``: every dispatch sized from the symbols, the arena the upper bound's) and
run as it is, without padding. ``Executor(dynamic_program)`` makes one of these, so callers need not know which kind of
program a file holds.

One weight set serves every variant: the weights are loaded once (``load_weights(path, dynamic_program)``)
and each variant's executor binds the same buffers; a variant's executor is made the first time a shape
needs it. Only one variant runs at a time, so the variants share one arena (the largest); what a variant's
bind-time dispatches compute gets memory of its own beside it (``Executor(arena=...)``), since another
variant's run would overwrite it in the shared one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npu_program.dynamic import DynamicProgram, ShapeError, Variant, check_dynamic
from npu_program.program import TensorSpec
from npu_program.template import TemplateError, instantiate

from .device import Device, NPUBuffer, RuntimeInputError, as_device, host_array
from .state import State
from .weights import Weights, already_loaded, load_weights, weights_required

#: The sizes an upper-bound program keeps executors for (each has kernels made and prepacked for its shapes).
MAX_INSTANCES = 8


class DynamicExecutor:
    """Runs a ``DynamicProgram`` on one device; ``run`` takes inputs of any shape the program serves."""

    def __init__(self, program: DynamicProgram, device: Device | Any = None, *, validate: bool = False) -> None:
        try:
            check_dynamic(program, f"dynamic program {program.model_name!r}")
        except ShapeError as err:
            raise RuntimeInputError(str(err)) from None
        self.program = program
        self.device = as_device(device if device is not None else "cpu")
        self.validate = validate
        self.executors: dict[int, Any] = {}
        self.arena = self.device.backend.allocate(program.arena_bytes)
        self.bound: Weights | Mapping[str, NPUBuffer] | None = None
        self.state: State | None = None
        self.last_variant: Variant | None = None  # the variant the last run took (for tests and profiles)

    def executor_for(self, variant: Variant) -> Any:
        """The executor of ``variant`` (of an upper-bound program: its instance at the variant's sizes), made on
        first use over the shared arena. An upper-bound program keeps the executors of the last
        ``MAX_INSTANCES`` sizes (each holds its kernels, prepacked for its shapes)."""
        key = tuple(sorted(variant.sizes.items()))
        if key not in self.executors:
            from .executor import Executor  # the module that imports this one

            if self.program.template is not None and len(self.executors) >= MAX_INSTANCES:
                del self.executors[next(iter(self.executors))]  # the oldest
            self.executors[key] = Executor(variant.program, self.device, validate=self.validate, arena=self.arena)
        else:
            self.executors[key] = self.executors.pop(key)  # most recently used last
        return self.executors[key]

    def bind(self, weights: Weights | Mapping[str, NPUBuffer] | Any, state: State | None = None) -> None:
        """Load ``weights`` once (a path, a state dict, a module or a ``load_weights`` result) for every variant."""
        if not already_loaded(weights):
            weights = load_weights(weights, self.program, self.device)  # one weight table for every variant
        self.bound = weights
        if state is not None or self.state is None:
            self.state = state if state is not None else State(self.program.weight_program, self.device)

    def run(self, inputs: Mapping[str, Any], weights: Weights | Mapping[str, NPUBuffer] | Any = None,
            state: State | None = None) -> dict[str, NPUBuffer]:
        """Run the variant for the inputs' shapes; the outputs have the actual sizes."""
        if weights is not None and weights is not self.bound:
            self.bind(weights, state)
        elif self.bound is None:
            if self.program.weight_specs:
                raise weights_required(self.program)
            self.bind({}, state)
        elif state is not None:
            self.state = state
        sizes, variant, padded = self.prepare(inputs)
        outputs = self.executor_for(variant).run(padded, weights=self.bound, state=self.state)
        return {name: self._cut(buffer, sizes, variant) for name, buffer in outputs.items()}

    def prepare(self, inputs: Mapping[str, Any]) -> tuple[dict[str, int], Variant, dict[str, np.ndarray]]:
        """The symbol sizes of ``inputs``, the variant that serves them and the inputs padded to its sizes."""
        # padding and reading the shapes happen on the host (the input is copied into the arena anyway)
        arrays = {name: host_array(value) for name, value in inputs.items()}
        try:
            sizes = self.program.bind_symbols({name: a.shape for name, a in arrays.items()})
            variant = self.program.select(sizes)
        except ShapeError as err:
            raise RuntimeInputError(str(err)) from None
        if self.program.template is not None:  # sized at run time: the instance at exactly these sizes
            variant = Variant(dict(sizes), self._instance(sizes))
        self.last_variant = variant
        return sizes, variant, {name: self._pad(name, array, variant) for name, array in arrays.items()}

    def _instance(self, sizes: Mapping[str, int]) -> Any:
        key = tuple(sorted(sizes.items()))
        if key in self.executors:
            return self.executors[key].program
        try:
            return instantiate(self.program.variants[0].program, self.program.template, sizes,
                               f"dynamic program {self.program.model_name!r}")
        except TemplateError as err:
            raise RuntimeInputError(str(err)) from None

    def profile(self, inputs: Mapping[str, Any], weights: Any = None, **kwargs: Any) -> Any:
        """Profile the variant that serves ``inputs`` (padded to its sizes); see ``Executor.profile``."""
        if weights is not None and weights is not self.bound:
            self.bind(weights)
        _, variant, padded = self.prepare(inputs)
        return self.executor_for(variant).profile(padded, self.bound, **kwargs)

    def _pad(self, name: str, array: np.ndarray, variant: Variant) -> np.ndarray:
        for symbol, padding in self.program.padding.items():
            for axis in padding.inputs:
                have, want = array.shape[axis.axis], variant.sizes[symbol]
                if axis.name == name and have < want:
                    widths = [(0, 0)] * array.ndim
                    widths[axis.axis] = (0, want - have)
                    array = np.pad(array, widths, constant_values=np.array(axis.value).astype(array.dtype))
        return array

    def _cut(self, buffer: NPUBuffer, sizes: Mapping[str, int], variant: Variant) -> NPUBuffer:
        cuts = [(axis.axis, sizes[symbol]) for symbol, padding in self.program.padding.items()
                for axis in padding.outputs if axis.name == buffer.spec.name and variant.sizes[symbol] > sizes[symbol]]
        if not cuts:
            return buffer
        array = buffer.to_numpy()
        index = [slice(None)] * array.ndim
        for axis, size in cuts:
            index[axis] = slice(0, size)
        array = np.ascontiguousarray(array[tuple(index)])
        spec = TensorSpec(buffer.spec.name, list(array.shape), buffer.spec.dtype)
        return NPUBuffer.from_numpy(array, self.device, spec=spec)


__all__ = ["MAX_INSTANCES", "DynamicExecutor"]
