"""The compiled program: what the NPU compiler produces and the runtime loads.

A `CompiledProgram` is a flat list of kernel dispatches over named tensors plus the memory plan that places
those tensors in one activation arena. It is plain data (no torch import) so that a runtime, a test or a
reporting tool can load and inspect it without the compiler's dependencies. The classes here are plain
dataclasses; their JSON form comes from the one generic codec, `npu_program.codec` (`to_json` /
`from_json`), and `save`/`load` go through the `.npubin` format in `npu_program.npubin`.

Tensors come in four kinds, each with its own storage:

* activations (`tensors`, placed in the arena by `memory`), inputs and outputs among them;
* weights (`weight_specs`), bound from a weights file, read-only;
* constants (`constants`), small data embedded in the file, read-only;
* state (`state_specs`), persistent buffers such as a KV cache: created and initialized once
  (`npu_runtime.State`), written by dispatches, kept across runs and shareable by several programs.

Shapes are concrete integers today. Symbolic dimensions (a sequence length known only at run time) will
come as a new optional field (e.g. `TensorSpec.sym_shape: list[int | str] | None`, strings naming a
dimension variable), so files without it keep their meaning; readers of this version refuse such a field
as unknown rather than misreading it.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch_ir.dtypes import get_dtype, nbytes
from torch_ir.quant.spec import QuantSpec, stored

from .kernels import KERNEL_ALIASES

#: Initial values a state slot may ask for.
STATE_INITS = ("zeros",)


def dtype_size(dtype: str) -> int:
    """Bytes per element of `dtype` (from the one dtype table, `torch_ir.dtypes`); an unknown name is an error
    because a guessed size corrupts memory plans, and so is a packed sub-byte dtype (use `dtypes.nbytes`)."""
    return get_dtype(dtype).itemsize


@dataclass
class TensorSpec:
    """Name, shape and dtype of one tensor: enough to size and place it without holding its data."""

    name: str
    shape: list[int]
    dtype: str
    # Target-specific storage layout (e.g. "NHWC"); None means the contiguous row-major default.
    layout: str | None = None
    # A quantized tensor's spec (its IR tensor's ``TensorMeta.quant``): the codes' type, granularity, and where its
    # scales and zero points are (weight slots or constants by name, or numbers). Format 2.1; written only when set.
    quant: QuantSpec | None = field(default=None, metadata={"omit_default": True})

    @property
    def storage(self) -> tuple[str, list[int]]:
        """The dtype and shape its bytes are held in: 4-bit codes as uint8, two per byte along the last dim
        (``torch_ir.quant.spec.stored``), a block layout as its blocks' bytes; any other dtype as it is. What a
        backend views the bytes as."""
        return stored(self.dtype, self.shape, self.quant)

    @property
    def numel(self) -> int:
        """Element count; a 0-d tensor has one element."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Storage size in bytes, which is what the memory planner and the constant checks need."""
        dtype, shape = self.storage
        if self.quant is not None and dtype != self.dtype and self.quant.block is not None:
            return math.prod(shape)  # the blocks' bytes
        return nbytes(self.numel, self.dtype)


def block_of(spec: TensorSpec | None) -> str | None:
    """The GGUF block layout a tensor is held in (``q8_0``, ``q4_K``, ...; ``QuantSpec.block``), or None."""
    quant = getattr(spec, "quant", None)
    return quant.block if quant is not None else None


@dataclass
class StateSpec:
    """A persistent buffer (a KV cache, say): lives outside the arena, kept across runs, written by dispatches.

    `npu_runtime.State` creates it initialized as `init` says. Programs that name the same `shared_key`
    (prefill and decode of one model) share one buffer when given the same `State` object; without a
    `shared_key` the slot is keyed by its `name`.
    """

    name: str
    shape: list[int]
    dtype: str
    # Initial value, one of STATE_INITS.
    init: str = "zeros"
    # Key under which programs share this buffer; None: the slot's own name.
    shared_key: str | None = None

    @property
    def key(self) -> str:
        """The key of this slot's buffer in a `State`."""
        return self.shared_key if self.shared_key is not None else self.name

    @property
    def nbytes(self) -> int:
        return self.tensor_spec().nbytes

    def tensor_spec(self) -> TensorSpec:
        """The slot as a plain tensor spec (what kernels and buffers are made from)."""
        return TensorSpec(self.name, list(self.shape), self.dtype)


