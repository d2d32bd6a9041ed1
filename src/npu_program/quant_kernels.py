"""The kernel table's rows for the quantized NPU ops (``torch_ir.ops.npu_quant``): QUANTIZE, DEQUANTIZE, QCONV,
QGEMM, DQGEMM, QADD, QMUL, QMAXPOOL and QLUT, one :func:`kernel` record each. Loaded by :mod:`npu_program.kernels` after
``npu_kernels``.

Their parameters are the ops' attributes, as the IR holds them (plain strings for the code types: ``"int8"``,
``"int4"``; not the IR's tagged dtypes, which name torch dtypes only and 4-bit codes have none). The CPU backend runs
QCONV and QGEMM with native int8 kernels (``npu_runtime.backends.cpu_qconv``: 8-bit x, int8 weights, bit-exact;
any other case the op's reference), QADD, QMUL, QUANTIZE, DEQUANTIZE and QLUT with native elementwise kernels
(``npu_runtime.backends.cpu_qelementwise``: 8-bit codes per tensor or channel, bit-exact, QLUT's table computed by
its reference when the weights are bound; any other case the op's reference), QMAXPOOL natively
(``cpu_qpool``), DQGEMM through its reference (``torch_ir.quant.numerics``, REFERENCE). The WebGPU backend runs
QUANTIZE, DEQUANTIZE, QCONV, QGEMM, QADD, QMUL, QMAXPOOL and QLUT as WGSL (``webgpu/quant.py``,
``webgpu/contraction/qcontraction.py``: 8-bit codes, bit-exact); DQGEMM and the 4/16-bit and fp8 cases it refuses
at compile time, or places on the host with ``compile(fallback="cpu")``. The FLOPs are those of the integer
convolution or matrix product (a multiply-add counts two, as every contraction of the table); the requantize
epilogue is not counted, as a CONV's activation is not; QADD, QMUL and QLUT count one operation per output element,
as an elementwise add (a QLUT's table of 256 codes is made once, when the weights are bound). The bytes come from each
tensor's dtype, so a packed int4 weight counts half a byte per element (``torch_ir.dtypes.nbytes``).
"""

from __future__ import annotations

from .array_mapping import conv_mapping, gemm_mapping
from .cost_formulas import conv_flops, conv_traffic, gemm_flops, reduce_flops
from .kernel_record import ACTIVATIONS, CPU_QCONV, CPU_QELEMENTWISE, CPU_QPOOL, FLOATS, REFERENCE, gpu, kernel, t
from .params import Param, p

#: The integer code types of the quantized ops (4-bit ones travel packed two per byte, as uint8 storage).
INT_CODES = ("int8", "uint8", "int16", "uint16", "int4", "uint4")
#: The float8 code types (no zero point).
FP8_CODES = ("float8_e4m3fn", "float8_e5m2")
#: The dtypes the quantized kernels read and write: float activations and scales, codes, int32 biases and
#: accumulators; PyTorch's float64 scales and int64 zero points (PT2E) as they are. A target must run them too
#: (``npu_compiler.library.Target.dtypes``).
QUANT_DTYPES = FLOATS | frozenset(INT_CODES) | frozenset(FP8_CODES) | {"int32", "float64", "int64"}
_WEIGHT_CODES = ("int8", "uint8", "int4", "uint4")
_OUT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "float32")
_FLOAT_NAMES = tuple(sorted(FLOATS))

_GRAN = (p("axis", "int|null", None, "the dimension a per-channel or per-group scale runs along (null: one "
                                     "scale for the tensor)"),
         p("group_size", "int|null", None, "elements per scale along axis (null: per channel)"))


def _epilogue() -> tuple[Param, ...]:
    return (p("w_dtype", "str", "int8", "the weight codes' type", choices=_WEIGHT_CODES),
            p("has_bias", "bool", False, "an int32 bias at scale x_scale·w_scale follows w_zero_point"),
            p("out_dtype", "str", "int8", "y's type: a code type (requantized with y_scale and y_zero_point, the "
                                          "last two inputs), int32 (the accumulators) or float32 (accumulators "
                                          "times x_scale·w_scale)", choices=_OUT_DTYPES),
            p("activation", "str|null", None, "null or relu (fused: codes below y's zero point are raised to it)",
              choices=("relu",)))


