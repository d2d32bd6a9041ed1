"""CPU kernels of a quantized KV cache (``torch_ir.ops.npu_kvcache``): ``KVQ_UPDATE`` and ``KVQ_ATTENTION``. The same
``prepare``/``run`` pairs as :mod:`.cpu_kernels`, whose ``make_kernel`` picks them by the kernel table's
``impls["cpu"]``.

A step never dequantizes the cache. The update quantizes only the new rows (the reference numerics,
``torch_ir.ops.npu_kvcache.quantize_kv``, on ``T·H`` vectors, so the codes and scales are the reference's bit for
bit). Attention reads only the *live* positions, the leading ones some query may see (a position hidden from every
query by the mask, or past every query under ``causal``, has probability exactly 0, so dropping it changes
nothing), and folds the scales into the small score matrix: ``q·kᵀ`` over the codes, times the key scale of each
position; the probabilities times the value scale of each position, then ``·v`` over the codes. The codes are
widened to float32 for the two products, ``live × D`` of them per head: the cache is read once, in one byte per
element.
"""

from __future__ import annotations

import torch

from npu_program.program import Dispatch, TensorSpec
from torch_ir.ops.npu_kvcache import KV_CODE_DTYPES, as_bytes, quantize_kv

from .cpu_kernels import LINEAR_DTYPES
from .cpu_transformer import live_positions, masked_softmax, read_attention

Tensor = torch.Tensor


class KvqUpdate:
    """``KVQ_UPDATE``: the new rows quantized and written with their scales at their positions, in place (in a
    program both outputs are state slots); an output that is another tensor first gets a copy of the cache."""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        codes, scales, new = (specs.get(n) for n in dispatch.inputs[:3])
        if codes is None or scales is None or new is None or len(dispatch.outputs) != 2:
            return False
        dim = int(dispatch.params.get("dim", 2)) % max(1, len(codes.shape))
        return codes.dtype in KV_CODE_DTYPES and scales.dtype == "float32" and new.dtype in LINEAR_DTYPES and \
            list(scales.shape) == list(codes.shape[:-1]) and dim < len(codes.shape) - 1

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.dim = int(dispatch.params.get("dim", 2)) % len(specs[dispatch.inputs[0]].shape)
        self.code_dtype = specs[dispatch.inputs[0]].dtype
        self.in_place = list(dispatch.inputs[:2]) == list(dispatch.outputs)

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        codes, scales, new, index = inputs
        if not self.in_place:
            outputs[0].copy_(codes)
            outputs[1].copy_(scales)
        q, s = quantize_kv(new, self.code_dtype)
        as_bytes(outputs[0]).index_copy_(self.dim, index, as_bytes(q))  # checks every index against the length
        outputs[1].index_copy_(self.dim, index, s)


class KvqAttention:
    """``KVQ_ATTENTION``: ``softmax(q·kᵀ·scale + mask)·v`` over int8 (or fp8) codes and their scales, the live
    positions only (module docstring), grouped-query heads read where they lie (as ``cpu_transformer.Attention``:
    q ``[B, H, T, D]`` viewed as ``[B, Hkv, g·T, D]``), scores and softmax in float32."""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        if len(dispatch.inputs) not in (5, 6) or any(n not in specs for n in dispatch.inputs):
            return False
        q, k, ks, v, vs = (specs[n] for n in dispatch.inputs[:5])
        shapes_ok = len(q.shape) == len(k.shape) == len(v.shape) == 4 and k.shape == v.shape and \
            list(ks.shape) == list(vs.shape) == list(k.shape[:3]) and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
        mask_ok = len(dispatch.inputs) == 5 or specs[dispatch.inputs[5]].dtype in ("bool", q.dtype)
        return shapes_ok and mask_ok and q.dtype in LINEAR_DTYPES and k.dtype in KV_CODE_DTYPES and \
            v.dtype == k.dtype and ks.dtype == vs.dtype == "float32" and specs[dispatch.outputs[0]].dtype == q.dtype

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        read_attention(self, dispatch, specs)

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        (b, h, t, hkv, _), g = self.dims, self.dims[1] // self.dims[3]
        q, k, ks, v, vs = inputs[:5]
        mask = inputs[5] if len(inputs) > 5 else None
        n = live_positions(self, mask)
        k, v = k[:, :, :n].float(), v[:, :, :n].float()  # the live codes widened, never scaled
        scores = torch.matmul(q.float().reshape(b, hkv, g * t, q.shape[-1]), k.transpose(-1, -2))
        scores.mul_(ks[:, :, None, :n] * self.scale)
        scores = scores.view(b, h, t, n)
        future = self.future[:, :n] if self.future is not None else None
        if mask is not None and mask.shape[-1] > 1:
            mask = mask[..., :n]  # the live positions' columns
        p = masked_softmax(scores, future, mask)
        p = p.view(b, hkv, g * t, n).mul_(vs[:, :, None, :n])
        y = torch.matmul(p, v).view(b, h, t, v.shape[-1])
        out = outputs[0]
        out.copy_(y.transpose(1, 2).reshape(out.shape) if self.merge_heads else y)
