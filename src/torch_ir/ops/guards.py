"""Checks that make an allow-listed ATen op memory-safe for any arguments a file can give it.

Most ATen CPU kernels check their index, size, stride and shape arguments and raise (``as_strided`` checks its
view against the storage, ``gather``/``index``/``embedding``/``take`` their indices, the LU solvers their pivots,
``_unsafe_masked_index`` clamps); the allow-list (:mod:`torch_ir.ops.allowlist`) admits those as they are, and
``tests/security/test_op_fuzz.py`` holds them to it. Those that do not check are refused (``_reshape_alias``,
the backward ops, ``bincount`` with its value-sized output), except the few that models use, which run behind
a guard here. Each guard was written for what the fuzzing found:

- ``zeroed``: ``empty*`` return uninitialized memory, which an output would leak: their outputs are zero-filled;
- ``checked_segments``: ``segment_reduce(unsafe=True)`` skips its length checks: it always runs with them;
- ``channel_params``: batch norm reads ``weight``, ``bias`` and the running statistics by channel, unchecked;
- ``same_shape_target``: ``binary_cross_entropy`` reads its target (and weight) at the input's indices;
- ``grid_modes``: ``grid_sampler`` uses its integer modes as an enum, unchecked (-1 reads outside the input);
- ``lu_pivots``: ``lu_unpack`` trusts the length of its pivots;
- ``finite_matrix``: ``linalg_eigvals`` hands NaN to LAPACK, which crashes (``linalg_eig`` refuses it);
- ``weight_norm_shapes``: ``_weight_norm`` divides by zero natively (SIGFPE) on shapes that do not agree;
- ``pool1d_window``: ``max_pool1d`` loops for ever on a window larger than its input;
- ``bounded_counts``: ``_chunk_cat``, ``tensor_split``, ``combinations``, ``histogram`` and ``mvlgamma`` take a
  count from the file that sizes their work or their number of outputs before anything checks it.

A guard is ``guard(call, kwargs) -> result``: it checks ``kwargs`` (the op's bound arguments, meta tensors too:
the registry's size pre-check runs guarded), then calls ``call(kwargs)``, and may fix up the result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import UnsafeInputError
from ..limits import check_alloc

#: The most outputs a count from a file may give one op (``tensor_split(sections=2**31)`` would make 2^31 views).
MAX_OUTPUTS = 1 << 16

Call = Callable[[dict[str, Any]], Any]
Guard = Callable[[Call, dict[str, Any]], Any]


def zeroed(call: Call, kwargs: dict[str, Any]) -> Any:
    """An ``empty*`` op with its outputs zero-filled: uninitialized memory would leak into an output."""
    result = call(kwargs)
    for t in [result] if isinstance(result, torch.Tensor) else result:
        if isinstance(t, torch.Tensor):
            t.zero_()
    return result


def checked_segments(call: Call, kwargs: dict[str, Any]) -> Any:
    """``segment_reduce`` with its length checks on (``unsafe=True`` skips them)."""
    return call({**kwargs, "unsafe": False})


def _checking(check: Callable[[dict[str, Any]], None]) -> Guard:
    """A guard that only checks the arguments, then runs the op as it is."""
    def guard(call: Call, kwargs: dict[str, Any]) -> Any:
        check(kwargs)
        return call(kwargs)

    guard.__doc__ = check.__doc__
    return guard


def _refuse(op: str, rule: str) -> UnsafeInputError:
    return UnsafeInputError(f"{op}: {rule}")


def _channel_params(kwargs: dict[str, Any]) -> None:
    """Per-channel parameters of batch norm: one value per channel of the input (dimension 1)."""
    x = kwargs["input"]
    channels = x.shape[1] if x.dim() >= 2 else None
    for name in ("weight", "bias", "running_mean", "running_var"):
        t = kwargs.get(name)
        if t is not None and (channels is None or t.dim() != 1 or t.shape[0] != channels):
            raise _refuse("batch_norm", f"{name} has shape {list(t.shape)}, but the input of shape {list(x.shape)} "
                                        f"needs one value per channel ({channels})")


def _same_shape_target(kwargs: dict[str, Any]) -> None:
    """The target (and the weight) of binary_cross_entropy: the input's shape (eager Python checks it too)."""
    x = kwargs["self"]
    for name in ("target", "weight"):
        t = kwargs.get(name)
        if t is not None and tuple(t.shape) != tuple(x.shape) and not (
                name == "weight" and torch.broadcast_shapes(t.shape, x.shape) == x.shape):
            raise _refuse("binary_cross_entropy", f"{name} of shape {list(t.shape)} does not match the input's "
                                                  f"{list(x.shape)}")


def _grid_modes(kwargs: dict[str, Any]) -> None:
    """The integer modes of grid_sampler: interpolation 0-2 (bilinear, nearest, bicubic), padding 0-2."""
    for name in ("interpolation_mode", "padding_mode"):
        if kwargs[name] not in (0, 1, 2):
            raise _refuse("grid_sampler", f"{name}={kwargs[name]} is not 0, 1 or 2")