# a test record's inputs: uint8 activations, int8 weights (symmetric), per-channel float scales
_QX, _W = "1,3,6,6:uint8:index:256", "4,3,3,3:int8"
_SCALES = (":float32:positive", ":uint8:index:256", "4:float32:positive", "4:int8:index:1")
_CONV = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1}

kernel("QUANTIZE", "elementwise", "q = saturate(round_half_even(x / scale) + zero_point): floats to codes (4-bit ones "
       "packed), per tensor, channel or group", dtypes=QUANT_DTYPES,
       params=(p("dtype", "str", doc="the codes' type", choices=INT_CODES + FP8_CODES), *_GRAN,
               p("method", "str", "divide", "divide (x / scale: ONNX) or multiply_inverse (x · (1/scale): "
                                            "PyTorch)", choices=("divide", "multiply_inverse")),
               p("qmin", "int|null", None, "smallest code (null: the type's)"),
               p("qmax", "int|null", None, "largest code (null: the type's)")),
       impls={"cpu": f"{CPU_QELEMENTWISE}:Quantize", "webgpu": gpu("quant", "quantize")},
       test=(t("2,3,8", ":positive", ":uint8:index:256", params={"dtype": "uint8"}, dtypes=_FLOAT_NAMES),
             t("4,8", "4,2:positive", params={"dtype": "int4", "axis": 1, "group_size": 4}),
             t("3,8", "3:positive", params={"dtype": "int8", "axis": 0, "method": "multiply_inverse",
                                            "qmin": -127, "qmax": 127})))
kernel("DEQUANTIZE", "elementwise", "x = (q - zero_point) · scale, in float32, cast to out_dtype",
       dtypes=QUANT_DTYPES,
       params=(p("dtype", "str", doc="the codes' type (as QUANTIZE's, or int32: a bias)",
                 choices=(*INT_CODES, "int32", *FP8_CODES)), *_GRAN,
               p("out_dtype", "str", "float32", "the float type of x", choices=_FLOAT_NAMES)),
       impls={"cpu": f"{CPU_QELEMENTWISE}:Dequantize", "webgpu": gpu("quant", "dequantize")},
       test=(t("2,3,8:uint8:index:256", ":float32:positive", ":uint8:index:256", params={"dtype": "uint8"}),
             t("4,4:uint8:index:256", "4,2:float32:positive", "4,2:uint8:index:16",
               params={"dtype": "uint4", "axis": 1, "group_size": 4, "out_dtype": "bfloat16"})))
kernel("QCONV", "contraction", "y = requantize(Σ (x - x_zp)(w - w_zp) + bias): a convolution of integer codes with "
       "int32 accumulation (ONNX QLinearConv, ConvInteger)", flops=conv_flops, traffic=conv_traffic,
       array=conv_mapping, dtypes=QUANT_DTYPES, bias_index=6,
       params=(p("stride", "ints", doc="per spatial dim"), p("padding", "ints", doc="per spatial dim (symmetric)"),
               p("dilation", "ints", doc="per spatial dim"), p("groups", "int", 1, "channel groups"), *_epilogue()),
       impls={"cpu": f"{CPU_QCONV}:QConv", "webgpu": gpu("contraction", "qconv")},
       test=(t(_QX, _W, *_SCALES, ":float32:positive", ":uint8:index:256", weights=(1, 2, 3, 4, 5, 6, 7),
               params={**_CONV, "w_dtype": "int8", "out_dtype": "uint8", "activation": "relu"}),
             t(_QX, _W, *_SCALES, "4:int32", weights=(1, 2, 3, 4, 5, 6),
               params={**_CONV, "has_bias": True, "out_dtype": "float32"})))
