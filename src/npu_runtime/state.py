"""``State``: a program's persistent buffers (a KV cache), kept across runs and shared between programs.

A program's ``state_specs`` name buffers that its dispatches read and write and that must survive from
one run to the next. They live outside the activation arena, like weights, in a ``State`` object that the
caller owns:

    state = State(prefill_program, device)                 # initialized as each spec says (zeros)
    prefill.run(inputs, weights=weights, state=state)
    decode.run(inputs, weights=weights, state=state)       # sees what prefill wrote

Buffers are keyed by ``StateSpec.key`` (its ``shared_key``, or its name), so two programs whose slots
share a key read and write the same buffer when given the same ``State``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from npu_program.program import CompiledProgram, StateSpec

from .device import Device, NPUBuffer, RuntimeInputError, as_device


class State:
    """Persistent buffers by key; see the module docstring."""

    def __init__(self, program_or_specs: CompiledProgram | Iterable[StateSpec] = (),
                 device: Device | Any = None) -> None:
        self.device = as_device(device if device is not None else "cpu")
        self.specs: dict[str, StateSpec] = {}
        self.buffers: dict[str, NPUBuffer] = {}
        self.add(program_or_specs)

    def add(self, program_or_specs: CompiledProgram | Iterable[StateSpec]) -> None:
        """Create the buffers of slots not held yet (another program's); a key held already must match."""
        specs = program_or_specs.state_specs if isinstance(program_or_specs, CompiledProgram) else program_or_specs
        for spec in specs:
            held = self.specs.get(spec.key)
            if held is not None:
                check_slot(held, spec, "this State")
                continue
            self.specs[spec.key] = spec
            self.buffers[spec.key] = NPUBuffer(self._initial(spec), spec.tensor_spec(), self.device)

    def _initial(self, spec: StateSpec) -> Any:
        if spec.init != "zeros":
            raise RuntimeInputError(f"state slot {spec.name!r}: unknown initial value {spec.init!r}")
        return self.device.backend.from_bytes(bytes(spec.nbytes), spec.tensor_spec())

    def reset(self) -> None:
        """Every buffer back to its initial value, in place (executors holding it keep working)."""
        backend = self.device.backend
        for key, spec in self.specs.items():
            backend.copy(self.buffers[key].data, self._initial(spec))

    def __getitem__(self, key: str) -> NPUBuffer:
        return self.buffers[key]

    def __contains__(self, key: object) -> bool:
        return key in self.buffers

    def __iter__(self) -> Iterator[str]:
        return iter(self.buffers)

    def __len__(self) -> int:
        return len(self.buffers)

    def __repr__(self) -> str:
        nbytes = sum(spec.nbytes for spec in self.specs.values())
        return f"State({len(self)} slots, {nbytes} bytes, {self.device.name})"


def check_slot(held: StateSpec, spec: StateSpec, where: str) -> None:
    """Raise unless the buffer made for ``held`` can serve ``spec`` (same shape and dtype)."""
    if list(held.shape) != list(spec.shape) or held.dtype != spec.dtype:
        raise RuntimeInputError(
            f"state slot {spec.name!r} (key {spec.key!r}) is {spec.dtype}{list(spec.shape)} but {where} holds "
            f"{held.dtype}{list(held.shape)} under that key; slots shared by several programs must agree")


__all__ = ["State"]
