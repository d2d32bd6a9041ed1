"""The compiled program: what the NPU compiler produces and the runtime loads.

A `CompiledProgram` is a flat list of kernel dispatches over named tensors plus the memory plan that places
those tensors in one activation arena. It is plain data (no torch import) so that a runtime, a test or a
reporting tool can load and inspect it without the compiler's dependencies. `save`/`load` go through the
`.npubin` format in `npu_compiler.npubin`.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Bytes per element, keyed by torch dtype names without the "torch." prefix. Kept here rather than taken
# from torch so that reading a program never needs torch.
DTYPE_SIZES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def _int(value: Any) -> int:
    """An integer field of a file: a JSON integer, not a float, string or bool that ``int()`` would accept."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def dtype_size(dtype: str) -> int:
    """Bytes per element of `dtype`; an unknown name is an error because a guessed size corrupts memory plans."""
    try:
        return DTYPE_SIZES[dtype]
    except KeyError:
        known = ", ".join(sorted(DTYPE_SIZES))
        raise ValueError(f"unknown dtype {dtype!r}: use one of {known}") from None


@dataclass
class TensorSpec:
    """Name, shape and dtype of one tensor: enough to size and place it without holding its data."""

    name: str
    shape: list[int]
    dtype: str
    # Target-specific storage layout (e.g. "NHWC"); None means the contiguous row-major default.
    layout: str | None = None

    @property
    def numel(self) -> int:
        """Element count; a 0-d tensor has one element."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Storage size in bytes, which is what the memory planner and the constant checks need."""
        return self.numel * dtype_size(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "layout": self.layout}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(name=data["name"], shape=[_int(d) for d in data["shape"]], dtype=data["dtype"],
                   layout=data.get("layout"))


@dataclass
class Dispatch:
    """One kernel launch: the unit the runtime executes, in program order."""

    # Kernel name from the target's kernel library, e.g. "gemm", "conv2d" or "aten.add.Tensor".
    kernel: str
    # The IR node this launch came from, so errors and profiles can point back at the model.
    node: str
    inputs: list[str]
    outputs: list[str]
    # Kernel arguments; JSON values only (lists, not tuples) so that they survive a save/load round trip.
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "node": self.node, "inputs": list(self.inputs),
                "outputs": list(self.outputs), "params": self.params}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Dispatch:
        if not all(isinstance(data[k], list) for k in ("inputs", "outputs")):
            raise TypeError("dispatch inputs and outputs must be lists of tensor names")
        return cls(kernel=data["kernel"], node=data["node"], inputs=list(data["inputs"]),
                   outputs=list(data["outputs"]), params=dict(data.get("params", {})))


@dataclass
class MemoryPlan:
    """Where each activation tensor lives inside one preallocated arena, so the runtime never allocates."""

    arena_bytes: int
    # Byte offset of each activation tensor inside the arena.
    offsets: dict[str, int]
    # What the activations would need with no reuse at all; reported next to arena_bytes to show the saving.
    no_reuse_bytes: int
    alignment: int = 64
    # View tensor -> tensor whose storage it shares; a view has no storage of its own to plan.
    aliases: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"arena_bytes": self.arena_bytes, "offsets": dict(self.offsets),
                "no_reuse_bytes": self.no_reuse_bytes, "alignment": self.alignment, "aliases": dict(self.aliases)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryPlan:
        return cls(arena_bytes=_int(data["arena_bytes"]), offsets={k: _int(v) for k, v in data["offsets"].items()},
                   no_reuse_bytes=_int(data["no_reuse_bytes"]), alignment=_int(data.get("alignment", 64)),
                   aliases=dict(data.get("aliases", {})))


@dataclass
class CompiledProgram:
    """A model compiled for one target: everything the runtime needs except the weight data itself.

    Weights stay in their own file (looked up through `weight_keys`) so that recompiling does not rewrite
    gigabytes; only small constants are embedded. Everything here must be deterministic: the same model and
    options must give a byte-identical file, so `metadata` must not hold timestamps, paths or host names.
    """

    model_name: str
    target: str
    input_specs: list[TensorSpec]
    output_specs: list[TensorSpec]
    # Named weight slots the runtime binds before the first run.
    weight_specs: list[TensorSpec]
    # Weight slot name -> key in the weights file (e.g. a state-dict key).
    weight_keys: dict[str, str]
    # Every intermediate tensor (and every constant) by name.
    tensors: dict[str, TensorSpec]
    dispatches: list[Dispatch]
    memory: MemoryPlan
    # Raw little-endian data of small constant tensors; their specs are in `tensors`.
    constants: dict[str, bytes] = field(default_factory=dict)
    # The normalized IR as a JSON dict, kept for CPU fallback and debugging; None to ship a smaller file.
    ir: dict[str, Any] | None = None
    # Compiler version, options and similar; no timestamps (the file must be deterministic).
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def dispatch_count(self) -> int:
        return len(self.dispatches)

    @property
    def arena_bytes(self) -> int:
        return self.memory.arena_bytes

    @property
    def weight_bytes(self) -> int:
        return sum(spec.nbytes for spec in self.weight_specs)

    def kernel_histogram(self) -> dict[str, int]:
        """Dispatches per kernel, most used first (ties by name), to see where a program spends its launches."""
        counts = Counter(d.kernel for d in self.dispatches)
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def summary(self) -> str:
        """A few human-readable lines for CLIs and logs."""
        top = ", ".join(f"{kernel} {n}" for kernel, n in list(self.kernel_histogram().items())[:5])
        memory = self.memory
        saved = 1 - memory.arena_bytes / memory.no_reuse_bytes if memory.no_reuse_bytes else 0.0
        constant_bytes = sum(len(data) for data in self.constants.values())
        return "\n".join([
            f"model: {self.model_name}  target: {self.target}",
            f"dispatches: {self.dispatch_count}" + (f" ({top})" if top else ""),
            f"arena: {memory.arena_bytes} bytes ({_human(memory.arena_bytes)}) vs {memory.no_reuse_bytes} bytes"
            f" without reuse ({saved:.0%} saved)",
            f"weights: {len(self.weight_specs)} tensors, {self.weight_bytes} bytes ({_human(self.weight_bytes)})",
            f"constants: {len(self.constants)} embedded, {constant_bytes} bytes",
        ])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the program as a `.npubin` file, atomically (see `npu_compiler.npubin.write_npubin`)."""
        from npu_compiler.npubin import write_npubin  # local import: npubin imports this module

        write_npubin(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CompiledProgram:
        """Read a `.npubin` file; raises `NpubinError` naming the file and the fix if it is not usable."""
        from npu_compiler.npubin import read_npubin

        return read_npubin(path)


def _human(nbytes: int) -> str:
    """Bytes as KiB/MiB/GiB for reading; the exact count is printed beside it."""
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}" if unit != "B" else f"{nbytes} B"
        size /= 1024
    return f"{size:.1f} GiB"