@dataclass
class Provenance:
    """Where a dispatch came from, copied from its IR node's provenance (``torch_ir.ir.Provenance``): the nodes
    of the extracted IR it computes, the model's module path, the frontend step and the rewrite rules that
    made its node. Tools use it to point at the model: profiles and cost reports by layer, ``torch-ir bisect``
    to name the rule behind a wrong dispatch. Format 1.3."""

    nodes: list[str]
    module: str | None = None
    origin: str | None = None
    rules: list[str] = field(default_factory=list)


@dataclass
class Dispatch:
    """One kernel launch: the unit the runtime executes, in program order."""

    # Kernel name from the target's kernel library, e.g. "GEMM", "CONV" or "aten.add.Tensor" (for a host
    # dispatch, the op type it runs: see `host`).
    kernel: str
    # The IR node this launch came from, so errors and profiles can point back at the model.
    node: str
    inputs: list[str]
    # Activations or state slots.
    outputs: list[str]
    # The kernel's parameters: plain values of the types its record declares (`npu_program.params`; "float16",
    # not the IR's {"dtype": "float16"}; lists, not tuples, so that a save/load round trip is exact). A host
    # dispatch's are its IR node's attributes, in the IR's encoding (it has no kernel record). Format 2.0.
    params: dict[str, Any] = field(default_factory=dict)
    # Why this dispatch runs on the host CPU rather than as a kernel of the target (set by
    # compile(fallback="cpu")); None for a kernel of the target. A host dispatch's `kernel` is the op type
    # of its IR node (e.g. "aten.cumsum.default"), run by the op's reference implementation from the
    # torch_ir op registry. Format 1.2; written only when set, so files without host dispatches are as before.
    host: str | None = field(default=None, metadata={"omit_default": True})
    # Runs once, when the weights are bound, not on every run: it reads only weights, constants and what
    # earlier such dispatches wrote (a weight-norm, a transposed or constant-filled weight), and what it writes
    # keeps its arena bytes for the program's whole life. Format 1.2; written only when set.
    at_bind: bool = field(default=False, metadata={"omit_default": True})
    # Where the dispatch came from (None when its IR node recorded nothing). Format 1.3; written only when set.
    provenance: Provenance | None = field(default=None, metadata={"omit_default": True})

    def __post_init__(self) -> None:
        # An older program's kernel that the table now spells as another kernel with parameters (CONV_ADD: a
        # CONV with has_residual): read here, the one place a dispatch is made, so the checker, the runtime and
        # every tool see only kernels of today's table and an old file runs as it did.
        alias = KERNEL_ALIASES.get(self.kernel) if isinstance(self.kernel, str) else None
        if alias is not None and isinstance(self.params, dict):
            self.kernel, fixed = alias
            self.params = {**self.params, **fixed}


