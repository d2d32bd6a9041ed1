"""The kernel table's rows for ATen ops an NPU runs as they are, and for ops that stay on the host: one record
each. Loaded by :mod:`npu_program.kernels` after the NPU ops' rows.
"""

from __future__ import annotations

from typing import Any

from torch_ir.activations import ACTIVATIONS as ACTIVATION_TABLE

from .array_mapping import (
    baddbmm_mapping,
    matmul_mapping,
)
from .aten_params import ATEN_PARAMS
from .cost_formulas import (
    baddbmm_flops,
    bagged,
    conv_transpose_flops,
    einsum_flops,
    gathered,
    matmul_flops,
    no_flops,
    overwritten,
    per_output,
    reduce_flops,
    whole,
)
from .kernel_record import CPU_KERNELS as _CPU
from .kernel_record import FLOATS, REFERENCE, KernelTest, gpu, kernel, t
from .kernel_record import GPU_ELEMENTWISE as _EW
from .kernel_record import HALF as _HALF

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
