"""A decode step's dispatches made by one C call: the CPU backend's chains of native calls.

A one-token decode step of an LLM is ~10 dispatches a layer, each a C call of microseconds (the GEMVs, whose time
is their weights' bytes, and RMS_NORM, ROPE_QK, ATTENTION, the cache update). Made one by one from Python, each
also pays ~10-20 µs of interpreter: the kernel's own code, the argument checks and packing, ctypes, the GEMV's thread
policy, the small torch ops between (an epilogue, a split); for a 0.5B model that is a quarter of the step. So once
per bound executor and thread count, every dispatch whose kernel can be made as native calls is planned into them
(checked and packed once: every pointer is into the arena, the state or memory the calls hold, which stay put while
the executor is bound), and each run of such dispatches in a row becomes one C call (``dops_chain`` in
``decode_ops.c``) that makes them in order. The other dispatches (the host ops that compute RoPE's cos and sin, the
embedding, anything of several tokens or another dtype) run as before, between the chains: llama.cpp's one graph
compute, for the part of a step that is ours in C.

A chain gives the unchained kernels' bits: the same C functions with the same arguments, the glue (QKV_PROJ's split,
GATE_UP's ``silu(gate)·up``, a residual's add) C that rounds as PyTorch's ops round (GATE_UP's one-row epilogue runs
that C unchained too). Only the GEMVs' thread count differs: a chain gives a GEMV all of torch's threads from
``cpu_gemv.SINGLE_THREAD_BYTES`` of weights (one below), where an unchained call lets its thread policy choose; a
row's result does not depend on the threads. A call that fails (a KV position outside the cache, a GEMV without
memory for x's int8 groups) has written nothing: the rest of its chain then runs unchained from its dispatch, whose
own code raises its own error, or runs.

``TORCH_IR_NATIVE_CHAIN=0`` or :func:`set_enabled` turns chains off (a comparison); ``Executor.profile`` and
``validate`` run dispatch by dispatch.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import cpu_decode_ops, cpu_gemv, cpu_qgemv
from .cpu_blocks import BlockLinear
from .cpu_gemv_build import NativeCall, NativeKernel
from .cpu_kernels import GateUp, Gemm, QkvProj, _Linear
from .cpu_transformer import Attention, KvUpdate, RmsNorm, Rope

Tensor = torch.Tensor
Calls = list[NativeCall] | None
#: (kernel, inputs, outputs, threads) -> the dispatch as native calls (each holding what it points into), or None
Planner = Callable[[Any, list[Tensor], list[Tensor], int], Calls]

_enabled = os.environ.get("TORCH_IR_NATIVE_CHAIN", "1").strip().lower() not in ("0", "false", "no", "off")


def set_enabled(enabled: bool) -> bool:
    """Chain native dispatches (True, the default unless ``TORCH_IR_NATIVE_CHAIN=0``) or make every dispatch from
    Python; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(enabled)
    return previous


def _every(calls: Sequence[NativeCall | None]) -> Calls:
    return list(calls) if calls and all(c is not None for c in calls) else None


def _rows(t: Tensor) -> Tensor | None:
    """``t`` as ``[rows, last dim]`` without a copy (None where that would copy)."""
    return t.view(-1, t.shape[-1]) if t.dim() and t.is_contiguous() else None


def _threads(weight: Tensor, threads: int) -> int:
    return threads if weight.nbytes >= cpu_gemv.SINGLE_THREAD_BYTES else 1


