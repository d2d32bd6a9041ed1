"""Block-quantized weights (GGUF layouts, ``QuantSpec.block``) on the CPU backend.

A weight slot marked with a block layout (``npu_compiler.llm.with_block_weights``) holds its GGUF blocks,
``uint8 [N, K / elements · bytes]``, and means the float values they dequantize to. Three kinds of kernel read it:

* the linear layers (GEMM, QKV_PROJ, GATE_UP: :class:`BlockLinear`) multiply with the blocks through
  :class:`cpu_qgemv.QGemv <npu_runtime.backends.cpu_qgemv.QGemv>`: a decode step's GEMV reads them as they lie; a
  prefill chunk runs either that GEMV (up to 8 rows of x per pass over the weights) or tiles of rows dequantized
  into a small buffer and multiplied by BLAS, whichever runs faster for the shape; either way an fp32 product of
  the exactly dequantized weights (or, with the ops' ``x_int8_group``, llama.cpp's int8 activations: integer dot
  products for decode rows; for a prefill's, those (up to 8 rows of x per pass; Q8_0 and Q6_K on AVX2 without
  VNNI: 16 rows of W decoded once per call, 4 rows of x per pass, ``QGemv.groups``) or the float path on the
  int8-rounded x, whichever ran faster for the shape: :meth:`_Part.native_int8`);
* EMBEDDING (:class:`BlockEmbedding`) dequantizes only the rows it gathers;
* any other kernel is given the slot dequantized once, at bind time (:class:`Dequantized`): slower and bigger,
  never wrong.

Dequantization is ``torch_ir.quant.blocks``', bit-exact with ggml's.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence

import torch

from npu_program.program import Dispatch, TensorSpec, block_of
from torch_ir.ops.npu import embedding_id_problem
from torch_ir.quant import blocks
from torch_ir.quant.numerics import int8_groups

from . import cpu_gemv, cpu_qgemv
from .base import Kernel

Tensor = torch.Tensor


_STACKED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

#: a prefill's rows with int8 activations: None, the integer kernel or the float path on the rounded x, whichever
#: ran faster lately for the shape (:data:`_INT8_PATHS`); ``"native"`` or ``"rounded"`` forces one (tests, benches).
#: The two are one contract: the same products, summed in another order
INT8_PREFILL: str | None = None
#: the measured choice: ``_PathPolicy``'s "tiled" side is the float path on the rounded x here
_INT8_PATHS = cpu_gemv._PathPolicy()
#: a prefill's integer kernel reads Q8_0/Q6_K weights kept without a copy 16 rows at a time (``QGemv.groups``);
#: False keeps the GGUF layout's kernel (a comparison: ``bench/llm/prefill_ab.py``)
INT8_GROUPS = True


def stacked(tensors: Sequence[Tensor]) -> Tensor:
    """``torch.cat(tensors)`` along rows, made once per set of weights: the prefill and the decode program bind the
    same weights, and each of their QKV_PROJ / GATE_UP kernels would otherwise hold its own copy of the
    concatenation (a second and third copy of most of an LLM's bytes)."""
    if len(tensors) == 1:
        return tensors[0]
    key = tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in tensors)
    found = _STACKED.get(key)
    if found is None:
        found = _STACKED[key] = torch.cat(list(tensors), dim=0)
        found._sources = tuple(tensors)  # their addresses cannot be reused by other weights while this lives
    return found