kernel("QGEMM", "contraction", "y = requantize(Σ (x - x_zp)(w - w_zp) + bias): a matrix product of integer codes "
       "with int32 accumulation (ONNX QLinearMatMul, MatMulInteger, QGemm)", flops=gemm_flops, array=gemm_mapping,
       dtypes=QUANT_DTYPES, bias_index=6,
       params=(p("trans_b", "bool", True, "w is [N,K] (a linear layer) rather than [...,K,N] (a matmul)"),
               *_epilogue()),
       impls={"cpu": f"{CPU_QCONV}:QGemm", "webgpu": gpu("contraction", "qgemm")},
       test=(t("2,5,16:int8", "8,16:int8", ":float32:positive", ":int8:index:1", "8:float32:positive",
               "8:int8:index:1", "8:int32", ":float32:positive", ":int8:index:3", weights=(1, 2, 3, 4, 5, 6, 7, 8),
               params={"has_bias": True, "out_dtype": "int8"}),
             t("2,16:uint8:index:256", "16,8:uint8:index:256", ":float32:positive", ":uint8:index:256",
               ":float32:positive", ":uint8:index:256", weights=(1, 2, 3, 4, 5),
               params={"trans_b": False, "w_dtype": "uint8", "out_dtype": "int32"})))
kernel("DQGEMM", "contraction", "y = act(x · dequantize(w)ᵀ + bias): a weight-only quantized linear layer (w8a16, "
       "w4a16 in groups, ONNX MatMulNBits)", flops=gemm_flops, array=gemm_mapping, dtypes=QUANT_DTYPES,
       bias_index=4,
       params=(p("trans_b", "bool", True, "w is [N,K] (a linear layer) rather than [K,N]"),
               p("w_dtype", "str", "int8", "the weight codes' type", choices=_WEIGHT_CODES + FP8_CODES),
               p("axis", "int|null", 0, "the weight dim its scales run along (0: per output channel; 1 with "
                                        "group_size: per group of K)"),
               p("group_size", "int|null", None, "elements per scale along axis (null: per channel)"),
               p("has_zero_point", "bool", False, "a weight zero point follows w_scale"),
               p("has_bias", "bool", False, "a float bias comes last"),
               p("activation", "str|null", None, f"null or one of {', '.join(ACTIVATIONS)}: applied to the result",
                 choices=ACTIVATIONS)),
       impls={"cpu": REFERENCE},
       test=(t("2,5,16", "8,16:int8", "8:positive", "8", weights=(1, 2, 3), params={"has_bias": True},
               dtypes=_FLOAT_NAMES),
             t("3,16", "8,8:uint8:index:256", "8,2:positive", "8,2:uint8:index:16", weights=(1, 2, 3),
               params={"w_dtype": "uint4", "axis": 1, "group_size": 8, "has_zero_point": True,
                       "activation": "relu"})))

_ADD_CODES = ("int8", "uint8")
kernel("QADD", "elementwise", "y = quantize(act(dequantize(a) + dequantize(b))): a quantized residual add with its "
       "own requantize, the QDQ chain's float32 steps (onnxruntime QLinearAdd)", dtypes=QUANT_DTYPES,
       params=(p("out_dtype", "str", "int8", "y's code type", choices=_ADD_CODES),
               p("activation", "str|null", None, "null or relu (applied to the float32 sum)", choices=("relu",)),
               p("method", "str", "divide", "divide (the sum / y_scale: ONNX) or multiply_inverse (PyTorch)",
                 choices=("divide", "multiply_inverse"))),
       impls={"cpu": f"{CPU_QELEMENTWISE}:QAdd", "webgpu": gpu("quant", "qadd")},
       test=(t("2,3,5,7:uint8:index:256", ":float32:positive", ":uint8:index:256", "2,3,5,7:uint8:index:256",
               ":float32:positive", ":uint8:index:256", ":float32:positive", ":uint8:index:256",
               params={"out_dtype": "uint8", "activation": "relu"}),
             t("3,37:int8", ":float32:positive", ":int8:index:1", "3,37:uint8:index:256", ":float32:positive",
               ":uint8:index:256", ":float32:positive", ":int8:index:1", params={"out_dtype": "int8"})))
