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

from npu_compiler.compiled_program import Dispatch, TensorSpec
from torch_ir.ir import OpNode, TensorMeta
from torch_ir.ops.registry import bind_kernel

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

    def __init__(self, dispatch: Dispatch, input_shape: list[int], residual: bool = False) -> None:
        params = dispatch.params
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

    def __init__(self, dispatch: Dispatch) -> None:
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

    def __init__(self, dispatch: Dispatch) -> None:
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

    def __init__(self, fn: Callable[..., Tensor]) -> None:
        self.fn = fn

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        self.fn(*inputs, out=outputs[0])


class Reference:
    """Any kernel of the library: the op's reference implementation, its results copied into the arena."""

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        def meta(name: str) -> TensorMeta:
            spec = specs[name]
            return TensorMeta(name, list(spec.shape), spec.dtype)

        node = OpNode(dispatch.node, dispatch.kernel, [meta(n) for n in dispatch.inputs],
                      [meta(n) for n in dispatch.outputs], dict(dispatch.params))
        self.fn = bind_kernel(node, torch.device("cpu"))

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        for out, value in zip(outputs, self.fn(inputs, {})):
            out.copy_(value)


class ConvAddReference(Reference):
    """``CONV_ADD`` where oneDNN cannot run it: the reference CONV, then the residual add and activation."""

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        conv = Dispatch("CONV", dispatch.node, dispatch.inputs[:-1], dispatch.outputs,
                        {k: v for k, v in dispatch.params.items() if k != "inplace_residual"} | {"activation": None})
        super().__init__(conv, specs)
        self.activation = dispatch.params.get("activation")

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        (y,) = self.fn(inputs[:-1], {})
        y = y + inputs[-1]
        _apply_activation_(y, self.activation)
        outputs[0].copy_(y)


# --------------------------------------------------------------------------------------------- choice

_BINARY = {"aten.add.Tensor": torch.add, "aten.mul.Tensor": torch.mul, "aten.sub.Tensor": torch.sub}


def make_kernel(dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> Kernel:
    """The fastest CPU kernel that implements ``dispatch``; the reference one when no fast path applies.

    ``weight_names`` are the inputs bound before the first run (weights and constants): fast paths that
    prepack a weight need it to be one.
    """
    kind, params, names = dispatch.kernel, dispatch.params, dispatch.inputs
    if kind in ("CONV", "CONV_ADD"):
        x = specs[names[0]]
        fast = len(x.shape) == 4 and x.dtype == "float32" and all(n in weight_names for n in _conv_weights(dispatch))
        if fast and params.get("activation") in _MKLDNN_ACTIVATIONS:
            return Conv2d(dispatch, list(x.shape), residual=kind == "CONV_ADD")
        return ConvAddReference(dispatch, specs) if kind == "CONV_ADD" else Reference(dispatch, specs)
    if kind == "GEMM" and not params.get("trans_a") and all(n in weight_names for n in names[1:]) \
            and specs[names[0]].dtype == "float32":
        return Gemm(dispatch)
    if kind == "aten.max_pool2d.default":
        return MaxPool2d(dispatch)
    if kind in _BINARY and params.get("alpha", 1) == 1 and len(names) == 2 and _same_dtype(dispatch, specs):
        return Binary(_BINARY[kind])
    if kind == "aten.relu.default":
        return Binary(lambda x, out: torch.clamp_min(x, 0.0, out=out))
    return Reference(dispatch, specs)


def _conv_weights(dispatch: Dispatch) -> list[str]:
    end = len(dispatch.inputs) - (1 if dispatch.kernel == "CONV_ADD" else 0)
    return dispatch.inputs[1:end]


def _same_dtype(dispatch: Dispatch, specs: dict[str, TensorSpec]) -> bool:
    return len({specs[n].dtype for n in [*dispatch.inputs, *dispatch.outputs] if n in specs}) == 1


__all__ = ["make_kernel"]