def dequantize(data: Tensor, block: str, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Tensor:
    """The float values of ``data`` (the blocks of a ``shape`` tensor in layout ``block``), in ``dtype``."""
    return blocks.dequantize(data, block.upper(), tuple(int(d) for d in shape)).to(dtype)


class _Part:
    """Rows ``[n]`` of a linear layer's weight: the quantized GEMV over its blocks, or an fp32 matrix (a float part
    of a layer whose other parts are blocks)."""

    def __init__(self, weight: Tensor, block: str | None, bias: Tensor | None, int8: bool = False) -> None:
        self.gemv, self.matrix, self.groups = None, None, False
        #: this part's native kernel can quantize x itself (llama.cpp's int8 dot product); else it is given x rounded
        self.int8 = int8 and block in cpu_qgemv.INT8_QTYPES
        self.bias = bias.float().contiguous() if bias is not None else None
        if block is not None:
            self.gemv = cpu_qgemv.QGemv(weight, block, self.bias)
            if self.int8:
                self.gemv.interleave()  # where this CPU's int8 kernel reads a 16-row interleaved copy faster
            #: a prefill's integer kernel reads the GGUF layout 16 rows at a time (no copy; ~1.5x the GEMV's speed)
            self.groups = self.int8 and self.gemv.groups()
            self.n = self.gemv.n
        else:
            self.matrix = weight.float().contiguous()
            self.n = self.matrix.shape[0]

    def _prefill_key(self, rows: int) -> tuple | None:
        """The shape class of a call whose path is measured (int8, a prefill's rows, unforced), else None."""
        if not self.int8 or not self.gemv.tiled(rows) or INT8_PREFILL is not None:
            return None
        return self.gemv.qtype.code, self.gemv.n, self.gemv.k, rows.bit_length(), torch.get_num_threads()

    def native_int8(self, rows: int) -> bool:
        """Whether a call with ``rows`` rows of x runs the integer kernel: decode rows always; a prefill's rows
        (``QGemv.tiled``) as :data:`INT8_PREFILL` says, or whichever of it (up to 8 rows of x per pass over the
        weights, or with :attr:`groups` 16 rows of W decoded once per call) and the float path on the int8-rounded
        x (tiles or 8-row GEMV passes) ran faster for the shape:
        the same products either way (the contract's reference), and which wins depends on the layout, the shape
        and the neighbours' load (``bench/gemv/qprefill.py --int8``). Called once per call (it may probe)."""
        if INT8_PREFILL not in (None, "native", "rounded"):
            raise ValueError(f"cpu_blocks.INT8_PREFILL = {INT8_PREFILL!r} is not None, 'native' or 'rounded'")
        if not self.int8:
            return False
        key = self._prefill_key(rows)
        if key is not None:
            return not _INT8_PATHS.pick(key)
        return not self.gemv.tiled(rows) or INT8_PREFILL == "native"

    def __call__(self, x: Tensor, x_int8: Tensor | None, out: Tensor, native: bool) -> None:
        """``native``: this call's :meth:`native_int8`, asked once by :class:`BlockLinear` (it chose x_int8)."""
        key, start = self._prefill_key(x.shape[0]), time.perf_counter_ns()
        if x_int8 is not None and not native:
            x = x_int8  # the int8-rounded x, times the exact weights: the same products as the integer sums
        if self.gemv is not None:
            path = "groups" if native and self.groups and INT8_GROUPS and self.gemv.tiled(x.shape[0]) else None
            self.gemv(x, out=out, activations="int8" if native else "float32", path=path)
            if key is not None:
                _INT8_PATHS.record(key, not native, (time.perf_counter_ns() - start) / x.shape[0])
        elif self.bias is None:
            torch.mm(x, self.matrix.t(), out=out)
        else:
            torch.addmm(self.bias, x, self.matrix.t(), out=out)


class BlockLinear:
    """``x · Wᵀ (+ bias) (+ residual)`` into ``out`` for a weight given as parts stacked along N (QKV_PROJ's q, k and
    v, GATE_UP's gate and up, or one part), each ``(tensor [n_i, ...], block layout or None for a float weight)``.

    Parts of one layout next to each other are concatenated once (one GEMV call reads them); x is computed in
    fp32 (converted at the edges for bf16/fp16 programs, as ggml does). ``int8``: the ops' ``x_int8_group`` of 32,
    x rounded to int8 groups first (``torch_ir.quant.numerics.int8_groups``), which every block layout's kernel (Q8_0,
    Q4_0, Q5_0, Q4_K, Q6_K) does itself with integer dot products (``cpu_qgemv``'s ``activations="int8"``) for
    decode rows, and for a prefill's where they ran faster; a float part, and the other prefill calls, are given the
    rounded x (:meth:`_Part.native_int8`)."""

    def __init__(self, parts: Sequence[tuple[Tensor, str | None]], bias: Tensor | None, int8: bool = False) -> None:
        merged: list[tuple[list[Tensor], str | None]] = []
        for weight, block in parts:
            if merged and merged[-1][1] == block and block is not None:
                merged[-1][0].append(weight)
            else:
                merged.append(([weight], block))
        self.parts: list[_Part] = []
        row = 0
        for weights, block in merged:
            w = stacked(weights)
            b = bias[row:row + w.shape[0]] if bias is not None else None
            self.parts.append(_Part(w.contiguous(), block, b, int8))
            row += w.shape[0]
        self.n = row
        self.int8 = int8

    def __call__(self, x2: Tensor, out2: Tensor, residual: Tensor | None = None) -> None:
        x = x2 if x2.dtype == torch.float32 and x2.is_contiguous() else x2.float().contiguous()
        direct = len(self.parts) == 1 and out2.dtype == torch.float32 and out2.is_contiguous()
        y = out2 if direct else torch.empty(x.shape[0], self.n, dtype=torch.float32)
        native = [p.native_int8(x.shape[0]) for p in self.parts]
        x_int8 = int8_groups(x, 32) if self.int8 and not all(native) else None
        if len(self.parts) == 1:
            self.parts[0](x, x_int8, y, native[0])
        else:
            col = 0
            for part, nat in zip(self.parts, native):
                part(x, x_int8, tmp := torch.empty(x.shape[0], part.n, dtype=torch.float32), nat)
                y[:, col:col + part.n] = tmp
                col += part.n
        if residual is not None:
            y.add_(residual)  # in fp32, rounded once below (a bf16 program's residual stream is bf16)
        if y is not out2:
            out2.copy_(y)


class BlockEmbedding:
    """``EMBEDDING`` of a block-quantized table: the rows the ids pick, dequantized (nothing else of the table)."""

    reads_blocks = True

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        table = specs.get(dispatch.inputs[0])
        return block_of(table) is not None and dispatch.inputs[0] in weight_names and len(table.shape) == 2

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        table = specs[dispatch.inputs[0]]
        self.block, self.rows, self.cols = block_of(table), int(table.shape[0]), int(table.shape[1])
        self.negative_wraps = bool(dispatch.params.get("negative_wraps", False))

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        table, ids = inputs[0], inputs[1].reshape(-1).long()
        if ids.numel():
            problem = embedding_id_problem(int(ids.min()), int(ids.max()), self.rows, self.negative_wraps)
            if problem is not None:
                raise IndexError(f"EMBEDDING: {problem}")
        ids = torch.where(ids < 0, ids + self.rows, ids)
        out = outputs[0].view(-1, self.cols)
        if out.dtype == torch.float32 and out.is_contiguous():  # a decode step: one row, one native call
            for i, row in enumerate(ids.tolist()):
                cpu_qgemv.dequantize_rows(table, self.block, row, row + 1, out=out[i:i + 1], threads=1)
            return
        out.copy_(dequantize(table.index_select(0, ids), self.block, (ids.numel(), self.cols), out.dtype))


class Dequantized:
    """Another kernel, given the block-quantized inputs of its dispatch dequantized once, when the weights are bound
    (the kernel sees float specs). For dispatches no block-reading kernel takes."""

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec], make: type) -> None:
        self.blocked = {i: name for i, name in enumerate(dispatch.inputs) if block_of(specs.get(name))}
        self.specs = {name: specs[name] for name in self.blocked.values()}
        float_specs = {**specs, **{n: TensorSpec(s.name, s.shape, s.dtype, s.layout) for n, s in self.specs.items()}}
        self.inner: Kernel = make(dispatch, float_specs)
        self.values: dict[str, Tensor] = {}

    def prepare(self, weights: dict[str, Tensor]) -> None:
        from torch_ir.ops.values import dtype_from_name

        for name, spec in self.specs.items():
            if name in weights:
                self.values[name] = dequantize(weights[name], spec.quant.block, spec.shape, dtype_from_name(spec.dtype))
        self.inner.prepare({**weights, **self.values})

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        inputs = list(inputs)
        for i, name in self.blocked.items():
            inputs[i] = self.values[name]  # every block-quantized tensor is a weight, bound before any run
        self.inner.run(inputs, outputs)


__all__ = ["BlockEmbedding", "BlockLinear", "Dequantized", "dequantize", "stacked"]
