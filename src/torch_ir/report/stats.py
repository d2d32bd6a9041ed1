"""Counts and sizes of an IR: what an NPU builder sizes memories and op coverage from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..ir import NPU_IR, TensorMeta
from ..ops.values import dtype_from_name


@dataclass
class IRStats:
    """Statistics of one IR; ``str()`` renders them as text.

    Byte counts are per dtype and cover tensors of static shape only; ``symbolic_tensors`` says how
    many tensors were left out because a dimension is a symbol. Activation bytes are the sum over
    all node outputs, not the peak of live ones.
    """

    model_name: str
    node_count: int
    op_histogram: dict[str, int]
    parameter_count: int  # elements of the trainable weights (role "weight")
    buffer_count: int  # elements of buffers and KV caches
    weight_bytes: dict[str, int]  # parameters, buffers and constants
    activation_bytes: dict[str, int]  # node outputs
    num_inputs: int
    num_outputs: int
    num_weights: int
    num_constants: int
    num_symbols: int
    num_mutations: int
    symbolic_tensors: int = 0

    @property
    def total_weight_bytes(self) -> int:
        return sum(self.weight_bytes.values())

    @property
    def total_activation_bytes(self) -> int:
        return sum(self.activation_bytes.values())

    def summary_rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs, shared by the text and the Markdown renderings."""
        return [
            ("nodes", f"{self.node_count} ({len(self.op_histogram)} op types)"),
            ("parameters", f"{self.parameter_count:,}"),
            ("buffer elements", f"{self.buffer_count:,}"),
            ("weight bytes", _bytes_text(self.weight_bytes)),
            ("activation bytes (sum)", _bytes_text(self.activation_bytes)),
            ("inputs / outputs", f"{self.num_inputs} / {self.num_outputs}"),
            ("weights / constants", f"{self.num_weights} / {self.num_constants}"),
            ("symbols / mutations", f"{self.num_symbols} / {self.num_mutations}"),
            ("tensors of symbolic shape (not in bytes)", str(self.symbolic_tensors)),
        ]

    def to_text(self) -> str:
        rows = self.summary_rows()
        width = max(len(label) for label, _ in rows)
        lines = [f"IR {self.model_name!r}"] + [f"  {label.ljust(width)}  {value}" for label, value in rows]
        lines.append("  ops:")
        lines += [f"    {count:6d}  {op}" for op, count in self.op_histogram.items()]
        return "\n".join(lines)

    __str__ = to_text


def ir_statistics(ir: NPU_IR) -> IRStats:
    """Op histogram, element and byte counts, and the sizes of the IR's tables.

    Example::

        stats = ir_statistics(ir)
        assert stats.parameter_count == sum(p.numel() for p in model.parameters())
        print(stats)  # the summary, then the op histogram
    """
    activations = [t for n in ir.nodes for t in n.outputs]
    stored = [*ir.weights, *ir.constants]
    weight_bytes, symbolic_w = _bytes_by_dtype(stored)
    activation_bytes, symbolic_a = _bytes_by_dtype(activations)
    return IRStats(
        model_name=ir.model_name,
        node_count=len(ir.nodes),
        op_histogram=ir.op_histogram(),
        parameter_count=_numel(t for t in ir.weights if t.role == "weight"),
        buffer_count=_numel(t for t in ir.weights if t.role != "weight"),
        weight_bytes=weight_bytes,
        activation_bytes=activation_bytes,
        num_inputs=len(ir.graph_inputs),
        num_outputs=len(ir.graph_outputs),
        num_weights=len(ir.weights),
        num_constants=len(ir.constants),
        num_symbols=len(ir.symbols),
        num_mutations=len(ir.mutations),
        symbolic_tensors=symbolic_w + symbolic_a,
    )


def _numel(tensors: Iterable[TensorMeta]) -> int:
    return sum(t.numel() or 0 for t in tensors)


def _bytes_by_dtype(tensors: Iterable[TensorMeta]) -> tuple[dict[str, int], int]:
    """Bytes per dtype (largest first) and how many tensors had a symbolic shape."""
    out: dict[str, int] = {}
    symbolic = 0
    for t in tensors:
        n = t.numel()
        if n is None:
            symbolic += 1
            continue
        out[t.dtype] = out.get(t.dtype, 0) + n * dtype_from_name(t.dtype).itemsize
    return dict(sorted(out.items(), key=lambda kv: -kv[1])), symbolic


def _bytes_text(by_dtype: dict[str, int]) -> str:
    if not by_dtype:
        return "0"
    parts = ", ".join(f"{dtype} {human_bytes(n)}" for dtype, n in by_dtype.items())
    return f"{human_bytes(sum(by_dtype.values()))} ({parts})"


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    size, i = float(n), 0
    while size >= 1024 and i < len(units) - 1:
        size, i = size / 1024, i + 1
    return f"{n} B" if i == 0 else f"{size:.1f} {units[i]}"
