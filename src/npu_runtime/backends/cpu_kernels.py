"""CPU kernels for the NPU runtime's CPU backend.

A compiled program is a flat list of kernel dispatches over a preallocated arena. Each kernel is a
``prepare``/``run`` pair built by a factory in :data:`KERNELS`::

    kernel = KERNELS[name](params, input_names, output_names)
    kernel.prepare(weights)          # once: fold batch norm, prepack weights
    kernel.run(inputs, outputs)      # per inference: write results INTO ``outputs``

``inputs`` holds the *activation* tensors in the order of ``input_names`` with the weight names left out
(weights are captured by ``prepare``). A name counts as a weight when it is a key of the dict given to
``prepare``; every kernel records which of its inputs are activations in ``activation_inputs``.

Output modes. By default (``out_mode="arena"``) ``run`` writes into ``outputs`` and returns ``None``.
With ``params["out_mode"] == "fresh"`` a kernel whose fast path allocates (the oneDNN convolution,
max pooling) instead returns the list of new tensors and ignores ``outputs``; the runtime then binds
those tensors in place of the arena slots. ``returns_fresh`` tells the runtime which contract a kernel
follows.

Layout. The fast convolution path is oneDNN (``mkldnn::_convolution_pointwise``) with a weight prepacked
into oneDNN's blocked layout. It is fastest when activations are ``channels_last`` (NHWC): the output is
then NHWC too, so copying it into an NHWC arena slot is a plain memcpy. The runtime should allocate 4-D
activation slots as ``channels_last`` (``torch.empty(...).as_strided`` with NHWC strides).

Conv ``impl`` (``params["impl"]``, default ``"mkldnn"``):

* ``"mkldnn"``: prepacked oneDNN weight, activation fused into the convolution.
* ``"aten"``: ``torch.nn.functional.conv2d`` with the folded weight, activation applied in place.

``"conv2d_add"`` is ``conv2d`` with a residual input fused in (``y = act(conv(x) + residual)``), the
ResNet block tail; with ``impl="mkldnn"`` it is one oneDNN call with a binary-add (+relu) post-op. With
``params["inplace_residual"]`` the runtime promises that ``outputs[0]`` *is* the residual's buffer (the
residual's last use), and the conv accumulates into it in place: no allocation and no copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F  # noqa: N812

Tensor = torch.Tensor


class CpuKernel(Protocol):
    """A dispatchable CPU kernel: ``prepare`` once at weight-load time, ``run`` per inference."""

    activation_inputs: list[str]
    returns_fresh: bool

    def prepare(self, weights: dict[str, Tensor]) -> None: ...

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> list[Tensor] | None: ...


# --------------------------------------------------------------------------------------------- helpers


def _pair(value: int | Sequence[int]) -> list[int]:
    """``3 -> [3, 3]``; lists pass through as ``list[int]``."""
    if isinstance(value, int):
        return [value, value]
    values = [int(v) for v in value]
    return values * 2 if len(values) == 1 else values


def _mkldnn_activation(name: str | None) -> tuple[str, list[Any], str]:
    """oneDNN post-op ``(attr, scalars, algorithm)`` for an activation name."""
    table: dict[str | None, tuple[str, list[Any], str]] = {
        None: ("none", [], ""),
        "relu": ("relu", [], ""),
        "relu6": ("hardtanh", [0.0, 6.0], ""),
        "silu": ("swish", [], ""),
        "gelu": ("gelu", [], "none"),
        "gelu_tanh": ("gelu", [], "tanh"),
    }
    if name not in table:
        raise ValueError(f"unsupported activation {name!r}")
    return table[name]


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


class _Kernel:
    """Shared bookkeeping: split input names into weights (captured in ``prepare``) and activations."""

    returns_fresh = False

    def __init__(self, params: dict, inputs: list[str], outputs: list[str]) -> None:
        self.params = params
        self.input_names = list(inputs)
        self.output_names = list(outputs)
        self.activation_inputs = list(inputs)

    def _take_weights(self, weights: dict[str, Tensor]) -> dict[str, Tensor]:
        """Record which inputs are activations and return the weights this kernel consumes."""
        self.activation_inputs = [n for n in self.input_names if n not in weights]
        return {n: weights[n] for n in self.input_names if n in weights}

    def prepare(self, weights: dict[str, Tensor]) -> None:
        self._take_weights(weights)


# --------------------------------------------------------------------------------------------- conv


class Conv2d(_Kernel):
    """2-D convolution with optional bias, folded batch norm and fused activation.

    Input names: ``[x, w, (bias), (bn_weight, bn_bias, bn_mean, bn_var)]``; ``conv2d_add`` appends a
    residual activation: ``[x, w, ..., residual]`` and computes ``act(conv(x) + residual)``.
    """

    def __init__(self, params: dict, inputs: list[str], outputs: list[str], residual: bool = False) -> None:
        super().__init__(params, inputs, outputs)
        self.stride = _pair(params.get("stride", 1))
        self.padding = _pair(params.get("padding", 0))
        self.dilation = _pair(params.get("dilation", 1))
        self.groups = int(params.get("groups", 1))
        self.activation = params.get("activation")
        self.impl = params.get("impl", "mkldnn")
        self.returns_fresh = params.get("out_mode", "arena") == "fresh"
        self.residual = residual
        # conv2d_add only: the runtime guarantees outputs[0] is the residual's own buffer (residual dies here)
        self.inplace_residual = residual and bool(params.get("inplace_residual", False))
        self.attr, self.scalars, self.algorithm = _mkldnn_activation(self.activation)
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        self._run = self._run_mkldnn if self.impl == "mkldnn" else self._run_aten

    def prepare(self, weights: dict[str, Tensor]) -> None:
        self._take_weights(weights)
        w, b = self._folded(weights)
        if self.impl == "mkldnn":
            w = self._prepack(w)
        self.weight, self.bias = w, b

    def _folded(self, weights: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
        """Weight and bias with batch norm folded in (bias is ``None`` only without bias and batch norm)."""
        names = self.input_names[1:]
        w = weights[names[0]]
        b = weights[names[1]] if self.params.get("has_bias") else None
        eps = self.params.get("bn_eps")
        if eps is None:
            return w.contiguous(), b
        first_bn = 2 if self.params.get("has_bias") else 1
        bn = [weights[n] for n in names[first_bn : first_bn + 4]]
        return _fold_batch_norm(w, b, bn, float(eps))

    def _prepack(self, w: Tensor) -> Tensor:
        """Reorder the weight into oneDNN's blocked layout for this conv's geometry."""
        input_shape = self.params.get("input_shape")
        return torch.ops.mkldnn._reorder_convolution_weight(
            w, self.padding, self.stride, self.dilation, self.groups, input_shape
        )

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> list[Tensor] | None:
        y = self._run(inputs, outputs[0])
        if self.returns_fresh:
            return [y]
        if y is not outputs[0]:
            outputs[0].copy_(y)
        return None

    def _run_mkldnn(self, inputs: list[Tensor], out: Tensor) -> Tensor:
        args = (self.weight, self.bias, self.padding, self.stride, self.dilation, self.groups)
        if not self.residual:
            return torch.ops.mkldnn._convolution_pointwise(inputs[0], *args, self.attr, self.scalars, self.algorithm)
        # oneDNN binary post-op supports only "add" followed by none/relu
        unary = None if self.activation is None else self.attr
        if self.activation not in (None, "relu"):
            y = torch.ops.mkldnn._convolution_pointwise.binary(inputs[0], inputs[1], *args, "add", None, None, [], None)
            _apply_activation_(y, self.activation)
            return y
        if self.inplace_residual:
            # the runtime bound the output onto the residual's slot: accumulate in place, no copy
            return torch.ops.mkldnn._convolution_pointwise_.binary(out, inputs[0], *args, "add", 1.0, unary, [], None)
        return torch.ops.mkldnn._convolution_pointwise.binary(inputs[0], inputs[1], *args, "add", None, unary, [], None)

    def _run_aten(self, inputs: list[Tensor], out: Tensor) -> Tensor:
        y = F.conv2d(inputs[0], self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        if self.residual:
            y.add_(inputs[1])
        _apply_activation_(y, self.activation)
        return y


# --------------------------------------------------------------------------------------------- gemm


class Gemm(_Kernel):
    """``y = act(x @ W (+ bias))``. ``trans_b=True``: W is ``[N, K]`` (nn.Linear), else ``[K, N]``.

    ``impl="addmm"`` (default): ``torch.addmm(out=)`` straight into the arena on a ``[K, N]`` weight.
    ``impl="mkldnn"``: ``mkldnn::_linear_pointwise`` with fused activation, copied into the arena.
    """

    def __init__(self, params: dict, inputs: list[str], outputs: list[str]) -> None:
        super().__init__(params, inputs, outputs)
        self.activation = params.get("activation")
        self.impl = params.get("impl", "addmm")
        self.attr, self.scalars, self.algorithm = _mkldnn_activation(self.activation)
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None

    def prepare(self, weights: dict[str, Tensor]) -> None:
        self._take_weights(weights)
        w = weights[self.input_names[1]]
        w_nk = w if self.params.get("trans_b", True) else w.t()
        self.bias = weights[self.input_names[2]].contiguous() if self.params.get("has_bias") else None
        if self.impl == "mkldnn":
            self.weight = w_nk.contiguous()
        else:
            # addmm wants [K, N]; the transpose of a contiguous [N, K] is what BLAS reads fastest
            self.weight = w_nk.contiguous().t()

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        x, out = inputs[0], outputs[0]
        x2 = x.reshape(-1, x.shape[-1])
        out2 = out.view(-1, out.shape[-1])
        if self.impl == "mkldnn":
            out2.copy_(
                torch.ops.mkldnn._linear_pointwise(x2, self.weight, self.bias, self.attr, self.scalars, self.algorithm)
            )
            return
        if self.bias is None:
            torch.mm(x2, self.weight, out=out2)
        else:
            torch.addmm(self.bias, x2, self.weight, out=out2)
        _apply_activation_(out2, self.activation)


# --------------------------------------------------------------------------------------------- others


class MaxPool2d(_Kernel):
    """Max pooling; params: kernel_size, stride (default kernel_size), padding, dilation, ceil_mode."""

    def __init__(self, params: dict, inputs: list[str], outputs: list[str]) -> None:
        super().__init__(params, inputs, outputs)
        self.kernel_size = _pair(params["kernel_size"])
        self.stride = _pair(params.get("stride") or params["kernel_size"])
        self.padding = _pair(params.get("padding", 0))
        self.dilation = _pair(params.get("dilation", 1))
        self.ceil_mode = bool(params.get("ceil_mode", False))
        self.returns_fresh = params.get("out_mode", "arena") == "fresh"

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> list[Tensor] | None:
        y = F.max_pool2d(inputs[0], self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)
        if self.returns_fresh:
            return [y]
        outputs[0].copy_(y)
        return None


class GlobalAvgPool(_Kernel):
    """Mean over H and W; ``keepdim=True`` gives ``[N, C, 1, 1]``, else ``[N, C]``."""

    def __init__(self, params: dict, inputs: list[str], outputs: list[str]) -> None:
        super().__init__(params, inputs, outputs)
        self.keepdim = bool(params.get("keepdim", True))

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        torch.mean(inputs[0], (2, 3), keepdim=self.keepdim, out=outputs[0])


class Add(_Kernel):
    """Broadcasting elementwise add with optional fused relu (residual ``add + relu`` in one kernel)."""

    def __init__(self, params: dict, inputs: list[str], outputs: list[str]) -> None:
        super().__init__(params, inputs, outputs)
        self.activation = params.get("activation")

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        torch.add(inputs[0], inputs[1], out=outputs[0])
        _apply_activation_(outputs[0], self.activation)


class Relu(_Kernel):
    """``out = max(x, 0)``."""

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        torch.clamp_min(inputs[0], 0.0, out=outputs[0])


class CopyView(_Kernel):
    """Reshape/flatten done as a copy (when the output cannot alias the input)."""

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        outputs[0].copy_(inputs[0].reshape(outputs[0].shape))


KernelFactory = Callable[[dict, list[str], list[str]], CpuKernel]

KERNELS: dict[str, KernelFactory] = {
    "conv2d": Conv2d,
    "conv2d_add": lambda p, i, o: Conv2d(p, i, o, residual=True),
    "gemm": Gemm,
    "max_pool2d": MaxPool2d,
    "global_avg_pool": GlobalAvgPool,
    "add": Add,
    "relu": Relu,
    "copy_view": CopyView,
}

__all__ = ["KERNELS", "CpuKernel", "KernelFactory"]
