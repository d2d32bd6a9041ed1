"""CPU kernels of the CPU backend, one per kernel name of the compiler's library.

Each kernel is a ``prepare``/``run`` pair made by :func:`make_kernel`::

    kernel = make_kernel(dispatch, specs, weight_names)
    kernel.prepare(weights)          # once per weight set: fold batch norm, prepack, transpose
    kernel.run(inputs, outputs)      # per inference: write the results INTO ``outputs``

``inputs`` are all the dispatch's inputs (activations, weights and constants) in order; ``outputs`` are
views of the arena. The hot kernels of CNNs and transformers have their own classes: ``CONV``
(oneDNN with a prepacked weight, batch norm folded and the activation fused), ``CONV_ADD`` (the same
with the residual add as a oneDNN post-op, accumulated in place when the compiler marked
``inplace_residual``: the output *is* the residual's buffer), ``GEMM`` (``addmm`` into the arena),
max pooling, add and relu. Every other kernel runs the op's reference implementation from the
``torch_ir`` op registry and copies the result into the arena, so each op is declared once.

Layout: 4-D activations of convolutions are NHWC (``channels_last``) in the arena; oneDNN then reads and
writes them without conversion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from npu_program.kernels import REFERENCE, get_kernel
from npu_program.program import Dispatch, TensorSpec

from .base import Kernel

Tensor = torch.Tensor


# --------------------------------------------------------------------------------------------- helpers


def _pair(value: int | Sequence[int]) -> list[int]:
    """``3 -> [3, 3]``; lists pass through as ``list[int]``."""
    if isinstance(value, int):
        return [value, value]
    values = [int(v) for v in value]
    return values * 2 if len(values) == 1 else values


# activation -> oneDNN post-op (attr, scalars, algorithm). relu and relu6 are not fused into oneDNN:
# its clamping post-ops turn NaN into 0 (a NaN weight would give finite logits, where eager gives NaN);
# they run as torch's NaN-propagating clamp in the copy into the arena instead, which costs no extra pass.
_MKLDNN_ACTIVATIONS: dict[str | None, tuple[str, list[Any], str]] = {
    None: ("none", [], ""),
    "relu": ("none", [], ""),
    "relu6": ("none", [], ""),
    "silu": ("swish", [], ""),
    "gelu": ("gelu", [], "none"),
    "gelu_tanh": ("gelu", [], "tanh"),
}
_CLAMPS = {"relu": (0.0, None), "relu6": (0.0, 6.0)}


def _store(out: Tensor, y: Tensor, activation: str | None) -> None:
    """``out = clamp(y)`` for the activations oneDNN does not apply (see ``_MKLDNN_ACTIVATIONS``), else a copy."""
    if activation in _CLAMPS:
        torch.clamp(y, *_CLAMPS[activation], out=out)
    else:
        out.copy_(y)


def _apply_activation_(t: Tensor, name: str | None) -> None:
    """Apply an activation in place on ``t``."""
    if name is None:
        return
    if name == "relu":
        t.relu_()
    elif name == "relu6":
        t.clamp_(0.0, 6.0)
    elif name == "silu":
        F.silu(t, inplace=True)
    elif name in ("gelu", "gelu_tanh"):
        t.copy_(F.gelu(t, approximate="tanh" if name == "gelu_tanh" else "none"))
    else:
        raise ValueError(f"unsupported activation {name!r}")


def _fold_batch_norm(w: Tensor, b: Tensor | None, bn: Sequence[Tensor], eps: float) -> tuple[Tensor, Tensor]:
    """Fold inference batch norm into conv weight/bias: ``w*g/sqrt(v+eps)``, ``(b-m)*g/sqrt(v+eps)+beta``."""
    gamma, beta, mean, var = (t.double() for t in bn)
    scale = gamma / torch.sqrt(var + eps)
    bias = b.double() if b is not None else torch.zeros_like(mean)
    w_folded = w.double() * scale.reshape(-1, *([1] * (w.dim() - 1)))
    return w_folded.to(w.dtype), ((bias - mean) * scale + beta).to(w.dtype)


# --------------------------------------------------------------------------------------------- conv


class Conv2d:
    """2-D convolution (oneDNN, prepacked) with optional bias, folded batch norm and fused activation.

    Inputs: ``[x, w, (bias), (bn_weight, bn_bias, bn_mean, bn_var)]``; with ``residual=True`` (``CONV_ADD``)
    a residual activation comes last and the kernel computes ``act(conv(x) + residual)``.
    """

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        x = specs[dispatch.inputs[0]]
        end = len(dispatch.inputs) - (1 if dispatch.kernel == "CONV_ADD" else 0)
        return (len(x.shape) == 4 and x.dtype == "float32" and all(n in weight_names for n in dispatch.inputs[1:end])
                and dispatch.params.get("activation") in _MKLDNN_ACTIVATIONS)

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        params = dispatch.params
        input_shape, residual = list(specs[dispatch.inputs[0]].shape), dispatch.kernel == "CONV_ADD"
        self.names = dispatch.inputs
        self.params = params
        self.stride = _pair(params.get("stride", 1))
        self.padding = _pair(params.get("padding", 0))
        self.dilation = _pair(params.get("dilation", 1))
        self.groups = int(params.get("groups", 1))
        self.activation = params.get("activation")
        self.input_shape = input_shape
        self.residual = residual
        # CONV_ADD only: the compiler placed the output on the residual's bytes (the residual dies here)
        self.inplace = residual and bool(params.get("inplace_residual", False))
        self.attr, self.scalars, self.algorithm = _MKLDNN_ACTIVATIONS[self.activation]
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None

    def prepare(self, weights: dict[str, Tensor]) -> None:
        w, b = self._folded(weights)
        self.weight = torch.ops.mkldnn._reorder_convolution_weight(
            w, self.padding, self.stride, self.dilation, self.groups, self.input_shape)
        self.bias = b

    def _folded(self, weights: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
        """Weight and bias with batch norm folded in (bias is ``None`` only without bias and batch norm)."""
        has_bias = bool(self.params.get("has_bias"))
        w = weights[self.names[1]]
        b = weights[self.names[2]] if has_bias else None
        eps = self.params.get("bn_eps")
        if eps is None:
            return w.contiguous(), b
        first = 3 if has_bias else 2
        bn = [weights[n] for n in self.names[first:first + 4]]
        return _fold_batch_norm(w, b, bn, float(eps))

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        out, x = outputs[0], inputs[0]
        args = (self.weight, self.bias, self.padding, self.stride, self.dilation, self.groups)
        if not self.residual:
            y = torch.ops.mkldnn._convolution_pointwise(x, *args, self.attr, self.scalars, self.algorithm)
        elif self.inplace:  # out is the residual's buffer: accumulate into it, no allocation, no copy
            torch.ops.mkldnn._convolution_pointwise_.binary(out, x, *args, "add", 1.0, None, [], None)
            _apply_activation_(out, self.activation)
            return
        else:  # oneDNN's binary post-op is add, then no activation (see _MKLDNN_ACTIVATIONS for relu)
            y = torch.ops.mkldnn._convolution_pointwise.binary(x, inputs[-1], *args, "add", None, None, [], None)
            if self.activation not in _CLAMPS:
                _apply_activation_(y, self.activation)
        _store(out, y, self.activation)


# --------------------------------------------------------------------------------------------- gemm


class Gemm:
    """``y = act(x @ W (+ bias))`` with ``torch.addmm(out=)`` straight into the arena.

    ``trans_b=True``: W is ``[N, K]`` (nn.Linear), else ``[K, N]``. ``prepare`` lays W out as the
    transpose of a contiguous ``[N, K]``, which is what BLAS reads fastest.
    """

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        names = dispatch.inputs
        return not dispatch.params.get("trans_a") and all(n in weight_names for n in names[1:]) \
            and specs[names[0]].dtype == "float32"

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.names = dispatch.inputs
        self.trans_b = bool(dispatch.params.get("trans_b", True))
        self.activation = dispatch.params.get("activation")
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None

    def prepare(self, weights: dict[str, Tensor]) -> None:
        w = weights[self.names[1]]
        self.weight = (w if self.trans_b else w.t()).contiguous().t()
        self.bias = weights[self.names[2]].contiguous() if len(self.names) == 3 else None

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        x, out = inputs[0], outputs[0]
        x2, out2 = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
        if self.bias is None:
            torch.mm(x2, self.weight, out=out2)
        else:
            torch.addmm(self.bias, x2, self.weight, out=out2)
        _apply_activation_(out2, self.activation)


# --------------------------------------------------------------------------------------------- others


class MaxPool2d:
    """Max pooling with the ``aten.max_pool2d`` attributes."""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        return True

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        p = dispatch.params
        self.kernel_size = _pair(p["kernel_size"])
        self.stride = _pair(p.get("stride") or p["kernel_size"])
        self.padding = _pair(p.get("padding", 0))
        self.dilation = _pair(p.get("dilation", 1))
        self.ceil_mode = bool(p.get("ceil_mode", False))

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        outputs[0].copy_(F.max_pool2d(inputs[0], self.kernel_size, self.stride, self.padding, self.dilation,
                                      self.ceil_mode))


class Binary:
    """A broadcasting elementwise op written with ``out=`` (no temporary)."""

    FUNCTIONS: dict[str, Callable[..., Tensor]] = {
        "aten.add.Tensor": torch.add, "aten.mul.Tensor": torch.mul, "aten.sub.Tensor": torch.sub}

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        dtypes = {specs[n].dtype for n in [*dispatch.inputs, *dispatch.outputs] if n in specs}
        return dispatch.params.get("alpha", 1) == 1 and len(dispatch.inputs) == 2 and len(dtypes) == 1

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.fn = self.FUNCTIONS[dispatch.kernel]

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        self.fn(*inputs, out=outputs[0])


class Relu(Binary):
    """relu with ``out=``: torch's clamp, which keeps NaN (``relu_`` semantics)."""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        return True

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.fn = lambda x, out: torch.clamp_min(x, 0.0, out=out)


class Reference:
    """Any kernel of the library: the op's reference implementation, its results copied into the arena."""

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        from ..reference import bind_reference  # the reference module imports the device, which imports backends

        self.fn = bind_reference(dispatch, specs, torch.device("cpu"))

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        for out, value in zip(outputs, self.fn(inputs, {})):
            out.copy_(value)


# --------------------------------------------------------------------------------------------- choice


def make_kernel(dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> Kernel:
    """The kernel table's CPU implementation of ``dispatch`` when it accepts it, else the reference one.

    ``weight_names`` are the inputs bound before the first run (weights and constants): fast paths that
    prepack a weight need it to be one.
    """
    impl = get_kernel(dispatch.kernel).impls.get("cpu", REFERENCE)
    if impl != REFERENCE:
        module, _, name = impl.partition(":")
        cls = globals()[name] if module == __name__ else None  # the table names classes of this module only
        if cls is not None and cls.accepts(dispatch, specs, weight_names):
            return cls(dispatch, specs)
    return Reference(dispatch, specs)


__all__ = ["make_kernel"]