def _linear(linear: Any, x: Tensor | None, out: Tensor | None, residual: Tensor | None, threads: int) -> Calls:
    """``x · Wᵀ (+ bias) (+ residual)`` of one row into ``out`` as the kernels' linear makes it: a float weight's
    GEMV (``_Linear``, the residual added in it), or (fp32) each block part's GEMV into its columns (contiguous for
    one row), then the residual added (:class:`BlockLinear`)."""
    if x is None or out is None or x.shape[0] != 1:
        return None
    if isinstance(linear, _Linear):
        return _every([linear.gemv.native_call(x, out, residual, _threads(linear.gemv.weight, threads))])
    if not isinstance(linear, BlockLinear) or x.dtype != torch.float32 or out.dtype != torch.float32:
        return None
    calls, col = [], 0
    for part in linear.parts:
        if part.gemv is None or part.native_int8(1) != linear.int8:
            return None
        gemv = part.gemv
        calls.append(gemv.native_call(x, out[:, col:col + part.n], _threads(gemv.weight, threads),
                                      "int8" if linear.int8 else "float32"))
        col += part.n
    if residual is not None:
        calls.append(cpu_decode_ops.add_call(out, residual))
    return _every(calls)


def _gemm(k: Gemm, ins: list[Tensor], outs: list[Tensor], threads: int) -> Calls:
    if k.activation is not None:
        return None
    residual = _rows(ins[-1]) if k.has_residual else None
    if k.has_residual and residual is None:
        return None
    return _linear(k.linear, _rows(ins[0]), _rows(outs[0]), residual, threads)


def _scratch(n: int, like: Tensor) -> Tensor:
    """The ``[1, n]`` buffer a kernel's run makes for its contraction (of its output's dtype), made once (the calls
    that read or write it hold it)."""
    return torch.empty(1, n, dtype=like.dtype)


def _gate_up(k: GateUp, ins: list[Tensor], outs: list[Tensor], threads: int) -> Calls:
    both = _scratch(2 * k.n, outs[0])
    calls = _linear(k.linear, _rows(ins[0]), both, None, threads)
    return _every([*calls, cpu_decode_ops.silu_mul_call(both, outs[0])]) if calls else None


def _qkv(k: QkvProj, ins: list[Tensor], outs: list[Tensor], threads: int) -> Calls:
    """One row: q, k and v are the scratch's column ranges, contiguous, in order (heads first or not: one token)."""
    both = _scratch(sum(k.splits), outs[0])
    calls = _linear(k.linear, _rows(ins[0]), both, None, threads)
    if not calls:
        return None
    col = 0
    for n, out in zip(k.splits, outs):
        calls.append(cpu_decode_ops.copy_call(both[:, col:col + n], out))
        col += n
    return _every(calls)


_PLANNERS: dict[type, Planner] = {
    RmsNorm: lambda k, ins, outs, t: _every([cpu_decode_ops.rms_norm_call(
        ins[0], ins[1] if len(ins) > 1 else None, outs[0], k.eps, k.held)]) if k.native else None,
    Rope: lambda k, ins, outs, t: _every([cpu_decode_ops.rope_qk_call(
        ins[0], ins[1], ins[-2], ins[-1], outs[0], outs[1])]) if k.native else None,
    Attention: lambda k, ins, outs, t: _every([cpu_decode_ops.attention_call(
        ins[0], ins[1], ins[2], ins[3] if len(ins) > 3 else None, outs[0], k.scale, k.scratch, k.held)])
    if k.native else None,
    KvUpdate: lambda k, ins, outs, t: _every([cpu_decode_ops.kv_update_call(
        outs[0], ins[1], ins[2], k.dim)]) if k.in_place else None,
    Gemm: _gemm,
    GateUp: _gate_up,
    QkvProj: _qkv,
}


def plan_dispatch(kernel: Any, ins: list[Tensor], outs: list[Tensor], threads: int) -> Calls:
    """A dispatch's native calls, or None where it must run from Python (no planner for its kernel, or a case the
    planner does not take: another shape or dtype, a tensor the checks refuse)."""
    planner = _PLANNERS.get(type(kernel))
    if planner is None:
        return None
    try:
        return planner(kernel, ins, outs, threads)
    except (ValueError, TypeError):  # the calls' checks refused a tensor: the kernel's own code handles it
        return None