@dataclass
class MemoryPlan:
    """Where each activation tensor lives inside one preallocated arena, so the runtime never allocates."""

    arena_bytes: int
    # Byte offset of each activation tensor inside the arena.
    offsets: dict[str, int]
    # What the activations would need with no reuse at all; reported next to arena_bytes to show the saving.
    no_reuse_bytes: int
    # The target's alignment of every offset (`Target.alignment`: 64 for the CPU, 256 for WebGPU).
    alignment: int = 64
    # View tensor -> tensor whose storage it shares; a view has no storage of its own to plan.
    aliases: dict[str, str] = field(default_factory=dict)


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
    # Every intermediate tensor (and every constant) by name; stored as a list so the compiler's order survives.
    tensors: dict[str, TensorSpec] = field(metadata={"keyed_by": "name"})
    dispatches: list[Dispatch]
    memory: MemoryPlan
    # Raw little-endian data of small constant tensors; their specs are in `tensors`. Stored in the file's
    # blob, not in the JSON header.
    constants: dict[str, bytes] = field(default_factory=dict, metadata={"json": False})
    # The normalized IR as a JSON dict, kept for CPU fallback and debugging; None to ship a smaller file.
    ir: dict[str, Any] | None = None
    # Compiler version, options and similar; no timestamps (the file must be deterministic).
    metadata: dict[str, Any] = field(default_factory=dict)
    # Persistent buffers written by dispatches and kept across runs (format 1.1; none in a 1.0 file).
    state_specs: list[StateSpec] = field(default_factory=list)

    @property
    def dispatch_count(self) -> int:
        return len(self.dispatches)

    @property
    def arena_bytes(self) -> int:
        return self.memory.arena_bytes

    @property
    def weight_bytes(self) -> int:
        return sum(spec.nbytes for spec in self.weight_specs)

    @property
    def state_bytes(self) -> int:
        return sum(spec.nbytes for spec in self.state_specs)

    @property
    def bind_outputs(self) -> list[str]:
        """Tensors written by the dispatches that run at bind time: their arena bytes are never reused."""
        return bind_outputs(self.dispatches)

    @property
    def host_dispatches(self) -> list[tuple[int, Dispatch]]:
        """``(index, dispatch)`` of every dispatch that runs on the host CPU (``Dispatch.host`` set)."""
        return [(i, d) for i, d in enumerate(self.dispatches) if d.host is not None]

    def kernel_histogram(self) -> dict[str, int]:
        """Dispatches per kernel, most used first (ties by name), to see where a program spends its launches."""
        counts = Counter(d.kernel for d in self.dispatches)
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def summary(self) -> str:
        """A few human-readable lines for CLIs and logs."""
        top = _listed([f"{kernel} {n}" for kernel, n in self.kernel_histogram().items()], shown=12)
        memory = self.memory
        saved = 1 - memory.arena_bytes / memory.no_reuse_bytes if memory.no_reuse_bytes else 0.0
        constant_bytes = sum(len(data) for data in self.constants.values())
        lines = [
            f"model: {self.model_name}  target: {self.target}",
            f"dispatches: {self.dispatch_count}" + (f" ({top})" if top else ""),
            f"arena: {memory.arena_bytes} bytes ({_human(memory.arena_bytes)}) vs {memory.no_reuse_bytes} bytes"
            f" without reuse ({saved:.0%} saved)",
            f"weights: {len(self.weight_specs)} tensors, {self.weight_bytes} bytes ({_human(self.weight_bytes)})",
            f"constants: {len(self.constants)} embedded, {constant_bytes} bytes",
        ]
        if self.state_specs:
            lines.append(f"state: {len(self.state_specs)} slots, {self.state_bytes} bytes "
                         f"({_human(self.state_bytes)})")
        at_bind = [d for d in self.dispatches if d.at_bind]
        if at_bind:
            kinds = ", ".join(sorted({d.kernel for d in at_bind}))
            lines.append(f"bind time: {len(at_bind)} dispatches ({kinds}) run once when the weights are bound, "
                         f"not on every run")
        lines += precision_lines(self.metadata.get("precision"))
        lines += self.placement_lines()
        return "\n".join(lines)

    def placement_lines(self) -> list[str]:
        """The placement summary of a program with host dispatches (none without): how many dispatches run
        on the host, the FLOPs on each side (from ``metadata["placement"]`` when the compiler wrote it), and
        one line per host op with its count and reason."""
        host = self.host_dispatches
        if not host:
            return []
        line = f"placement: {len(host)} of {self.dispatch_count} dispatches run on the host CPU (the op's " \
               f"reference), {self.dispatch_count - len(host)} on target {self.target}"
        flops = _placement_flops(self.metadata.get("placement"))
        if flops is not None:
            target_flops, host_flops = flops
            total = target_flops + host_flops
            share = host_flops / total if total else 0.0
            line += f"; host FLOPs {share:.1%} ({_count(host_flops)} of {_count(total)})"
        by_op: dict[str, list[str]] = {}
        for _, d in host:
            by_op.setdefault(d.kernel, []).append(d.host or "")
        lines = [line, "host dispatches and why:"]
        for op, reasons in by_op.items():
            others = len(set(reasons)) - 1
            lines.append(f"  {op} x{len(reasons)}: {reasons[0]}" + (f" (and {others} other reasons)" if others else ""))
        return lines

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the program as a `.npubin` file, atomically (see `npu_program.npubin.write_npubin`)."""
        from .npubin import write_npubin  # local import: npubin imports this module

        write_npubin(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CompiledProgram:
        """Read a `.npubin` file; raises `NpubinError` naming the file and the fix if it is not usable."""
        from .npubin import read_npubin

        return read_npubin(path)


def bind_outputs(dispatches: list[Dispatch]) -> list[str]:
    """The outputs of ``at_bind`` dispatches, in order: the memory planner and its checker keep them live from
    before the first dispatch to after the last (they are computed once and read by every run)."""
    return [name for d in dispatches if d.at_bind for name in d.outputs]


def _placement_flops(placement: Any) -> tuple[int, int] | None:
    """(target, host) FLOPs of ``metadata["placement"]``; None when absent or not as the compiler writes it
    (metadata is free-form, and a summary must not fail on a file's odd metadata)."""
    try:
        values = placement["target"]["flops"], placement["host"]["flops"]
    except (KeyError, TypeError, IndexError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        return None
    return values


def precision_lines(record: Any) -> list[str]:
    """The summary's lines for ``metadata["precision"]`` (``npu_compiler``'s ``CompileOptions.precision`` and, when it
    was measured, ``npu_compiler.precision.precision_error``); none without one. Read defensively: a program file is
    untrusted, so a malformed record prints what it can and never raises."""
    if not isinstance(record, Mapping):
        return []
    lines = [f"precision: {record.get('precision')} (weights and activations in {record.get('dtype')}; the "
             "program's inputs and outputs keep their dtypes)"]
    error = record.get("error")
    if isinstance(error, Mapping) and isinstance(error.get("outputs"), list):
        lines.append(f"error against fp32 ({error.get('inputs')}):")
        lines += [f"  {_error_line(o)}" for o in error["outputs"] if isinstance(o, Mapping)]
    return lines


def _error_line(o: Mapping[str, Any]) -> str:
    def num(key: str) -> float:
        value = o.get(key)
        return float(value) if isinstance(value, (int, float)) else float("nan")

    text = f"{o.get('name')}: max abs {num('max_abs'):.3g} ({num('rel'):.2%} of max |fp32|), cosine {num('cosine'):.6f}"
    if o.get("top1") is not None:
        text += f", top-1 {num('top1'):.0%}, top-5 {num('top5'):.0%} equal"
    return text


def _count(n: int) -> str:
    """A count as 950, 1.2 K, 3.4 M, 5.6 G: FLOPs of small and large models both readable."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(n)


def _human(nbytes: int) -> str:
    """Bytes as KiB/MiB/GiB for reading; the exact count is printed beside it."""
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}" if unit != "B" else f"{nbytes} B"
        size /= 1024
    return f"{size:.1f} GiB"


def _listed(items: list[str], shown: int) -> str:
    """``items`` joined, the first ``shown`` of them and "…, N more" for the rest: every kind is counted."""
    if len(items) <= shown:
        return ", ".join(items)
    return ", ".join(items[:shown]) + f", … {len(items) - shown} more"


__all__ = ["STATE_INITS", "CompiledProgram", "Dispatch", "MemoryPlan", "StateSpec", "TensorSpec", "dtype_size"]
