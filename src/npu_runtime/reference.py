"""A dispatch as the op it came from: its reference implementation from the ``torch_ir`` op registry.

The CPU backend runs kernels without a fast path through it (``cpu_kernels.Reference``), every backend
runs host dispatches (``Dispatch.host``, from ``compile(fallback="cpu")``) through it on the CPU, the
executor runs it on the meta device to check a loaded program's parameters against its output specs, and
``Executor(validate=True)`` compares every dispatch with it.

A host dispatch names an op type read from a file, so before anything runs :func:`check_host_dispatches`
refuses a program whose host dispatch names an op the registry does not have or refuses as unsafe
(``aten.from_file``, an in-place variant, ``os.system``): the same rule the IR executor applies to a node.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

from npu_program.kernels import KERNELS
from npu_program.params import params_to_attrs
from npu_program.program import CompiledProgram, Dispatch, TensorSpec
from torch_ir.errors import TorchIRError
from torch_ir.ir import OpNode, TensorMeta
from torch_ir.ops.npu import NPU_OPS
from torch_ir.ops.registry import Kernel, bind_kernel, is_supported, resolve_overload, unsafe_reason
from torch_ir.ops.values import check_value, dtype_from_name

from .device import RuntimeInputError


def reference_params(dispatch: Dispatch) -> dict[str, Any]:
    """The attributes of the op a dispatch came from, in the IR's encoding the op registry reads: a kernel's plain
    params encoded again by its record's declarations (``"float16"`` -> ``{"dtype": "float16"}``); a host
    dispatch's are its node's attributes already. An NPU op's reference takes its own attributes, not the
    kernel-only params the compiler adds (``inplace_residual``)."""
    record = KERNELS.get(dispatch.kernel) if dispatch.host is None else None
    attrs = dict(dispatch.params) if record is None else params_to_attrs(record.params, dispatch.params)
    if dispatch.kernel not in NPU_OPS:
        return attrs
    return {k: v for k, v in attrs.items() if k in NPU_OPS[dispatch.kernel].attrs}


def bind_reference(dispatch: Dispatch, specs: Mapping[str, TensorSpec], device: torch.device) -> Kernel:
    """The dispatch's op bound to its reference implementation on ``device`` (the CPU, or meta for shapes)."""
    def meta(name: str) -> TensorMeta:
        return TensorMeta(name, list(specs[name].shape), specs[name].dtype)

    node = OpNode(dispatch.node, dispatch.kernel, [meta(n) for n in dispatch.inputs],
                  [meta(n) for n in dispatch.outputs], reference_params(dispatch))
    return bind_kernel(node, device)


def _meta_input(spec: TensorSpec) -> torch.Tensor:
    """A shape-only input as the reference reads it: 4-bit codes packed two per byte, as stored; a block-quantized
    weight as the float values it means (its kernels, or the backend, dequantize it before the reference runs)."""
    quant = spec.quant
    dtype, shape = (spec.dtype, spec.shape) if quant is not None and quant.block is not None else spec.storage
    return torch.empty(shape, dtype=dtype_from_name(dtype), device="meta")


def check_output_shapes(index: int, dispatch: Dispatch, specs: Mapping[str, TensorSpec], model: str,
                        unread: Collection[str] = ()) -> None:
    """Run the dispatch's reference on the meta device (shapes only, nothing allocated) and refuse the
    program when its parameters give outputs other than its specs: a kernel would otherwise write past
    its slot in the arena (a CONV whose padding disagrees with its output spec, from a hostile file)."""
    where = f"dispatch {index} ({dispatch.kernel}, node {dispatch.node!r}) of program {model!r}"
    inputs = [_meta_input(specs[n]) for n in dispatch.inputs]
    try:
        outputs = bind_reference(dispatch, specs, torch.device("meta"))(inputs, {})
    except TorchIRError:
        raise
    except Exception as e:  # noqa: BLE001 - any refusal of the parameters by the op itself
        if isinstance(e, NotImplementedError) or "meta" in str(e):
            return  # a reference that makes CPU tensors itself (a causal mask) cannot run on meta: unchecked
        raise RuntimeInputError(f"{where} has parameters its op refuses ({type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''}); recompile the model") from None
    got = [list(t.shape) for t in outputs]
    want = [list(specs[n].storage[1]) for n in dispatch.outputs]
    # a meta kernel may size an output nothing reads smaller than the CPU kernel makes it (embedding_bag's
    # max_indices: [0] on meta, one per bag on the CPU); such an output only has to fit its slot
    if len(got) != len(want) or any(g != w and not (name in unread and _numel(g) <= _numel(w))
                                    for g, w, name in zip(got, want, dispatch.outputs)):
        raise RuntimeInputError(f"{where}: its parameters give outputs of shapes {got}, but the program's specs "
                                f"say {want}; the program is inconsistent: recompile the model")


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def host_op_problem(op: str) -> str | None:
    """Why the host must not run ``op`` for a host dispatch (None: it may): the op registry has no
    implementation of it, or refuses it as unsafe (it touches files or process state, writes an argument)."""
    if is_supported(op):
        return None
    overload = resolve_overload(op)
    reason = unsafe_reason(op, overload) if overload is not None else None
    if reason is not None:
        return f"the op registry refuses it: {reason}"
    return "the torch_ir op registry has no implementation of it (host dispatches run registered ops only)"


def check_host_dispatches(program: CompiledProgram) -> None:
    """Refuse the program, before anything is allocated or run, if a host dispatch names an op the host may
    not run or holds attributes that are no attribute values of the IR (an unknown tag, a symbolic size outside
    the safe grammar: ``torch_ir.ops.values.check_value``); the error names the program, the dispatch, its op
    and the rule. Host dispatches have no kernel record: this, and the op's schema when it is bound, is their
    params' check (the loader's only bounds them as JSON)."""
    for index, dispatch in enumerate(program.dispatches):
        if dispatch.host is None:
            continue
        where = f"program {program.model_name!r}: dispatch {index} (host op {dispatch.kernel!r})"
        try:
            for key, value in dispatch.params.items():
                check_value(value, f"{where} param {key!r}")
        except TorchIRError:
            raise
        except ValueError as e:
            raise RuntimeInputError(f"{e}; recompile the model") from None
        problem = host_op_problem(dispatch.kernel)
        if problem is not None:
            raise RuntimeInputError(
                f"program {program.model_name!r}: dispatch {index} (node {dispatch.node!r}) is a host dispatch of "
                f"op {dispatch.kernel!r}, which the host may not run: {problem}. A host dispatch may only name an "
                "op of the torch_ir op registry that touches nothing but its own tensors (docs/security.md); "
                "recompile the model, or register the op's reference implementation with @torch_ir.register_op")
