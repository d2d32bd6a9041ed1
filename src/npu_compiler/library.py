"""The targets that implement the kernel table, and the compiler's one support check.

The kernels themselves (names, kinds, dtypes, layouts, costs, implementations) are records of the
kernel table, ``npu_program.kernels``. A :class:`Target` lists which of them it has and which dtypes
it runs; a runtime backend implements them. Adding a backend (WebGPU compute shaders, say) means
registering a ``Target`` with :func:`register_target` and adding its implementations to the kernel
records: the compiler does not change.

``unsupported_reason(node, target)`` is the one support check: ``compile`` refuses a graph with any
unsupported node, and ``partition`` places those nodes on the CPU with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from npu_program.kernels import KERNEL_DTYPES, KERNELS, all_kernels, kernels_for
from npu_program.quant_kernels import QUANT_DTYPES
from torch_ir.ir import OpNode, TensorMeta
from torch_ir.ops.npu import NPU_OPS

if TYPE_CHECKING:
    from .costmodel.hardware import Hardware


@dataclass(frozen=True)
class Target:
    """What one backend can run: its kernels, its dtypes, and its preferred activation layout."""

    name: str
    #: The kernels it runs; None: every kernel of the table with an implementation for the backend of the
    #: same name (looked up when asked, so a kernel record added later is included).
    kernels: frozenset[str] | None = None
    #: The dtypes it runs (a kernel runs those of them its record names): quantized codes (int4 packed, fp8, int16)
    #: included, which only the quantized kernels' records name.
    dtypes: frozenset[str] = KERNEL_DTYPES | QUANT_DTYPES
    # Store 4-D activations of convolutions as NHWC (what oneDNN and most NPUs run fastest).
    channels_last: bool = False
    # Byte alignment of every tensor in the activation arena (WebGPU storage-buffer offsets need 256).
    alignment: int = 64
    doc: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    #: The NPU description its kernel list comes from (``narrowed``), named in the reasons of what it lacks.
    described_in: str = ""
    #: Kernel name -> a check of a node's attributes and shapes beyond its dtypes: why the target's kernel cannot
    #: run that node (None: it can). What a backend's generator would refuse, said at compile time.
    node_checks: Mapping[str, Callable[[OpNode], str | None]] = field(default_factory=dict)

    def runs(self, kernel: str) -> bool:
        """Whether this target has ``kernel``."""
        return kernel in (self.kernels if self.kernels is not None else kernels_for(self.name))

    def narrowed(self, kernels: Iterable[str], described_in: str) -> Target:
        """This target with only ``kernels`` (an NPU's declared list) of those it runs. It keeps its name, so its
        backend still runs (simulates) the NPU's parts; what the list leaves out is placed on the CPU, the reason
        naming ``described_in``."""
        wanted = frozenset(kernels)
        return dataclasses.replace(self, kernels=frozenset(k for k in all_kernels() if k in wanted and self.runs(k)),
                                   described_in=described_in)


TARGETS: dict[str, Target] = {}


def register_target(target: Target, *, override: bool = False) -> Target:
    """Make ``target`` available to ``compile(target=...)``; every kernel it names must be a known kernel."""
    unknown = sorted((target.kernels or frozenset()) - all_kernels())
    if unknown:
        raise ValueError(f"target {target.name!r} names kernels the compiler never emits: {unknown}")
    if target.name in TARGETS and not override:
        raise ValueError(f"target {target.name!r} is already registered; pass override=True to replace it")
    TARGETS[target.name] = target
    return target


def get_target(target: str | Target) -> Target:
    """The registered target of that name (a ``Target`` passes through)."""
    if isinstance(target, Target):
        return target
    try:
        return TARGETS[target]
    except KeyError:
        raise ValueError(f"unknown target {target!r}; registered targets: {', '.join(sorted(TARGETS))}") from None


def target_for_hardware(hw: Hardware, base: str | Target = "cpu") -> Target:
    """The target of an NPU description: ``base`` narrowed to the kernels its ``[kernels] supported`` list
    names (``Hardware.kernel_names``); ``base`` itself when the description declares no list."""
    base = get_target(base)
    kernels = hw.kernel_names()
    return base if kernels is None else base.narrowed(kernels, hw.described_in)


register_target(Target(
    "cpu", channels_last=True,
    doc="the CPU backend of npu_runtime: oneDNN convolutions and BLAS GEMMs through PyTorch's CPU kernels",
))

#: The code and output types of the WebGPU int8 kernels (``npu_runtime.backends.webgpu.quant``): 8-bit codes, int32
#: biases and accumulators, float results.
_WEBGPU_QUANT_TYPES = frozenset({"int8", "uint8", "int32", "float32", "float16", "bfloat16"})


def _webgpu_quantized(node: OpNode) -> str | None:
    """Why the WebGPU int8 kernels cannot run a quantized node: a 4-bit, 16-bit or float8 code type named by an
    attribute (4-bit codes travel as uint8 bytes, so the dtype check alone misses them), or a convolution not 2-D."""
    for attr in ("dtype", "w_dtype", "out_dtype"):
        value = node.attrs.get(attr)
        if isinstance(value, str) and value not in _WEBGPU_QUANT_TYPES:
            return (f"{node.op_type} with {attr}={value}: the WebGPU kernels run 8-bit codes (int8, uint8); compile "
                    "with fallback='cpu' to run it on the host")
    if node.op_type == "QCONV" and node.inputs and len(node.inputs[0].shape) != 4:
        return f"{node.op_type} of a rank-{len(node.inputs[0].shape)} x: the WebGPU kernel is 2-D"
    if node.op_type in ("QCONV", "QGEMM") and len(node.inputs) >= 6:  # x, w, x_scale, x_zp, w_scale, w_zp, ...
        codes = {3: node.inputs[0].dtype, 5: node.attrs.get("w_dtype", "int8")}
        for i, dtype in codes.items():
            if node.inputs[i].dtype != dtype:
                zp = node.inputs[i]
                return (f"{node.op_type}'s zero point {zp.name!r} is {zp.dtype}, not its codes' {dtype}: the WebGPU "
                        "kernels take ONNX's (compile with fallback='cpu')")
    return None


register_target(Target(
    # the dtypes WGSL stores (``webgpu.wgsl.binding``): 8-bit codes four to a word; 4-bit, 16-bit and float8 codes
    # and float64 scales have no WGSL kernel, so compile places their nodes on the host (fallback="cpu")
    "webgpu", channels_last=True, alignment=256, dtypes=KERNEL_DTYPES,
    node_checks={op: _webgpu_quantized for op in ("QUANTIZE", "DEQUANTIZE", "QCONV", "QGEMM")},
    doc="the WebGPU backend of npu_runtime: WGSL compute shaders generated from the kernel records, on Metal, "
        "Vulkan, D3D12 or Mesa (256-byte alignment: WebGPU's storage-buffer offset rule)",
))


# -- the support check ------------------------------------------------------------------------------

def unsupported_reason(node: OpNode, target: str | Target = "cpu") -> str | None:
    """Why ``target`` cannot run ``node`` (None when it can): a missing kernel, a dtype, a dynamic shape."""
    target = get_target(target)
    op = node.op_type
    record = KERNELS.get(op)
    if record is not None and record.deferred:
        return f"{op} {record.deferred}"
    if record is not None and record.host:
        return f"{op} stays on the host CPU: {record.host}"
    if not target.runs(op):
        return _missing_kernel(op, target)
    dtypes = target.dtypes & record.dtypes
    for t in [*node.inputs, *node.outputs]:
        if not t.is_static:
            return (f"tensor {t.name!r} has the symbolic shape {t.shape}; programs are planned for static shapes "
                    "(export with fixed shapes, or run this part on the CPU)")
        if t.dtype not in dtypes:
            return f"tensor {t.name!r} is {t.dtype}; {op} on target {target.name!r} runs {', '.join(sorted(dtypes))}"
    check = target.node_checks.get(op)
    return check(node) if check is not None else None


def _missing_kernel(op: str, target: Target) -> str:
    if op in NPU_OPS or op in KERNELS:
        base = TARGETS.get(target.name)
        if target.described_in and (base is None or base.runs(op)):  # the NPU's list left it out
            return f"the NPU described in {target.described_in} has no kernel for {op}"
        return f"target {target.name!r} has no kernel for {op}"
    return f"{op} is not in the NPU kernel library (docs/kernels.md lists the kernels)"


def is_op_supported(op: str | OpNode, target: str | Target = "cpu") -> bool:
    """Whether the target's kernel library runs ``op`` (an op type such as ``"GEMM"``, or a node).

    For a node, dtypes and static shapes are checked too; an op type alone answers for the op.
    """
    if isinstance(op, OpNode):
        return unsupported_reason(op, target) is None
    probe = OpNode(name=op, op_type=op, inputs=[], outputs=[TensorMeta(op, [], "float32")])
    return unsupported_reason(probe, target) is None
