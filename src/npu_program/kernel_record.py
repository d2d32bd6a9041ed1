"""The shape of the kernel table's rows: :class:`KernelDef` (a kernel record) and :class:`KernelTest` (its test
record, made with :func:`t`), the registry they are declared into (:func:`kernel`, ``KERNELS``) and the
constants the rows use. The rows are ``npu_kernels`` (the NPU ops) and ``aten_kernels`` (ATen ops an NPU runs as
they are); :mod:`npu_program.kernels` loads both, in that order, and is where to import any of this from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch_ir.activations import ACTIVATIONS as ACTIVATION_TABLE
from torch_ir.dtypes import nbytes as dtype_nbytes

from .array_mapping import Mapping
from .cost_formulas import Flops, KernelCost, Spec, Traffic, per_output, whole
from .params import Param, declare

#: The dtypes a kernel runs unless its record says otherwise (names of the dtype table, `torch_ir.dtypes`).
KERNEL_DTYPES = frozenset({"float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"})
FLOATS = frozenset({"float32", "float16", "bfloat16"})

#: The backend implementation that runs the op's reference implementation from the ``torch_ir`` op
#: registry (the op type is the kernel name), so an op is declared once and every kernel has a CPU path.
REFERENCE = "reference"

#: Activations a GEMM or CONV applies to its result (``activation`` parameter; null for none): the names of the
#: one activation table, ``torch_ir.activations``.
ACTIVATIONS = tuple(ACTIVATION_TABLE)

#: Kernel names older programs hold that this table spells as another kernel with parameters set. A program is
#: read through it (``npu_program.program.Dispatch``), so an old file runs as the kernel it now is: ``CONV_ADD``,
#: the convolution with a residual add of programs compiled before the residual became CONV's ``has_residual``.
KERNEL_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {"CONV_ADD": ("CONV", {"has_residual": True})}


# -- the test record --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelTest:
    """How the kernel test table runs a kernel: example inputs, parameters and tolerances.

    ``inputs`` are ``(shape, dtype, values)``: dtype ``"*"`` is the dtype under test, ``values`` one of
    ``normal``, ``positive`` (away from zero), ``bool``, ``index:N`` (integers in [0, N)), ``positions:N``
    (distinct integers in [0, N), as a cache write needs). Inputs at the
    positions in ``weights`` are weight slots (bound before the run), the others graph inputs.
    ``rtol``/``atol`` are for float32 and scale with the dtype (``torch_ir.verify.default_tolerance``).
    ``params`` are the test node's IR attributes (the IR's encoding, ``{"dtype": {"dtype": "float16"}}``):
    lowering turns them into the kernel's declared params as it does any node's.
    """

    inputs: tuple[tuple[tuple[int, ...], str, str], ...]
    params: dict[str, Any] = field(default_factory=dict)
    weights: tuple[int, ...] = ()
    dtypes: tuple[str, ...] = ("float32",)
    rtol: float = 1e-5
    atol: float = 1e-5


def t(*inputs: str, params: dict[str, Any] | None = None, weights: tuple[int, ...] = (),
      dtypes: tuple[str, ...] = ("float32",), **tol: float) -> KernelTest:
    """A test record from compact input specs: ``"2,3,4"`` (normal, the dtype under test),
    ``"2,3:positive"``, ``"4:int64:index:3"``, ``"2,3:bool"``, ``":float32"`` (0-d)."""
    parsed = []
    for spec in inputs:
        shape_text, _, rest = spec.partition(":")
        shape = tuple(int(d) for d in shape_text.split(",") if d)
        dtype, values = "*", "normal"
        if rest == "positive":
            values = "positive"
        elif rest == "bool":
            dtype, values = "bool", "bool"
        elif rest:
            dtype, _, values = rest.partition(":")
            values = values or "normal"
        parsed.append((shape, dtype, values))
    return KernelTest(tuple(parsed), dict(params or {}), weights, dtypes, **tol)


# -- the record ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelDef:
    """Everything about one kernel. See the module docstring."""

    name: str
    kind: str  # contraction | elementwise | normalization | attention | reduction | pooling | resampling | sorting
    #            | movement | fused | host (runs on the host CPU only: see ``host``)
    doc: str
    dtypes: frozenset[str] = KERNEL_DTYPES
    #: A view: relabels a contiguous tensor's shape; lowered to no dispatch (an alias of the input's bytes).
    view: bool = False
    #: "spatial": its 4-D activations are stored NHWC on a channels-last target; "keeps": its output keeps
    #: the layout of a same-shaped input (elementwise); None: row-major.
    layout: str | None = None
    #: Parameter name -> its typed declaration (``npu_program.params``: type, default, doc): what a dispatch of
    #: the kernel may carry, checked when a program is loaded. ``kernel(params=(p(...), ...))`` builds it.
    params: dict[str, Param] = field(default_factory=dict)
    #: Of a kernel with a ``has_bias`` parameter: the inputs before its bias (the bias's index when present), so
    #: that lowering can tell ``has_bias`` from the input count when the IR leaves it out.
    bias_index: int | None = None
    #: Its outputs are its first inputs written in place, output i into input i (a KV cache; a quantized one's codes
    #: and scales): the one kind of dispatch that may write a program's state slots (``npu_compiler.state``).
    writes_state: bool = False
    #: ATen ops that normalize into this kernel: an IR node of one of them counts this record's FLOPs
    #: (``node_flops``), before normalization has made the kernel.
    aten_sources: tuple[str, ...] = ()
    flops: Flops = per_output
    #: How it runs on a MAC array, as GEMMs (``npu_program.array_mapping``); None: not on the array (a contraction
    #: without one is costed at the array's peak rate and flagged).
    array: Mapping | None = None
    #: The elements it reads of each input and writes of each output (DRAM traffic; see ``Traffic``).
    traffic: Traffic = whole
    #: Backend name -> implementation: REFERENCE, or "module:Class" of a fast kernel whose ``accepts``
    #: classmethod says whether it runs a given dispatch (else the reference runs it).
    impls: dict[str, str] = field(default_factory=lambda: {"cpu": REFERENCE})
    #: The WGSL of an elementwise kernel: an expression of its inputs ``x0``, ``x1``, ... and parameters
    #: ``{name}`` (``{name=default}``), which the WebGPU backend's elementwise generator broadcasts over the
    #: output (``npu_runtime.backends.webgpu.elementwise``). Other kernels name their WGSL generator in ``impls``.
    wgsl: str | None = None
    #: Why no program may contain it yet (the compiler refuses it with this reason); None when it may.
    deferred: str | None = None
    #: Why the op runs on the host CPU, never as a kernel of a target (data-dependent work an NPU has no unit
    #: for): a strict compile refuses it with this reason, ``compile(fallback="cpu")`` places it on the host.
    host: str | None = None
    #: Its entries in the kernel test table (every backend's implementation against the reference): one
    #: record, or several for a kernel whose parameters select different code (padding modes).
    test: KernelTest | tuple[KernelTest, ...] | None = None

    def cost(self, ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any] | None = None) -> KernelCost:
        """FLOPs and the bytes read and written, each tensor once as ``traffic`` says (no cache model; see the cost
        model)."""
        params = params or {}
        reads, writes = self.traffic(ins, outs, params)
        return KernelCost(self.flops(ins, outs, params), sum(dtype_nbytes(n, t.dtype) for n, t in zip(reads, ins)),
                          sum(dtype_nbytes(n, t.dtype) for n, t in zip(writes, outs)))

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(self.impls)

    @property
    def tests(self) -> tuple[KernelTest, ...]:
        """Its test records (none, one or several)."""
        if self.test is None:
            return ()
        return self.test if isinstance(self.test, tuple) else (self.test,)


KERNELS: dict[str, KernelDef] = {}


def kernel(name: str, kind: str, doc: str, *, params: Sequence[Param] = (), **fields: Any) -> KernelDef:
    """Declare a kernel; ``params`` are its parameters' declarations (``p(name, type, default, doc)``)."""
    if name in KERNELS:
        raise ValueError(f"kernel {name!r} is declared twice")
    KERNELS[name] = KernelDef(name, kind, doc, params=declare(*params), **fields)
    return KERNELS[name]