kernel("QMUL", "elementwise", "y = quantize(dequantize(a) · dequantize(b)): a quantized elementwise product with its "
       "own requantize, the QDQ chain's float32 steps (onnxruntime QLinearMul; a QDQ BERT's GELU)",
       dtypes=QUANT_DTYPES,
       params=(p("out_dtype", "str", "int8", "y's code type", choices=_ADD_CODES),
               p("method", "str", "divide", "divide (the product / y_scale: ONNX) or multiply_inverse (PyTorch)",
                 choices=("divide", "multiply_inverse"))),
       impls={"cpu": f"{CPU_QELEMENTWISE}:QMul", "webgpu": gpu("quant", "qmul")},
       test=(t("2,3,5,7:uint8:index:256", ":float32:positive", ":uint8:index:256", "2,3,5,7:uint8:index:256",
               ":float32:positive", ":uint8:index:256", ":float32:positive", ":uint8:index:256",
               params={"out_dtype": "uint8"}),
             t("3,37:int8", ":float32:positive", ":int8:index:1", "37:uint8:index:256", ":float32:positive",
               ":uint8:index:256", ":float32:positive", ":int8:index:1",
               params={"out_dtype": "int8", "method": "multiply_inverse"})))
kernel("QMAXPOOL", "pooling", "y = quantize(max_pool2d(dequantize(x))): a max pool of codes with its own "
       "requantize, the QDQ chain's float32 steps (a QDQ CNN's stem pool)", dtypes=QUANT_DTYPES,
       flops=reduce_flops, layout="spatial",
       params=(p("kernel_size", "ints", doc="[kh, kw]"), p("stride", "ints", doc="[sh, sw]"),
               p("padding", "ints", doc="[ph, pw], implicit -inf"), p("dilation", "ints", doc="[dh, dw]"),
               p("ceil_mode", "bool", False, "torch's ceil_mode: partial last windows"),
               p("out_dtype", "str", "int8", "y's code type", choices=_ADD_CODES),
               p("method", "str", "divide", "divide (the pooled value / y_scale: ONNX) or multiply_inverse "
                                            "(PyTorch)", choices=("divide", "multiply_inverse"))),
       impls={"cpu": f"{CPU_QPOOL}:QMaxPool", "webgpu": gpu("quant", "qmaxpool")},
       test=(t("1,3,9,9:uint8:index:256", ":float32:positive", ":uint8:index:256", ":float32:positive",
               ":uint8:index:256", weights=(1, 2, 3, 4),
               params={"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1],
                       "out_dtype": "uint8"}),
             t("2,2,7,8:int8", ":float32", ":int8:index:1", ":float32:positive", ":int8:index:3",
               weights=(1, 2, 3, 4),
               params={"kernel_size": [2, 3], "stride": [2, 1], "padding": [1, 1], "dilation": [2, 1],
                       "ceil_mode": True, "out_dtype": "int8", "method": "multiply_inverse"})))
kernel("QLUT", "elementwise", "y = table[x], table[c] = quantize(steps(dequantize(c))): a quantized elementwise "
       "chain (GELU's erf, an attention scale) as a lookup table over the 256 codes", dtypes=QUANT_DTYPES,
       params=(p("functions", "str", doc="the chain's float32 steps in order, names separated by spaces "
                                         "(torch_ir.quant.lut.STEPS)"),
               p("numbers", "floats", doc="the numbers of the steps that take one (mul, add, sub, div), in order"),
               p("out_dtype", "str", "int8", "y's code type", choices=_ADD_CODES),
               p("method", "str", "divide", "divide (the chain's value / y_scale: ONNX) or multiply_inverse "
                                            "(PyTorch)", choices=("divide", "multiply_inverse"))),
       impls={"cpu": f"{CPU_QELEMENTWISE}:QLut", "webgpu": gpu("quant", "qlut")},
       test=(t("2,3,5,7:uint8:index:256", ":float32:positive", ":uint8:index:256", ":float32:positive",
               ":uint8:index:256", weights=(1, 2, 3, 4),
               params={"functions": "mul erf", "numbers": [0.7071067932881648], "out_dtype": "uint8"}),
             t("3,37:int8", ":float32:positive", ":int8:index:1", ":float32:positive", ":uint8:index:256",
               weights=(1, 2, 3, 4), params={"functions": "gelu add sigmoid", "numbers": [-0.5],
                                             "out_dtype": "uint8", "method": "multiply_inverse"})))
