"""The kernel table: one record per kernel the compiler can emit, holding everything about it.

A :class:`KernelDef` says what a kernel is (its kind and doc), what it runs (dtypes), how it treats
layouts (a *view* that is no dispatch at all, a *spatial* kernel whose 4-D activations are stored
NHWC on a channels-last target, a kernel that *keeps* the layout of a same-shaped input), its
parameters, its cost (FLOPs and bytes for given tensor specs), and its implementation per backend.
Everything else is derived from these records: the view and layout sets, node FLOPs, the cost model's
array mapping, lowering's bias arity, which dispatch may write a state slot, the CPU backend's kernel
choice, the compiler's support check and ``docs/kernels.md``. Adding a kernel means adding one record here
(and, for a fast path, a class in a backend); see ``docs/extending.md``.

Kernel names are target-neutral: an NPU op lowers to the kernel of the same name (``GEMM``), an ATen op
an NPU runs as it is lowers to a kernel named by its op type (``aten.add.Tensor``), and a fused kernel
(``GATE_UP``) replaces several nodes. A fusion that only adds an input and an epilogue is an attribute of the
kernel it extends, not a kernel of its own: a CONV's residual add is ``has_residual``, as a GEMM's is. This
module imports neither torch nor the compiler: a runtime, a docs generator or a cost model reads it as plain
data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch_ir.activations import ACTIVATIONS as ACTIVATION_TABLE
from torch_ir.dtypes import nbytes as dtype_nbytes

from .array_mapping import (
    Mapping,
    attention_mapping,
    attn_output_mapping,
    attn_score_mapping,
    baddbmm_mapping,
    conv_mapping,
    gate_up_mapping,
    gemm_mapping,
    matmul_mapping,
    qkv_mapping,
)
from .aten_params import ATEN_PARAMS
from .cost_formulas import (
    Flops,
    KernelCost,
    Spec,
    Traffic,
    attention_flops,
    attn_score_flops,
    baddbmm_flops,
    bagged,
    cache_update,
    conv_flops,
    conv_traffic,
    conv_transpose_flops,
    einsum_flops,
    gate_up_flops,
    gathered,
    gemm_flops,
    matmul_flops,
    no_flops,
    overwritten,
    per_output,
    qkv_flops,
    reduce_flops,
    whole,
)
from .params import Param, declare, p

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
    #: Its output is its first input written in place (a KV cache): the one kind of dispatch that may write a
    #: program's state slot (``npu_compiler.state``).
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


def get_kernel(name: str) -> KernelDef:
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"no kernel named {name!r}; the kernel table (docs/kernels.md) lists them") from None


_GPU = "npu_runtime.backends.webgpu"
_EW = f"{_GPU}.elementwise:elementwise"


def gpu(module: str, function: str) -> str:
    """The WebGPU implementation of a kernel: the generator ``function`` of its WGSL in ``webgpu/<module>.py``."""
    return f"{_GPU}.{module}:{function}"


_ACT = f"null or one of {', '.join(ACTIVATIONS)}: applied to the result (torch_ir.activations)"
#: Required in a program (no default): the IR may leave it out, and lowering then counts the inputs; a default
#: here would say "no bias" of a dispatch with one.
_HAS_BIAS = "a bias input follows w (lowering counts the inputs when the IR leaves it out)"


def _activation() -> Param:
    return p("activation", "str|null", None, _ACT, choices=ACTIVATIONS)


def _conv_params() -> tuple[Param, ...]:
    return (p("stride", "ints", doc="per spatial dim"), p("padding", "ints", doc="per spatial dim"),
            p("dilation", "ints", doc="per spatial dim"), p("groups", "int", 1, "channel groups"),
            p("has_bias", "bool", doc=_HAS_BIAS),
            p("bn_eps", "float|null", None, "batch norm folded when not null; its four inputs follow"), _activation())


_CPU = "npu_runtime.backends.cpu_kernels"
_CPU_TRANSFORMER = "npu_runtime.backends.cpu_transformer"
_HALF = ("float32", "bfloat16")
_CONV_PARAMS = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1}

# -- NPU ops ------------------------------------------------------------------------------------------------

kernel("GEMM", "contraction", "y = act(x · w(ᵀ) + bias [+ residual])", flops=gemm_flops, array=gemm_mapping,
       bias_index=2,
       params=(p("trans_a", "bool", False, "x's last two dims are transposed"),
               p("trans_b", "bool", True, "w is [N, K] (nn.Linear)"), p("has_bias", "bool", doc=_HAS_BIAS),
               p("has_residual", "bool", False, "a residual activation of y's shape is the last input, added "
                                                "before the activation (inputs [x, w, bias?, residual])"),
               _activation()),
       impls={"cpu": f"{_CPU}:Gemm", "webgpu": gpu("contraction", "gemm")},
       test=(t("2,5,16", "8,16", "8", params={"trans_b": True, "activation": "gelu"}, weights=(1, 2), dtypes=_HALF),
             t("2,5,16", "8,16", "8", "2,5,8", params={"trans_b": True, "has_bias": True, "has_residual": True},
               weights=(1, 2)),
             t("1,1,16", "8,16", "1,1,8", params={"trans_b": True, "has_bias": False, "has_residual": True},
               weights=(1,))))
kernel("CONV", "contraction", "2-D convolution with optional bias, folded batch norm, residual add and activation",
       flops=conv_flops, traffic=conv_traffic, array=conv_mapping, layout="spatial", dtypes=FLOATS, bias_index=2,
       aten_sources=("aten.conv2d.default", "aten.convolution.default"),
       params=(*_conv_params(),
               p("has_residual", "bool", False, "a residual of y's shape is the last input, added before the "
                                                "activation (a ResNet block's add)"),
               p("inplace_residual", "bool", False, "the output is written over the residual (it dies here): set "
                                                    "by the compiler")),
       impls={"cpu": f"{_CPU}:Conv2d", "webgpu": gpu("contraction", "conv")},
       test=(t("1,3,9,9", "4,3,3,3", "4", "4", "4", "4", "4:positive", weights=(1, 2, 3, 4, 5, 6),
               params={**_CONV_PARAMS, "has_bias": True, "bn_eps": 1e-5, "activation": "relu"}, atol=1e-4),
             t("1,4,6,6", "4,4,3,3", "4", "1,4,6,6", weights=(1, 2),
               params={**_CONV_PARAMS, "has_bias": True, "bn_eps": None, "has_residual": True,
                       "activation": "relu"}, atol=1e-4)))
kernel("LAYER_NORM", "normalization", "layer norm over the trailing dims", layout="keeps", dtypes=FLOATS,
       params=(p("normalized_shape", "ints", doc="trailing dims"), p("eps", "float", 1e-5, "epsilon")),
       impls={"cpu": REFERENCE, "webgpu": gpu("transformer", "layer_norm")},
       test=t("2,5,8", "8", "8", params={"normalized_shape": [8], "eps": 1e-5}, weights=(1, 2), dtypes=_HALF))
kernel("RMS_NORM", "normalization", "RMS norm over the last dim", layout="keeps", dtypes=FLOATS,
       params=(p("eps", "float", 1e-6, "epsilon"),),
       impls={"cpu": f"{_CPU_TRANSFORMER}:RmsNorm", "webgpu": gpu("transformer", "rms_norm")},
       test=t("2,5,8", "8", params={"eps": 1e-6}, weights=(1,), dtypes=_HALF))
kernel("SOFTMAX", "normalization", "softmax(x * scale + mask) along dim", layout="keeps",
       params=(p("dim", "int", -1, "axis"), p("scale", "float", 1.0, "scale applied first")),
       impls={"cpu": REFERENCE, "webgpu": gpu("transformer", "softmax")},
       test=t("2,3,7", params={"dim": -1, "scale": 0.5}, dtypes=_HALF))
kernel("QKV_PROJ", "contraction", "the Q, K and V projections of one input as one GEMM", flops=qkv_flops,
       array=qkv_mapping, bias_index=4,  # three weights (one when packed: lowering reads ``packed``)
       params=(p("splits", "ints", doc="output widths"),
               p("has_bias", "bool|bools", doc="biases follow the weights (one flag, or [q, k, v]; lowering counts "
                                               "the inputs when the IR leaves it out)"),
               p("trans_b", "bool", True, "as GEMM"), p("packed", "bool", False, "one weight"),
               p("num_heads", "int|null", None, "query heads"), p("num_kv_heads", "int|null", None, "key/value heads"),
               p("head_dim", "int|null", None, "per head"),
               p("heads_first", "bool", False, "outputs head-major [B, heads, T, head_dim] (the head split and "
                                               "transpose done by the kernel's store) rather than [B, T, width]")),
       impls={"cpu": f"{_CPU}:QkvProj", "webgpu": gpu("contraction", "qkv_proj")},
       test=(t("1,4,8", "8,8", "4,8", "4,8", weights=(1, 2, 3), dtypes=_HALF,
               params={"splits": [8, 4, 4], "has_bias": False, "trans_b": True, "packed": False,
                       "num_heads": 2, "num_kv_heads": 1, "head_dim": 4}),
             t("2,6,8", "8,8", "4,8", "4,8", "8", "4", "4", weights=(1, 2, 3, 4, 5, 6), dtypes=_HALF,
               params={"splits": [8, 4, 4], "has_bias": True, "trans_b": True, "packed": False,
                       "num_heads": 2, "num_kv_heads": 1, "head_dim": 4, "heads_first": True}),
             t("1,4,8", "8,8", "8,8", "8,8", "8", "8", weights=(1, 2, 3, 4, 5),
               params={"splits": [8, 8, 8], "has_bias": [True, False, True], "trans_b": True, "packed": False,
                       "num_heads": 2, "num_kv_heads": 2, "head_dim": 4}),
             t("1,3,8", "8,8", "4,8", "4,8", "8", "4", "4", weights=(1, 2, 3, 4, 5, 6),
               params={"splits": [8, 4, 4], "has_bias": True, "trans_b": True, "packed": False,
                       "num_heads": 2, "num_kv_heads": 1, "head_dim": 4, "heads_first": True}),
             t("2,3,8", "24,8", weights=(1,),
               params={"splits": [8, 8, 8], "has_bias": False, "trans_b": True, "packed": True,
                       "num_heads": 2, "num_kv_heads": 2, "head_dim": 4, "heads_first": True})))
kernel("ATTN_SCORE", "attention", "softmax(q · kᵀ · scale + mask)", flops=attn_score_flops, array=attn_score_mapping,
       params=(p("scale", "float", doc="applied to q · kᵀ"), p("causal", "bool", False, "mask the future")),
       impls={"cpu": REFERENCE, "webgpu": gpu("transformer", "attn_score")},
       test=t("1,2,5,4", "1,2,5,4", params={"scale": 0.5, "causal": True}))
kernel("ATTN_OUTPUT", "attention", "p · v, heads merged", flops=matmul_flops, array=attn_output_mapping,
       dtypes=FLOATS,
       params=(p("merge_heads", "bool", True, "[B, T, H·D] rather than [B, H, T, D]"),),
       impls={"cpu": REFERENCE, "webgpu": gpu("transformer", "attn_output")},
       test=t("1,2,5,5:positive", "1,2,5,4", params={"merge_heads": True}))
kernel("ATTENTION", "attention", "softmax(q · kᵀ · scale + mask) · v, heads merged: ATTN_SCORE and ATTN_OUTPUT "
       "in one kernel (grouped-query k and v, a KV cache longer than q)", flops=attention_flops,
       array=attention_mapping,
       params=(p("scale", "float", doc="applied to q · kᵀ"), p("causal", "bool", False, "mask the future"),
               p("merge_heads", "bool", True, "[B, T, H·D] rather than [B, H, T, D]")),
       impls={"cpu": f"{_CPU_TRANSFORMER}:Attention", "webgpu": gpu("transformer", "attention")},
       test=(t("1,4,5,4", "1,2,5,4", "1,2,5,4", params={"scale": 0.5, "causal": True, "merge_heads": True},
               dtypes=_HALF),
             t("1,4,1,4", "1,2,7,4", "1,2,7,4", "1,1,1,7:bool",
               params={"scale": 0.5, "causal": False, "merge_heads": True}),
             t("2,2,3,4", "2,2,3,4", "2,2,3,4", "2,1,3,3", params={"scale": 0.5, "causal": False,
                                                                  "merge_heads": False}),
             t("1,4,2,4", "1,1,6,4", "1,1,6,4", "1,1,2,6:bool", params={"scale": 0.5, "causal": True,
                                                                       "merge_heads": True})))
kernel("SILU_GATE", "elementwise", "silu(a) * b", layout="keeps", dtypes=FLOATS,
       impls={"cpu": REFERENCE, "webgpu": _EW}, wgsl="silu_(x0) * x1", test=t("2,6", "2,6", dtypes=_HALF))
kernel("GATE_UP", "fused", "silu(x · w_gateᵀ + b_gate) * (x · w_upᵀ + b_up): a gated MLP's gate and up projections "
       "and SILU_GATE, one contraction over both weights (concatenated once, at bind time)", flops=gate_up_flops,
       array=gate_up_mapping, bias_index=3,
       dtypes=FLOATS, params=(p("trans_b", "bool", True, "as GEMM"),
                              p("has_bias", "bool", doc="b_gate and b_up follow the weights (lowering counts the "
                                                        "inputs when the IR leaves it out)")),
       impls={"cpu": f"{_CPU}:GateUp", "webgpu": gpu("contraction", "gate_up")},
       test=(t("2,5,16", "12,16", "12,16", params={"trans_b": True, "has_bias": False}, weights=(1, 2),
               atol=1e-4, dtypes=_HALF),
             t("1,1,16", "12,16", "12,16", "12", "12", params={"trans_b": True, "has_bias": True},
               weights=(1, 2, 3, 4), atol=1e-4),
             t("1,3,16", "16,12", "16,12", params={"trans_b": False, "has_bias": False}, weights=(1, 2), atol=1e-4)))
kernel("ROPE", "elementwise", "rotary position embedding", dtypes=FLOATS,
       impls={"cpu": f"{_CPU_TRANSFORMER}:Rope", "webgpu": gpu("transformer", "rope")},
       test=t("1,2,5,4", "5,4", "5,4", dtypes=_HALF))
kernel("ROPE_QK", "elementwise", "rotary position embedding of q and k (same cos and sin) in one kernel",
       dtypes=FLOATS, impls={"cpu": f"{_CPU_TRANSFORMER}:Rope", "webgpu": gpu("transformer", "rope")},
       test=t("1,4,5,4", "1,2,5,4", "1,1,5,4", "1,1,5,4", dtypes=_HALF))
kernel("EMBEDDING", "movement", "rows of a table by index; an id outside the table is an error (the runtime checks "
       "ids where they enter a program)",
       params=(p("negative_wraps", "bool", False, "ids in [-rows, rows), a negative id counting from the end "
                                                  "(ONNX Gather); else [0, rows)"),),
       traffic=gathered, impls={"cpu": REFERENCE, "webgpu": gpu("transformer", "embedding")},
       test=(t("10,4", "2,3:int64:index:10", weights=(0,)),
             t("10,4", "2,3:int64:index:10", params={"negative_wraps": True}, weights=(0,))))
kernel("BATCH_NORM", "normalization", "per-channel scale and shift from batch norm statistics", layout="keeps",
       dtypes=FLOATS, params=(p("eps", "float", 1e-5, "epsilon"),),
       impls={"cpu": REFERENCE, "webgpu": gpu("transformer", "batch_norm")},
       test=t("2,4,5,5", "4", "4", "4", "4:positive", params={"eps": 1e-5}, weights=(1, 2, 3, 4), dtypes=_HALF))
kernel("LRN", "normalization", "local response normalization across channels", layout="keeps", dtypes=FLOATS,
       params=(p("size", "int", doc="channels in the window"), p("alpha", "float", 1e-4, "scale"),
               p("beta", "float", 0.75, "exponent"), p("k", "float", 1.0, "added first")),
       impls={"cpu": REFERENCE, "webgpu": gpu("transformer", "lrn")},
       test=t("1,6,4,4", params={"size": 3, "alpha": 1e-2, "beta": 0.75, "k": 1.0}, dtypes=_HALF))
kernel("KV_UPDATE", "movement", "write new keys/values into a KV cache at positions, in place: its output is "
       "the cache's state slot (see npu_compiler.state)", params=(p("dim", "int", 2, "axis"),), flops=no_flops,
       traffic=cache_update,
       writes_state=True,
       impls={"cpu": f"{_CPU_TRANSFORMER}:KvUpdate", "webgpu": gpu("transformer", "kv_update")},
       test=t("1,2,8,4", "1,2,3,4", "3:int64:positions:8", params={"dim": 2}, dtypes=_HALF))

# -- ATen ops an NPU runs as they are: one line each, with its test record -------------------------------------

_ELEMENTWISE = "elementwise, as the ATen op"
_FAST = {"aten.add.Tensor": "Binary", "aten.mul.Tensor": "Binary", "aten.sub.Tensor": "Binary",
         "aten.relu.default": "Relu", "aten.max_pool2d.default": "MaxPool2d"}


def aten(name: str, kind: str, test: KernelTest | tuple[KernelTest, ...], doc: str = _ELEMENTWISE, *,
         wgsl: str | None = None, webgpu: str | None = None, **fields: Any) -> None:
    """An ATen op's kernel: its CPU implementation (a fast one where ``_FAST`` names it, else the reference)
    and its WebGPU one (``wgsl``, an elementwise expression, or ``webgpu``, a generator)."""
    op = f"aten.{name}"
    impls = {"cpu": f"{_CPU}:{_FAST[op]}"} if op in _FAST else {"cpu": REFERENCE}
    if wgsl is not None or webgpu is not None:
        impls["webgpu"] = _EW if wgsl is not None else webgpu
    kernel(op, kind, doc, params=ATEN_PARAMS[op], impls=impls, test=test, wgsl=wgsl, **fields)


_X, _XY, _POS = t("2,3,4,5", dtypes=_HALF), t("2,3,4,5", "2,3,4,5", dtypes=_HALF), t("2,3,4:positive")
_BOOL2, _CMP = t("3,4:bool", "3,4:bool"), t("3,4", "3,4")
_INT2 = t("3,4:int32", "3,4:int32")
for _name, _test, _wgsl in [
    ("add.Tensor", t("2,3,4,5", "4,5", dtypes=_HALF), "x0 + {alpha=1} * x1"),
    ("add.Scalar", t("2,3", params={"other": 1.5}), "x0 + {other} * {alpha=1}"),
    ("sub.Tensor", _XY, "x0 - {alpha=1} * x1"),
    ("sub.Scalar", t("2,3", params={"other": 1.5}), "x0 - {other} * {alpha=1}"),
    ("rsub.Scalar", t("2,3", params={"other": 2.0}), "{other} - x0 * {alpha=1}"),
    ("mul.Tensor", _XY, "x0 * x1"),
    ("mul.Scalar", t("2,3", params={"other": 3}), "x0 * {other}"),
    ("div.Tensor", t("2,3", "2,3:positive"), "x0 / x1"),
    ("div.Scalar", t("2,3", params={"other": 4.0}), "x0 / {other}"),
    ("relu.default", _X, ACTIVATION_TABLE["relu"].wgsl.format(x="x0")),  # the fused relu's form: one NaN rule
    ("gelu.default", t("2,3,4", params={"approximate": "tanh"}), "gelu_{approximate=none}_(x0)"),
    ("silu.default", _X, "silu_(x0)"),
    ("sigmoid.default", _X, "sigmoid_(x0)"),
    ("tanh.default", _X, "tanh_(x0)"),
    ("exp.default", t("2,3"), "exp(x0)"),
    ("log.default", _POS, "log(x0)"),
    ("neg.default", _X, "-x0"),
    ("sqrt.default", _POS, "sqrt(x0)"),
    ("rsqrt.default", _POS, "inverseSqrt(x0)"),
    ("abs.default", _X, "abs(x0)"),
    ("erf.default", _X, "erf_(x0)"),
    ("reciprocal.default", _POS, "1.0 / x0"),
    ("sin.default", _X, "sin(x0)"),
    ("cos.default", _X, "cos(x0)"),
    ("clamp.default", t("2,3,4", params={"min": -0.5, "max": 0.5}), "min(max(x0, {min=-inf}), {max=inf})"),
    ("hardtanh.default", t("2,3,4", params={"min_val": 0.0, "max_val": 6.0}),
     "min(max(x0, {min_val=-1.0}), {max_val=1.0})"),
    ("hardswish.default", _X, "x0 * clamp(x0 + 3.0, 0.0, 6.0) / 6.0"),
    ("hardsigmoid.default", _X, "clamp(x0 / 6.0 + 0.5, 0.0, 1.0)"),
    ("leaky_relu.default", t("2,3,4", params={"negative_slope": 0.1}),
     "select(x0, x0 * {negative_slope=0.01}, x0 < 0)"),
    ("pow.Tensor_Scalar", t("2,3:positive", params={"exponent": 2}), "pow_(x0, {exponent})"),
]:
    aten(_name, "elementwise", _test, layout="keeps", wgsl=_wgsl)
for _name, _test, _wgsl in [
    ("pow.Tensor_Tensor", t("2,3:positive", "2,3"), "pow_(x0, x1)"),
    ("maximum.default", _CMP, "max(x0, x1)"),
    ("minimum.default", _CMP, "min(x0, x1)"),
    ("where.self", t("3,4:bool", "3,4", "3,4"), "select(x2, x1, x0 != 0)"),
    ("where.ScalarOther", t("3,4:bool", "3,4", params={"other": 0.0}), "select(x2, x1, x0 != 0)"),
    ("where.ScalarSelf", t("3,4:bool", "3,4", params={"self": 1.0}), "select(x2, x1, x0 != 0)"),
    ("masked_fill.Scalar", t("3,4", "3,4:bool", params={"value": -1e4}), "select(x0, {value}, x1 != 0)"),
    ("eq.Tensor", _CMP, "x0 == x1"),
    ("eq.Scalar", t("3,4", params={"other": 0.0}), "x0 == {other}"),
    ("ne.Tensor", _CMP, "x0 != x1"),
    ("ne.Scalar", t("3,4", params={"other": 0.0}), "x0 != {other}"),
    ("lt.Tensor", _CMP, "x0 < x1"),
    ("lt.Scalar", t("3,4", params={"other": 0.0}), "x0 < {other}"),
    ("le.Tensor", _CMP, "x0 <= x1"),
    ("le.Scalar", t("3,4", params={"other": 0.0}), "x0 <= {other}"),
    ("gt.Tensor", _CMP, "x0 > x1"),
    ("gt.Scalar", t("3,4", params={"other": 0.0}), "x0 > {other}"),
    ("ge.Tensor", _CMP, "x0 >= x1"),
    ("ge.Scalar", t("3,4", params={"other": 0.0}), "x0 >= {other}"),
    ("__and__.Tensor", _BOOL2, "x0 & x1"),
    ("__or__.Tensor", _BOOL2, "x0 | x1"),
    ("bitwise_and.Tensor", _INT2, "x0 & x1"),
    ("bitwise_or.Tensor", _INT2, "x0 | x1"),
    ("bitwise_not.default", t("3,4:bool"), "select(~x0, select(1, 0, x0 != 0), {out_bool})"),
    ("logical_and.default", _BOOL2, "x0 != 0 && x1 != 0"),
    ("logical_or.default", _BOOL2, "x0 != 0 || x1 != 0"),
    ("logical_not.default", t("3,4:bool"), "x0 == 0"),
    ("_to_copy.default", t("3,4", params={"dtype": {"dtype": "float16"}}), "x0"),
]:
    aten(_name, "elementwise", _test, wgsl=_wgsl)
for _name, _test, _gpu in [
    ("mean.dim", t("2,3,4,5", params={"dim": [2, 3], "keepdim": True}), "reduce"),
    ("sum.dim_IntList", t("2,3,4", params={"dim": [1]}), "reduce"),
    ("amax.default", t("2,3,4", params={"dim": [-1]}), "reduce"),
    ("amin.default", t("2,3,4", params={"dim": [-1]}), "reduce"),
    ("argmax.default", t("2,7", params={"dim": -1}), "arg_reduce"),
]:
    aten(_name, "reduction", _test, doc="reduction, as the ATen op", flops=reduce_flops, webgpu=gpu("reduction", _gpu))
aten("max_pool2d.default", "pooling", t("1,3,8,8", params={"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
     doc="max pooling", layout="spatial", dtypes=FLOATS, flops=reduce_flops, webgpu=gpu("reduction", "pool2d"))
aten("avg_pool2d.default", "pooling", t("1,3,8,8", params={"kernel_size": [2, 2], "stride": [2, 2]}),
     doc="average pooling", layout="spatial", dtypes=FLOATS, flops=reduce_flops, webgpu=gpu("reduction", "pool2d"))
aten("adaptive_avg_pool2d.default", "pooling", t("1,3,8,8", params={"output_size": [1, 1]}),
     doc="average pooling to a size", layout="spatial", dtypes=FLOATS, flops=reduce_flops,
     webgpu=gpu("reduction", "adaptive_avg_pool2d"))
for _name, _test, _gpu in [
    ("reshape.default", t("2,3,4", params={"shape": [6, 4]}), "reshape"),
    ("view.default", t("2,3,4", params={"size": [2, 12]}), "reshape"),
    ("_unsafe_view.default", t("2,3,4", params={"size": [24]}), "reshape"),
    ("unsqueeze.default", t("2,3", params={"dim": 1}), "reshape"),
    ("squeeze.dim", t("2,1,3", params={"dim": 1}), "reshape"),
    ("squeeze.dims", t("2,1,3,1", params={"dim": [1, 3]}), "reshape"),
    ("squeeze.default", t("2,1,3"), "reshape"),
    ("flatten.using_ints", t("2,3,4,5", params={"start_dim": 1}), "reshape"),
    ("unflatten.int", t("2,12", params={"dim": 1, "sizes": [3, 4]}), "reshape"),
]:
    aten(_name, "movement", _test, doc="a view: no dispatch when its input is contiguous", view=True, flops=no_flops,
         webgpu=gpu("movement", _gpu))
#: Movement kernels that copy out part of their source (``gathered``), not all of it.
_GATHERS = frozenset({"slice.Tensor", "select.int", "index.Tensor", "gather.default", "index_select.default"})
for _name, _test, _gpu in [
    ("permute.default", t("2,3,4", params={"dims": [2, 0, 1]}), "permute"),
    ("expand.default", t("1,3,1", params={"size": [2, 3, 4]}), "expand"),
    ("slice.Tensor", t("4,6", params={"dim": 1, "start": 1, "end": 5, "step": 2}), "slice"),
    ("select.int", t("4,6", params={"dim": 0, "index": 2}), "select"),
    ("cat.default", t("2,3", "2,3", params={"tensors": [0, 1], "dim": 1}), "cat"),
    ("index.Tensor", t("5,4", "3:int64:index:5", params={"indices": [1]}), "index"),
    ("gather.default", t("3,4", "3,2:int64:index:4", params={"dim": 1}), "gather"),
    ("index_select.default", t("5,4", "3:int64:index:5", params={"dim": 0}), "index_select"),
    ("repeat.default", t("2,3", params={"repeats": [2, 1]}), "repeat"),
    ("clone.default", t("2,3"), "reshape"),
    ("contiguous.default", t("2,3"), "reshape"),
]:
    aten(_name, "movement", _test, doc="data movement, as the ATen op", flops=no_flops,
         traffic=gathered if _name in _GATHERS else whole, webgpu=gpu("movement", _gpu))
for _name, _test in [("matmul.default", t("2,3,4", "4,5", atol=1e-4)), ("bmm.default", t("2,3,4", "2,4,5", atol=1e-4)),
                     ("mm.default", t("3,4", "4,5", atol=1e-4))]:
    aten(_name, "contraction", _test, doc="matrix product, as the ATen op", flops=matmul_flops, array=matmul_mapping,
         webgpu=gpu("contraction", "matmul"))

# -- the kernel library's coverage of real models: padding, splitting, resampling, sorting --------------------------

_PAD = {"pad": [1, 2, 2, 1], "value": None}
aten("pad.default", "movement",
     (t("1,2,5,6", params={**_PAD, "mode": "constant", "value": 0.5}),
      t("1,2,5,6", params={**_PAD, "mode": "reflect"}), t("1,2,5,6", params={**_PAD, "mode": "replicate"}),
      t("1,2,5,6", params={**_PAD, "mode": "circular"})),
     doc="padding: constant (constant_pad_nd), reflect, replicate or circular", flops=no_flops,
     webgpu=gpu("movement", "pad"))
aten("split_with_sizes.default", "movement", t("2,7,3", params={"split_sizes": [2, 4, 1], "dim": 1}),
     doc="split into pieces along a dim (split and chunk read so)", flops=no_flops, webgpu=gpu("movement", "split"))
aten("unbind.int", "movement", t("3,2,4", params={"dim": 0}),
     doc="every index along a dim as its own tensor (a fused QKV split into q, k and v)", flops=no_flops,
     webgpu=gpu("movement", "unbind"))
aten("roll.default", "movement", t("2,5,6", params={"shifts": [1, -2], "dims": [1, 2]}),
     doc="a circular shift along dims", flops=no_flops, webgpu=gpu("movement", "roll"))
aten("flip.default", "movement", t("2,5,6", params={"dims": [1, 2]}), doc="reverse along dims", flops=no_flops,
     webgpu=gpu("movement", "flip"))
aten("full.default", "movement", t(params={"size": [3, 5], "fill_value": 1.5, "dtype": {"dtype": "float32"}}),
     doc="a tensor of one value (zeros_like, ones_like, full_like, fill and scalar_tensor read so; a small one "
         "is folded into a constant, a large one is filled once at bind time)", flops=no_flops,
         webgpu=gpu("movement", "full"))
_UP = {"output_size": None, "scale_factors": [2.0, 1.5]}
aten("upsample_nearest2d.vec", "resampling", t("1,3,4,6", params=_UP), doc="nearest-neighbour resize",
     layout="spatial", dtypes=FLOATS, webgpu=gpu("reduction", "upsample"))
aten("upsample_bilinear2d.vec", "resampling",
     (t("1,3,4,6", params={**_UP, "align_corners": False}), t("1,3,4,6", params={**_UP, "align_corners": True})),
     doc="bilinear resize, align_corners either way", layout="spatial", dtypes=FLOATS,
     webgpu=gpu("reduction", "upsample"))
aten("upsample_bicubic2d.vec", "resampling",
     (t("1,3,4,6", params={**_UP, "align_corners": False}, atol=1e-4),
      t("1,3,4,6", params={**_UP, "align_corners": True}, atol=1e-4)),
     doc="bicubic resize, align_corners either way", layout="spatial", dtypes=FLOATS)
aten("group_norm.default", "normalization",
     t("2,6,4,4", "6", "6", params={"num_groups": 3, "eps": 1e-5}, weights=(1, 2), atol=1e-4),
     doc="group norm: statistics over channel groups", dtypes=FLOATS, webgpu=gpu("transformer", "group_norm"))
aten("softplus.default", "elementwise", t("2,3,4", params={"beta": 1.0, "threshold": 20.0}), layout="keeps",
     wgsl="select(log(1.0 + exp(x0 * {beta=1.0})) / {beta=1.0}, x0, x0 * {beta=1.0} > {threshold=20.0})")
aten("floor_divide.default", "elementwise", t("3,4", "3,4:positive"), layout="keeps",
     wgsl="floor(f32(x0) / f32(x1))")
for _name in ("max.dim", "min.dim"):
    aten(_name, "reduction", t("2,5,3", params={"dim": 1, "keepdim": False}),
         doc="values and indices of the extreme along a dim", flops=reduce_flops, webgpu=gpu("reduction", "arg_reduce"))
aten("sum.default", "reduction", t("2,3,4"), doc="sum of every element", flops=reduce_flops,
     webgpu=gpu("reduction", "reduce"))
aten("adaptive_avg_pool1d.default", "pooling", t("2,3,12", params={"output_size": [4]}),
     doc="average pooling of a sequence to a length", dtypes=FLOATS, flops=reduce_flops)
aten("_weight_norm.default", "normalization", t("6,4", "6,1:positive", params={"dim": 0}, weights=(0, 1)),
     doc="a weight from its direction and norm (weight_norm): v · g / ‖v‖; of weights, it runs once at bind "
         "time", dtypes=FLOATS)
for _name in ("topk.default", "sort.default"):
    _params = {"k": 3, "dim": -1, "largest": True, "sorted": True} if _name == "topk.default" else {"dim": -1}
    aten(_name, "sorting", t("2,3,7", params=_params),
         doc="the sorting unit: values and indices along the last axis", flops=reduce_flops)

aten("cumsum.default", "reduction", t("2,7", params={"dim": 1}, atol=1e-4),
     doc="running sum along a dim, of a static length (RoBERTa's and OPT's position ids from the attention mask)",
     webgpu=gpu("reduction", "cumsum"))
aten("batch_norm.default", "normalization",
     t("1,4,6", params={"weight": None, "bias": None, "running_mean": None, "running_var": None, "training": True,
                        "momentum": 0.0, "eps": 1e-5, "cudnn_enabled": False}, atol=1e-4),
     doc="batch norm with batch statistics (training mode without running statistics: BiT's weight "
         "standardization); in inference form it becomes BATCH_NORM or folds into a CONV", dtypes=FLOATS)
aten("linalg_vector_norm.default", "reduction", t("2,3,5", params={"ord": 2, "dim": [-1], "keepdim": True}),
     doc="a p-norm along dims (ConvNeXt-V2's global response norm, SwinV2's cosine attention)", dtypes=FLOATS,
     flops=reduce_flops, webgpu=gpu("reduction", "reduce"))
aten("cosine_similarity.default", "reduction", t("2,5,3", "2,5,3", params={"dim": 1, "eps": 1e-8}),
     doc="cosine similarity along a dim", dtypes=FLOATS, flops=reduce_flops)
aten("clamp_min.default", "elementwise", t("2,3,4", params={"min": 0.1}), layout="keeps", wgsl="max(x0, {min})")
aten("einsum.default", "contraction",
     t("2,3,4", "2,4,5", params={"equation": "bij,bjk->bik", "tensors": [0, 1]}, atol=1e-4),
     doc="a contraction written as an equation (CvT)", flops=einsum_flops)
aten("baddbmm.default", "contraction", t("2,3,5", "2,3,4", "2,4,5", params={"beta": 0.5, "alpha": 2.0}, atol=1e-4),
     doc="beta · self + alpha · batch1 @ batch2 (BLOOM's ALiBi scores, WavLM)", flops=baddbmm_flops,
     array=baddbmm_mapping,
     webgpu=gpu("contraction", "baddbmm"))
aten("conv_transpose2d.input", "contraction",
     t("1,4,5,5", "4,3,3,3", "3", params={"stride": [2, 2], "padding": [1, 1], "output_padding": [1, 1],
                                         "groups": 1, "dilation": [1, 1]}, weights=(1, 2), atol=1e-4),
     doc="transposed 2-D convolution (U-Net and DPT upsampling)", layout="spatial", dtypes=FLOATS,
     flops=conv_transpose_flops)
aten("repeat_interleave.self_int", "movement", t("2,3,4", params={"repeats": 2, "dim": 1}),
     doc="each slice repeated along a dim (GPT-J's rotary tables)", flops=no_flops,
     webgpu=gpu("movement", "repeat_interleave"))
aten("copy.default", "movement", t("2,3,4", "3,4"), doc="src broadcast into self's shape and dtype", flops=no_flops,
     traffic=overwritten,
     webgpu=gpu("movement", "copy"))
aten("slice_scatter.default", "movement", t("4,6", "4,2", params={"dim": 1, "start": 1, "end": 5, "step": 2}),
     doc="self with a strided slice replaced by src (static positions)", flops=no_flops,
     webgpu=gpu("movement", "slice_scatter"))
aten("select_scatter.default", "movement", t("4,6", "6", params={"dim": 0, "index": 2}),
     doc="self with one index along a dim replaced by src", flops=no_flops, webgpu=gpu("movement", "select_scatter"))
aten("im2col.default", "movement", t("1,2,6,6", params={"kernel_size": [2, 2], "dilation": [1, 1], "padding": [0, 0],
                                                        "stride": [2, 2]}),
     doc="sliding windows as columns (unfold; MobileViT-V2)", flops=no_flops)
aten("col2im.default", "movement", t("1,8,9", params={"output_size": [6, 6], "kernel_size": [2, 2],
                                                      "dilation": [1, 1], "padding": [0, 0], "stride": [2, 2]}),
     doc="columns summed back into an image (fold; MobileViT-V2)", flops=per_output)
aten("embedding_bag.padding_idx", "movement",
     t("10,4", "6:int64:index:10", "2:int64:index:1",
       params={"scale_grad_by_freq": False, "mode": 2, "sparse": False, "per_sample_weights": None,
               "include_last_offset": False, "padding_idx": None}, weights=(0,)),
     doc="sums, means or maxima of bags of table rows (recommendation models); tested in max mode, whose "
         "auxiliary outputs the meta and CPU kernels size alike", flops=per_output, traffic=bagged)

# -- ops that stay on the host: data-dependent work an NPU has no unit for -------------------------------------------

_SCATTER = "a scatter to run-time positions (each element's destination is data), which NPUs run on the host"
for _name, _why in [
    ("histc.default", "a histogram: " + _SCATTER),
    ("index_put.default", "writes at run-time indices: " + _SCATTER),
    ("grid_sampler.default", "samples at run-time coordinates (a data-dependent gather with interpolation)"),
    ("grid_sampler_2d.default", "samples at run-time coordinates (a data-dependent gather with interpolation)"),
    ("nonzero.default", "its output size depends on the data"),
]:
    kernel(f"aten.{_name}", "host", "runs on the host CPU", host=_why)

# -- derived sets (read at call time, so a kernel added later is in them) ----------------------------------------

def all_kernels() -> frozenset[str]:
    """Kernels a program may contain (not deferred, not host-only)."""
    return frozenset(name for name, k in KERNELS.items() if k.deferred is None and k.host is None)


def kernels_where(**facts: Any) -> frozenset[str]:
    """Kernels whose record has all these field values: ``kernels_where(view=True)``, ``(layout="spatial")``."""
    return frozenset(name for name, k in KERNELS.items() if all(getattr(k, f) == v for f, v in facts.items()))


def kernels_for(backend: str) -> frozenset[str]:
    """The kernels ``backend`` implements (its own fast kernel, or the reference)."""
    return frozenset(name for name in all_kernels() if backend in KERNELS[name].impls)


def node_flops(op_type: str, ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    """FLOPs of a node or dispatch: its kernel record's formula, or that of the kernel it normalizes into
    (``aten_sources``); one per output element for an op with neither."""
    record = KERNELS.get(op_type) or next((k for k in KERNELS.values() if op_type in k.aten_sources), None)
    return (record.flops if record is not None else per_output)(ins, outs, params)


__all__ = [
    "ACTIVATIONS", "KERNEL_ALIASES", "KERNEL_DTYPES", "KERNELS", "REFERENCE", "KernelCost", "KernelDef", "KernelTest",
    "all_kernels", "get_kernel", "kernel", "kernels_for", "kernels_where", "node_flops", "t",
]
