"""Every fact about a kernel is a field of its record (``npu_program.kernels``) or a row of the activation table
(``torch_ir.activations``), and what is declared twice is kept in agreement here: an NPU op's attributes and its
kernel's parameters, the bias index and the op's inputs, the activation table and each backend's form of it."""

from __future__ import annotations

import pytest
import torch

from npu_compiler.passes.fusion import ACTIVATION_RULES
from npu_program import kernels as kernel_table
from npu_program.kernels import KERNEL_ALIASES, KERNELS, kernels_where
from npu_program.program import Dispatch
from npu_runtime.backends import cpu_activation
from npu_runtime.backends.webgpu.wgsl import activation as wgsl_activation
from torch_ir.activations import ACTIVATIONS, ATEN_ACTIVATION_OPS, activation_of, apply_activation
from torch_ir.ops.npu import NPU_OPS

#: Parameters a kernel has that its NPU op does not: set by the compiler, never by a rewrite rule.
KERNEL_ONLY_PARAMS = {"CONV": {"inplace_residual"}}
#: Contractions the cost model runs at the array's peak rate, for want of a mapping (flagged in its report).
UNMAPPED_CONTRACTIONS = {"aten.einsum.default", "aten.conv_transpose2d.input"}


# -- an NPU op and its kernel ------------------------------------------------------------------------------------

def test_every_npu_op_is_a_kernel_and_every_named_kernel_an_npu_op():
    npu_kernels = {name for name, k in KERNELS.items() if not name.startswith("aten.")}
    assert set(NPU_OPS) == npu_kernels


@pytest.mark.parametrize("name", sorted(NPU_OPS))
def test_an_npu_ops_attributes_are_its_kernels_parameters_less_the_kernel_only_ones(name):
    params, attrs = set(KERNELS[name].params), set(NPU_OPS[name].attrs)
    kernel_only = KERNEL_ONLY_PARAMS.get(name, set())
    assert kernel_only <= params, f"{name}: KERNEL_ONLY_PARAMS names {kernel_only - params}, not parameters"
    assert attrs == params - kernel_only, (
        f"{name}: attributes only in torch_ir.ops.npu {sorted(attrs - params)}, parameters only in "
        f"npu_program.kernels {sorted(params - attrs - kernel_only)} (a kernel-only one goes in KERNEL_ONLY_PARAMS)")


@pytest.mark.parametrize("name", sorted(n for n, k in KERNELS.items() if "has_bias" in k.params))
def test_a_kernel_with_has_bias_says_where_its_bias_is(name):
    """``bias_index`` (lowering tells ``has_bias`` from the input count with it) is where the op's inputs put the
    first bias."""
    record = KERNELS[name]
    inputs = [i.rstrip("?") for i in NPU_OPS[name].inputs]
    first_bias = next(i for i, n in enumerate(inputs) if n == "bias" or n.startswith("b_"))
    assert record.bias_index == first_bias


def test_no_kernel_without_has_bias_declares_a_bias_index():
    assert all(k.bias_index is None for k in KERNELS.values() if "has_bias" not in k.params)


def test_every_contraction_has_an_array_mapping_or_is_listed_as_unmapped():
    contractions = {n for n, k in KERNELS.items() if k.kind == "contraction"}
    unmapped = {n for n in contractions if KERNELS[n].array is None}
    assert unmapped == UNMAPPED_CONTRACTIONS
    assert KERNELS["GATE_UP"].array is not None  # a fused contraction maps too


def test_only_the_kv_cache_write_writes_state():
    assert kernels_where(writes_state=True) == {"KV_UPDATE", "KVQ_UPDATE"}  # a float and a quantized cache


def test_node_flops_of_an_aten_convolution_are_convs():
    conv = KERNELS["CONV"]
    assert set(conv.aten_sources) == {"aten.conv2d.default", "aten.convolution.default"}
    sources = [s for k in KERNELS.values() for s in k.aten_sources]
    assert len(sources) == len(set(sources)), "an ATen op normalizes into one kernel"


# -- CONV's residual ------------------------------------------------------------------------------------------

def test_conv_add_is_no_kernel_only_a_read_alias():
    assert "CONV_ADD" not in KERNELS and "CONV_ADD" not in NPU_OPS
    kernel, params = KERNEL_ALIASES["CONV_ADD"]
    assert kernel == "CONV" and params == {"has_residual": True}
    read = Dispatch("CONV_ADD", "c", ["x", "w", "r"], ["y"], {"activation": "relu", "inplace_residual": True})
    assert read.kernel == "CONV"
    assert read.params == {"activation": "relu", "inplace_residual": True, "has_residual": True}


# -- the activation table ---------------------------------------------------------------------------------------

def test_the_kernel_table_and_the_op_docs_name_the_table_s_activations():
    assert kernel_table.ACTIVATIONS == tuple(ACTIVATIONS)
    for name in ("GEMM", "CONV"):
        doc = NPU_OPS[name].attrs["activation"]
        assert all(a in doc for a in ACTIVATIONS), doc


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_each_aten_form_of_an_activation_is_recognized_and_fused(name):
    row = ACTIVATIONS[name]
    patterns = {op for rule in ACTIVATION_RULES for op in rule.pattern.op_types}
    assert patterns == set(ATEN_ACTIVATION_OPS)
    for form in row.aten:
        attrs = {k: v[0] for k, v in form.attrs.items()}
        assert activation_of(form.op_type, attrs) == name


def test_an_aten_op_with_other_attributes_is_no_activation():
    assert activation_of("aten.hardtanh.default", {"min_val": -1.0, "max_val": 1.0}) is None
    assert activation_of("aten.clamp.default", {"min": 0.0, "max": None}) is None
    assert activation_of("aten.gelu.default", {}) == "gelu"


def _probe() -> torch.Tensor:
    """Values every form must treat as the reference does: NaN, infinities, signed zeros, both signs, past 6."""
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 6.0, 7.5, -3.0, 1e-30])
    return torch.cat([special, torch.randn(64, generator=torch.Generator().manual_seed(0)) * 4])


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_each_activation_propagates_nan_as_eager_torch_does(name):
    assert ACTIVATIONS[name].propagates_nan
    assert torch.isnan(apply_activation(name, torch.tensor([float("nan")]))).all()


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_the_cpu_backend_applies_each_activation_bit_for_bit_as_the_reference(name):
    x = _probe()
    want = ACTIVATIONS[name].reference(x)
    in_place = x.clone()
    cpu_activation.apply_activation_(in_place, name)
    stored = torch.empty_like(x)
    cpu_activation.store(stored, x, name)
    for got in (in_place, stored):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert name in cpu_activation.MKLDNN_ACTIVATIONS  # the CPU convolution accepts it


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_the_webgpu_backend_reads_each_activation_from_the_table(name):
    assert wgsl_activation(name, "v") == ACTIVATIONS[name].wgsl.format(x="v")
    # no max/min/clamp of the value itself: WGSL lets them return either operand for NaN
    assert not any(f"{fn}(v" in wgsl_activation(name, "v") for fn in ("max", "min", "clamp"))


def test_the_standalone_relu_kernel_and_the_fused_relu_are_one_form():
    assert KERNELS["aten.relu.default"].wgsl == ACTIVATIONS["relu"].wgsl.format(x="x0")
    assert wgsl_activation(None, "v") == "v"