_GPU = "npu_runtime.backends.webgpu"
#: The WebGPU implementation of an elementwise kernel: WGSL made from its record's ``wgsl`` expression.
GPU_ELEMENTWISE = f"{_GPU}.elementwise:elementwise"


def gpu(module: str, function: str) -> str:
    """The WebGPU implementation of a kernel: the generator ``function`` of its WGSL in ``webgpu/<module>.py``."""
    return f"{_GPU}.{module}:{function}"


#: Where the CPU backend's fast kernels are (``impls["cpu"]`` names a class of one of them).
CPU_KERNELS = "npu_runtime.backends.cpu_kernels"
CPU_TRANSFORMER = "npu_runtime.backends.cpu_transformer"
CPU_BLOCKS = "npu_runtime.backends.cpu_blocks"
CPU_QCONV = "npu_runtime.backends.cpu_qconv"
CPU_QELEMENTWISE = "npu_runtime.backends.cpu_qelementwise"
CPU_QPOOL = "npu_runtime.backends.cpu_qpool"
#: The kernels whose weight inputs (by position, ``[N, K]`` with ``trans_b``) every backend with block-quantized
#: weights reads as GGUF blocks (``npu_compiler.llm.with_block_weights``); the CPU backend also gives any other
#: dispatch such a weight dequantized.
BLOCK_WEIGHT_INPUTS = {"GEMM": (1,), "GATE_UP": (1, 2), "QKV_PROJ": (1, 2, 3)}
#: The dtypes most float kernels' test records run in.
HALF = ("float32", "bfloat16")