def _lu_pivots(kwargs: dict[str, Any]) -> None:
    """lu_unpack's pivots: one per row of the factorization, ``LU.shape[:-2] + [min(m, n)]``."""
    lu, pivots = kwargs["LU_data"], kwargs["LU_pivots"]
    want = [*lu.shape[:-2], min(lu.shape[-2:])] if lu.dim() >= 2 else None
    if want is None or list(pivots.shape) != want:
        raise _refuse("lu_unpack", f"pivots of shape {list(pivots.shape)} for LU of shape {list(lu.shape)}; "
                                   f"they must have shape {want}")


def _finite_matrix(kwargs: dict[str, Any]) -> None:
    """A matrix LAPACK's eigenvalue routines can take: finite (as torch.linalg.eig requires)."""
    x = kwargs["self"]
    if x.device.type != "meta" and x.numel() and not bool(torch.isfinite(x).all()):
        raise _refuse("linalg_eigvals", "the input holds infinities or NaNs (torch.linalg.eig refuses them too)")


def _weight_norm_shapes(kwargs: dict[str, Any]) -> None:
    """_weight_norm(v, g, dim): v not empty, dim -1 (the whole tensor) or one of v's, g one value per slice."""
    v, g, dim = kwargs["v"], kwargs["g"], kwargs.get("dim", 0)
    if not v.numel() or not (dim == -1 or 0 <= dim < v.dim()):
        raise _refuse("_weight_norm", f"v of shape {list(v.shape)} with dim={dim}")
    if g.numel() != (1 if dim == -1 else v.shape[dim]):
        raise _refuse("_weight_norm", f"g of shape {list(g.shape)} does not hold one value per slice of v "
                                      f"{list(v.shape)} along dim {dim}")


def _pool1d_window(kwargs: dict[str, Any]) -> None:
    """max_pool1d's window: positive kernel, stride and dilation, padding from 0 to half the kernel, and a
    window that fits the padded input."""
    x = kwargs["self"]
    kernel, stride = list(kwargs["kernel_size"]), list(kwargs.get("stride") or kwargs["kernel_size"])
    padding, dilation = list(kwargs.get("padding") or [0]), list(kwargs.get("dilation") or [1])
    if len(kernel) != 1 or min(kernel + stride + dilation) < 1 or not 0 <= padding[0] <= kernel[0] // 2:
        raise _refuse("max_pool1d", f"kernel_size={kernel}, stride={stride}, padding={padding}, dilation={dilation}")
    if x.dim() and dilation[0] * (kernel[0] - 1) + 1 > x.shape[-1] + 2 * padding[0]:
        raise _refuse("max_pool1d", f"a window of {kernel[0]} (dilation {dilation[0]}) is larger than the input")


def _bounded_counts(kwargs: dict[str, Any]) -> None:
    """A count from the file that sizes an op's work or outputs: at least 1, and within the limits."""
    if "num_chunks" in kwargs:  # _chunk_cat: num_chunks slices of every tensor, padded
        n, tensors = kwargs["num_chunks"], kwargs["tensors"]
        if n < 1:
            raise _refuse("_chunk_cat", f"num_chunks={n} must be at least 1")
        check_alloc(n * sum(t.element_size() for t in tensors), f"_chunk_cat into {n} chunks")
    elif "sections" in kwargs:
        if not 1 <= kwargs["sections"] <= MAX_OUTPUTS:
            raise _refuse("tensor_split", f"sections={kwargs['sections']} is not from 1 to {MAX_OUTPUTS}")
    elif "r" in kwargs:  # combinations builds a meshgrid of r copies of its n elements: n**r of them
        n, r = kwargs["self"].numel(), kwargs["r"]
        if not 0 <= r <= 64:
            raise _refuse("combinations", f"r={r} must be from 0 to 64")
        check_alloc(max(n, 1) ** r * 8, f"combinations of r={r} from {n} elements (a grid of n**r)")
    elif "p" in kwargs:  # mvlgamma sums p lgamma terms per element, through one tensor of numel * p of them
        x, p = kwargs["self"], kwargs["p"]
        if p < 1:
            raise _refuse("mvlgamma", f"p={p} must be at least 1")
        check_alloc(max(x.numel(), 1) * p * x.element_size(), f"mvlgamma of order p={p} over {x.numel()} elements")
    elif "bins" in kwargs:
        bins = kwargs["bins"]
        if bins < 1:
            raise _refuse("histogram", f"bins={bins} must be at least 1")
        check_alloc(bins * 8, f"histogram of {bins} bins")


GUARDS: Mapping[str, Guard] = {
    "zeroed": zeroed, "checked_segments": checked_segments, "channel_params": _checking(_channel_params),
    "same_shape_target": _checking(_same_shape_target), "grid_modes": _checking(_grid_modes),
    "lu_pivots": _checking(_lu_pivots), "finite_matrix": _checking(_finite_matrix),
    "weight_norm_shapes": _checking(_weight_norm_shapes), "pool1d_window": _checking(_pool1d_window),
    "bounded_counts": _checking(_bounded_counts),
}
