"""CPU kernels of the transformer NPU ops: ``RMS_NORM``, ``ROPE``/``ROPE_QK``, ``ATTENTION`` over a KV cache, and
``KV_UPDATE``, the cache written in place. The same ``prepare``/``run`` pairs as :mod:`.cpu_kernels`, whose
``make_kernel`` picks them by the kernel table's ``impls["cpu"]``.

For one token (a decode step) ``RMS_NORM``, ``ROPE_QK`` and ``ATTENTION`` run as one C call each
(:mod:`.cpu_decode_ops`) where it can be had; several tokens (prefill), other dtypes, and every case when the
C kernels are off or cannot be built run the PyTorch code below.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812

from npu_program.program import Dispatch, TensorSpec

from . import cpu_decode_ops
from .cpu_kernels import LINEAR_DTYPES, linear_dtypes_ok

Tensor = torch.Tensor
#: the dtypes of the native decode kernels (their ``DTYPE_CODES``), by the program's dtype names
NATIVE_DTYPES = tuple(str(dtype).removeprefix("torch.") for dtype in cpu_decode_ops.DTYPE_CODES)


def _one_token(shape: list[int], token_dim: int) -> bool:
    """Whether a tensor of ``shape`` holds one token (the decode shape the native kernels are for)."""
    return len(shape) >= -token_dim and int(shape[token_dim]) == 1


class KvUpdate:
    """``KV_UPDATE``: the new keys/values written into the cache at their positions, in place.

    In a program the output is the cache's state slot itself (``npu_compiler.state``), so the step touches
    only the written rows, never copies the cache; an output that is another tensor (a one-node program,
    the kernel test table) first gets a copy of the cache.
    """

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        return True

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.dim = int(dispatch.params.get("dim", 2))
        self.in_place = dispatch.inputs[0] == dispatch.outputs[0]

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        cache, new, index = inputs
        if not self.in_place:
            outputs[0].copy_(cache)
        outputs[0].index_copy_(self.dim, index, new)  # checks every index against the cache's length


class RmsNorm:
    """``RMS_NORM``: ``x · rsqrt(mean(x², -1) + eps) (· weight)`` in float32, rounded to x's dtype before the
    weight as the reference (and Llama/Qwen) do, written with ``out=`` ops: a few small ops, no temporaries
    for float32."""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        return linear_dtypes_ok(dispatch, specs)  # x, weight and y of one float dtype

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.eps = float(dispatch.params.get("eps", 1e-6))
        x = specs[dispatch.inputs[0]]
        weight = [specs[n].shape for n in dispatch.inputs[1:2] if n in specs]
        self.native = x.dtype in NATIVE_DTYPES and len(x.shape) > 0 and math.prod(x.shape[:-1]) == 1 and \
            weight in ([], [[x.shape[-1]]])  # one row (a decode step), a weight of the row's length if any
        self.held = cpu_decode_ops.Held()  # the weight, checked once

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        x, out = inputs[0], outputs[0]
        if self.native and cpu_decode_ops.rms_norm(x, inputs[1] if len(inputs) > 1 else None, out, self.eps,
                                                   self.held):
            return
        xf = x.float()  # x itself for float32, else a float32 copy that may be scaled in place
        scale = xf.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        if xf is x:
            torch.mul(x, scale, out=out)
        else:
            out.copy_(xf.mul_(scale))
        if len(inputs) > 1:
            out.mul_(inputs[1])


class Rope:
    """``ROPE`` and ``ROPE_QK``: ``x·cos + rotate_half(x)·sin`` of each of the first inputs (q, and k), written
    half by half into the outputs (``rotate_half`` is never materialized)."""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        names = [*dispatch.inputs, *dispatch.outputs]
        return len({specs[n].dtype for n in names if n in specs}) == 1 and \
            all(specs[n].shape[-1] % 2 == 0 for n in dispatch.outputs)

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        shapes = [specs[n].shape for n in [*dispatch.inputs, *dispatch.outputs]]
        # ROPE_QK of one token: q, k and one row of cos and sin (ROPE, of one tensor, keeps the torch code)
        self.native = len(shapes) == 6 and specs[dispatch.inputs[0]].dtype in NATIVE_DTYPES and \
            all(len(x) >= 2 for x in shapes[:2]) and _one_token(shapes[0], -2) and shapes[0][-1] == shapes[1][-1] \
            and math.prod(shapes[2]) == math.prod(shapes[3]) == shapes[0][-1] and shapes[4:] == shapes[:2]

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        cos, sin = inputs[-2], inputs[-1]
        if self.native and cpu_decode_ops.rope_qk(inputs[0], inputs[1], cos, sin, outputs[0], outputs[1]):
            return
        half = cos.shape[-1] // 2
        for x, out in zip(inputs[:-2], outputs):
            torch.mul(x, cos, out=out)
            out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-1)
            out[..., half:].addcmul_(x[..., :half], sin[..., half:])


def read_attention(kernel: object, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
    """An attention kernel's parameters and shapes (q ``[B, H, T, D]`` first, the keys ``[B, Hkv, S, ...]``
    second): ``scale``, ``causal``, ``merge_heads``, ``dims`` = (B, H, T, Hkv, S) and the causal mask ``future``."""
    params = dispatch.params
    kernel.scale = float(params["scale"])
    kernel.causal = bool(params.get("causal", False))
    kernel.merge_heads = bool(params.get("merge_heads", True))
    b, h, t, _ = specs[dispatch.inputs[0]].shape
    hkv, s = specs[dispatch.inputs[1]].shape[1:3]
    kernel.dims = (int(b), int(h), int(t), int(hkv), int(s))
    kernel.future = torch.ones(int(t), int(s), dtype=torch.bool).tril().logical_not() if kernel.causal else None


def live_positions(kernel: object, mask: Tensor | None) -> int:
    """The leading cache positions some query of an attention kernel (:func:`read_attention`'s) may see, at least
    one (so a fully masked row still gives zeros): past them every score is hidden and adds 0·v, so the products
    skip them. A prefill into a long cache reads its live prefix, not the cache's length (128 tokens into a cache of
    1024: 11.5 ms a layer over the whole cache, 0.9 ms over 160, fp32, 2-vCPU Zen 3)."""
    (_, _, t, _, s) = kernel.dims
    live = min(s, t) if kernel.causal else s
    if mask is not None:
        rows = mask.reshape(-1, mask.shape[-1])
        seen = rows.any(0) if mask.dtype == torch.bool else (rows != float("-inf")).any(0)
        seen = seen.expand(s) if seen.numel() == 1 else seen
        last = torch.nonzero(seen)
        live = min(live, int(last[-1]) + 1 if last.numel() else 1)
    return max(live, 1)


def masked_softmax(scores: Tensor, future: Tensor | None, mask: Tensor | None) -> Tensor:
    """softmax over the last dim of fp32 ``scores`` after the causal mask ``future`` (True: hidden) and ``mask``
    (bool: False hides; else added); a fully hidden row gives zeros, as the reference. ``scores`` is changed."""
    if future is not None:
        scores.masked_fill_(future, float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask.float())
    p = torch.softmax(scores, dim=-1)
    return p.masked_fill_(torch.isnan(p), 0.0)


class Attention:
    """``ATTENTION``: ``softmax(q·kᵀ·scale + mask)·v`` over a KV cache without copying it.

    Under grouped-query attention each key/value head serves ``g`` query heads: q ``[B, H, T, D]`` is read as
    ``[B, Hkv, g·T, D]``, so one batched matmul per product reads k and v ``[B, Hkv, S, D]`` where they lie (the
    reference repeats them ``g`` times first: a copy of the cache per token). A fully masked row gives zeros, as
    the reference; the merged output is written into the arena's ``[B, T, H·D]`` in one copy. Several query tokens
    (a prefill) read the cache's live prefix only (:func:`live_positions`): the positions past it, hidden from every
    query, are skipped, as the one-token C kernel skips every hidden position.
    """

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        names = [*dispatch.inputs[:3], *dispatch.outputs]
        if len({specs[n].dtype for n in names if n in specs}) != 1 or specs[names[0]].dtype not in LINEAR_DTYPES \
                or len(dispatch.inputs) > 4:
            return False
        q, k, v = (specs[n].shape for n in dispatch.inputs[:3])
        return len(q) == len(k) == len(v) == 4 and k[1] == v[1] and k[1] > 0 and q[1] % k[1] == 0 and \
            (len(dispatch.inputs) == 3 or specs[dispatch.inputs[3]].dtype in ("bool", specs[names[0]].dtype))

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        read_attention(self, dispatch, specs)
        b, h, t, hkv, s = self.dims
        mask = specs[dispatch.inputs[3]].shape if len(dispatch.inputs) > 3 else [s]
        # one query token, no causal mask (a decode step: its mask is an input), a mask of the cache's positions
        # broadcast over heads or per head; the working memory of the C kernel allocated once
        d = specs[dispatch.inputs[0]].shape[-1]
        self.native = t == 1 and not self.causal and specs[dispatch.inputs[0]].dtype in NATIVE_DTYPES and \
            1 <= len(mask) <= 4 and int(mask[-1]) == s and h // hkv <= cpu_decode_ops.MAX_GROUP and \
            all(m in (1, n) for m, n in zip(reversed(mask[:-1]), (1, h, b))) and \
            all(specs[n].shape == [b, hkv, s, d] for n in dispatch.inputs[1:3])
        self.scratch = cpu_decode_ops.attention_scratch(int(h), int(hkv), int(s), int(d)) if self.native else None
        self.held = (cpu_decode_ops.Held(), cpu_decode_ops.Held(), cpu_decode_ops.Held())  # k, v (state), scratch
        # an encoder's attention (BERT, ViT): one head per key/value head, no causal mask
        self.fused = not self.native and not self.causal and h == hkv

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        if self.native and cpu_decode_ops.attention(inputs[0], inputs[1], inputs[2], inputs[3] if len(inputs) > 3
                                                    else None, outputs[0], self.scale, self.scratch, self.held):
            return
        (b, h, t, hkv, _), g = self.dims, self.dims[1] // self.dims[3]
        out = outputs[0]
        if self.fused and (len(inputs) < 4 or inputs[3].dtype != torch.bool):
            # no causal mask, an additive mask or none: PyTorch's fused kernel keeps the scores and softmax in float32
            # blocks (a row all -inf gives zeros, as the reference), ~2x the unfused path in 16 bits, ~1.3x in fp32
            # (BERT-base's 12 x 128 x 64 heads: 0.51 against 0.68 ms), within fp32's rounding of it
            y = F.scaled_dot_product_attention(*inputs[:3], attn_mask=inputs[3] if len(inputs) > 3 else None,
                                               scale=self.scale)
            out.copy_(y.transpose(1, 2).reshape(out.shape) if self.merge_heads else y)
            return
        mask = inputs[3] if len(inputs) > 3 else None
        n = live_positions(self, mask)
        # scores and softmax in float32 (no copy for float32), over the live positions only
        q, k, v = inputs[0].float(), inputs[1][:, :, :n].float(), inputs[2][:, :, :n].float()
        scores = torch.matmul(q.reshape(b, hkv, g * t, q.shape[-1]), k.transpose(-1, -2)).view(b, h, t, n)
        scores.mul_(self.scale)
        future = self.future[:, :n] if self.future is not None else None
        p = masked_softmax(scores, future, mask[..., :n] if mask is not None and mask.shape[-1] > 1 else mask)
        y = torch.matmul(p.view(b, hkv, g * t, n), v).view(b, h, t, v.shape[-1])
        out.copy_(y.transpose(1, 2).reshape(out.shape) if self.merge_heads else y)
