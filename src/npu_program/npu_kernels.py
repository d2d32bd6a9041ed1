"""The kernel table's rows for the NPU ops (``torch_ir.ops.npu``): one :func:`kernel` record each. Loaded by
:mod:`npu_program.kernels`, before the ATen rows (``aten_kernels``), which is the table's order.
"""

from __future__ import annotations

from .array_mapping import (
    attention_mapping,
    attn_output_mapping,
    attn_score_mapping,
    conv_mapping,
    gate_up_mapping,
    gemm_mapping,
    qkv_mapping,
)
from .cost_formulas import (
    attention_flops,
    attn_score_flops,
    cache_update,
    conv_flops,
    conv_traffic,
    gate_up_flops,
    gathered,
    gemm_flops,
    matmul_flops,
    no_flops,
    qkv_flops,
)
from .kernel_record import ACTIVATIONS, FLOATS, REFERENCE, gpu, kernel, t
from .kernel_record import CPU_BLOCKS as _CPU_BLOCKS
from .kernel_record import CPU_KERNELS as _CPU
from .kernel_record import CPU_TRANSFORMER as _CPU_TRANSFORMER
from .kernel_record import GPU_ELEMENTWISE as _EW
from .kernel_record import HALF as _HALF
from .params import Param, p

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


_CONV_PARAMS = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1}

# -- NPU ops ------------------------------------------------------------------------------------------------

#: llama.cpp's quantized activations for a contraction over block-quantized weights (set by
#: ``npu_compiler.llm.with_block_weights``): the op's ``x_int8_group`` attribute.
_X_INT8 = p("x_int8_group", "int|null", None, "null, or x rounded to int8 in groups of this many along K before the "
            "product (scale max|x|/127 per group): llama.cpp's quantized activations")
kernel("GEMM", "contraction", "y = act(x · w(ᵀ) + bias [+ residual])", flops=gemm_flops, array=gemm_mapping,
       bias_index=2,
       params=(p("trans_a", "bool", False, "x's last two dims are transposed"),
               p("trans_b", "bool", True, "w is [N, K] (nn.Linear)"), p("has_bias", "bool", doc=_HAS_BIAS),
               p("has_residual", "bool", False, "a residual activation of y's shape is the last input, added "
                                                "before the activation (inputs [x, w, bias?, residual])"),
               _activation(), _X_INT8),
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
                                               "transpose done by the kernel's store) rather than [B, T, width]"),
               _X_INT8),
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
                                                        "inputs when the IR leaves it out)"), _X_INT8),
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
       traffic=gathered, impls={"cpu": f"{_CPU_BLOCKS}:BlockEmbedding",
                                "webgpu": gpu("transformer", "embedding")},
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