class _Chain:
    """Consecutive dispatches' native calls as one table for ``dops_chain``."""

    def __init__(self, calls: list[tuple[int, NativeCall]]) -> None:
        self.owners = [index for index, _ in calls]  # the dispatch of each call
        self.calls = [call for _, call in calls]  # the table holds their blocks' addresses: held here
        table = []
        for _, call in calls:
            table += [call.address, ctypes.cast(ctypes.c_char_p(call.block), ctypes.c_void_p).value]
        self.table = torch.tensor(table, dtype=torch.int64)
        self.stop = self.owners[-1] + 1

    def run(self, seconds: list[float] | None = None) -> int | None:
        """Make the calls; None when all were made, else the dispatch whose call failed (nothing of it written).
        ``seconds``: each dispatch's time is added to its entry."""
        ns = torch.zeros(len(self.owners), dtype=torch.int64) if seconds is not None else None
        failed = cpu_decode_ops.chain(self.table, len(self.owners), ns)
        if ns is not None:
            for index, t in zip(self.owners, ns.tolist()):
                seconds[index] += t * 1e-9
        return None if failed < 0 else self.owners[failed]


class Chains:
    """An executor's steps with every run of dispatches that have native calls made as one (module docstring).
    ``steps``: the executor's ``(run, inputs, outputs)`` per dispatch; ``plannable``: whether each may be planned (a
    bind-time dispatch, already computed, may not). ``at``: the dispatch running (an error names it)."""

    def __init__(self, kernels: Sequence[Any], steps: Sequence[tuple], plannable: Sequence[bool]) -> None:
        self.kernels, self.steps, self.plannable = list(kernels), list(steps), list(plannable)
        self.plans: dict[tuple, list[int | _Chain]] = {}
        self.at = 0

    def plan(self) -> list[int | _Chain]:
        """The plan for now's settings: dispatch indices to run from Python, and chains (made once per setting)."""
        key = (_enabled, NativeKernel.enabled, torch.get_num_threads(), cpu_decode_ops._library() is not None,
               cpu_decode_ops._isa, cpu_qgemv._isa_cap(), cpu_gemv._isa_cap())
        found = self.plans.get(key)
        if found is None:
            found = self.plans[key] = self._plan(key[2]) if key[0] and key[3] else list(range(len(self.steps)))
        return found

    def _plan(self, threads: int) -> list[int | _Chain]:
        plan: list[int | _Chain] = []
        run: list[tuple[int, NativeCall]] = []
        for index, (kernel, (_, ins, outs), ok) in enumerate(zip(self.kernels, self.steps, self.plannable)):
            calls = plan_dispatch(kernel, ins, outs, threads) if ok else None
            if calls is not None:
                run += [(index, call) for call in calls]
                continue
            self._close(plan, run)
            run = []
            plan.append(index)
        self._close(plan, run)
        return plan

    @staticmethod
    def _close(plan: list[int | _Chain], run: list[tuple[int, NativeCall]]) -> None:
        dispatches = sorted({index for index, _ in run})
        if len(dispatches) > 1:
            plan.append(_Chain(run))
        else:  # one dispatch gains nothing from a chain: its kernel makes its calls itself
            plan.extend(dispatches)

    def run(self, seconds: list[float] | None = None) -> None:
        """One run of the steps, in order. ``seconds`` (one entry a dispatch): each dispatch's wall time is added to
        its entry, a chained one's timed in C (a profile of what chains run; ``bench/llm/chain_profile.py``)."""
        for item in self.plan():
            if type(item) is int:
                self._step(item, seconds)
                continue
            self.at = item.owners[0]
            failed = item.run(seconds)
            for index in range(failed if failed is not None else item.stop, item.stop):
                self._step(index, seconds)

    def _step(self, index: int, seconds: list[float] | None) -> None:
        self.at = index
        fn, ins, outs = self.steps[index]
        if seconds is None:
            fn(ins, outs)
            return
        start = time.perf_counter()
        fn(ins, outs)
        seconds[index] += time.perf_counter() - start

    def chained(self) -> int:
        """How many dispatches the plan for now's settings makes in chains."""
        return sum(len(set(item.owners)) for item in self.plan() if isinstance(item, _Chain))


__all__ = ["Chains", "plan_dispatch", "set_enabled"]
