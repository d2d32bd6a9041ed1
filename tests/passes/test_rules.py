"""One small graph per normalization rule: the exact ops afterwards, the rule recorded, same numbers.

Expected op lists are written from each rule's documented rewrite. Numerics compare the IR before
and after ``normalize`` on the reference executor with real seeded weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

import torch_ir
from npu_compiler.passes import ALL_RULES, FAMILIES, NormalizeOptions, QConfig, normalize
from torch_ir.ir import NPU_IR, OpNode, Provenance, TensorMeta, check_integrity

from ..helpers import Fn, build_pair


def applied(ir: NPU_IR) -> dict[str, int]:
    counts: dict[str, int] = {}
    for stage in ir.metadata["normalize"]["stages"]:
        for rule, n in stage["applied"].items():
            counts[rule] = counts.get(rule, 0) + n
    return counts


def rejected(ir: NPU_IR) -> list[tuple[str, str, str]]:
    return [tuple(r) for stage in ir.metadata["normalize"]["stages"] for r in stage["rejected"]]


def ops(ir: NPU_IR) -> list[str]:
    return [n.op_type for n in ir.nodes]


def same_numbers(before: NPU_IR, after: NPU_IR, weights, inputs) -> None:
    want = torch_ir.IRExecutor(before, weights).run(list(inputs))
    got = torch_ir.IRExecutor(after, weights).run(list(inputs))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def check_module(factory: Callable[[], nn.Module], inputs: tuple, expected: list[str], rules: list[str],
                 options: NormalizeOptions | None = None) -> NPU_IR:
    meta, real = build_pair(factory)
    ir = torch_ir.extract_ir(meta, inputs)
    out = normalize(ir, options)
    assert ops(out) == expected
    done = applied(out)
    for rule in rules:
        assert done.get(rule, 0) > 0, f"{rule} not applied: {done}"
    check_integrity(out)
    same_numbers(ir, out, real.state_dict(), inputs)
    return out


def t(name: str, shape: list[int], dtype: str = "float32") -> TensorMeta:
    return TensorMeta(name, shape, dtype)


def check_hand_made(ir: NPU_IR, weights: dict[str, torch.Tensor], inputs: list[torch.Tensor], expected: list[str],
                    rules: list[str]) -> NPU_IR:
    check_integrity(ir)
    out = normalize(ir)
    assert ops(out) == expected
    done = applied(out)
    for rule in rules:
        assert done.get(rule, 0) > 0, f"{rule} not applied: {done}"
    check_integrity(out)
    same_numbers(ir, out, weights, inputs)
    return out


# -- clean-up and folding ------------------------------------------------------------------------------

def test_identity():
    check_module(lambda: Fn(lambda s, x: x.contiguous().clone().view(2, 3, 4).relu()), (torch.randn(2, 3, 4),),
                 ["aten.relu.default"], ["identity"])


def test_arith_identity():
    check_module(lambda: Fn(lambda s, x: ((x + 0) * 1).relu()), (torch.randn(2, 3, 4),),
                 ["aten.relu.default"], ["arith_identity"])


def test_fold_constants():
    check_module(lambda: Fn(lambda s, x: x + torch.arange(4, device=x.device).float() * 2), (torch.randn(2, 3, 4),),
                 ["aten.add.Tensor"], ["fold_constants"])


# -- canonicalization ------------------------------------------------------------------------------------

def test_view_to_reshape_and_reshape_of_reshape():
    check_module(lambda: Fn(lambda s, x: x.unsqueeze(0).flatten(0, 1).view(6, 4).relu()), (torch.randn(2, 3, 4),),
                 ["aten.reshape.default", "aten.relu.default"], ["view_to_reshape", "reshape_of_reshape"])


def test_transpose_to_permute_and_permute_of_permute():
    check_module(lambda: Fn(lambda s, x: x.transpose(1, 2).transpose(0, 1).relu()), (torch.randn(2, 3, 4),),
                 ["aten.permute.default", "aten.relu.default"], ["transpose_to_permute", "permute_of_permute"])


def test_flattened_transpose_onnx_spelling():
    x, w = t("x", [2, 3, 4, 5]), t("w", [2, 3, 5, 4])
    flat, perm, back = t("flat", [6, 4, 5]), t("perm", [6, 5, 4]), t("back", [2, 3, 5, 4])
    y = t("y", [2, 3, 5, 4])
    ir = NPU_IR("flattened_transpose", [x], [y], [w], [
        OpNode("flat", "aten.reshape.default", [x], [flat], {"shape": [6, 4, 5]}),
        OpNode("perm", "aten.permute.default", [flat], [perm], {"dims": [0, 2, 1]}),
        OpNode("back", "aten.reshape.default", [perm], [back], {"shape": [2, 3, 5, 4]}),
        OpNode("y", "aten.add.Tensor", [back, w], [y], {}),
    ])
    torch.manual_seed(0)
    out = check_hand_made(ir, {"w": torch.randn(2, 3, 5, 4)}, [torch.randn(2, 3, 4, 5)],
                          ["aten.permute.default", "aten.add.Tensor"], ["flattened_transpose", "identity"])
    # x is already [..., a, b]: the un-flattening reshape is an identity, only the swap is left
    assert out.nodes[0].inputs[0].name == "x" and out.nodes[0].attrs["dims"] == [0, 1, 3, 2]


def test_scalar_operand_module():
    def fn(s, x):
        return (x + torch.full((1,), 3.0, device=x.device)) * torch.full((1,), 2.0, device=x.device)

    out = check_module(lambda: Fn(fn), (torch.randn(2, 3, 4),), ["aten.add.Tensor", "aten.mul.Tensor"],
                       ["scalar_operand", "fold_constants"])
    assert [n.attrs["other"] for n in out.nodes] == [3.0, 2.0]
    assert all(len(n.inputs) == 1 for n in out.nodes)


def test_scalar_operand_pow_tensor_tensor():
    x, c, y = t("x", [2, 4]), t("c", [1]), t("y", [2, 4])
    ir = NPU_IR("pow", [x], [y], [], [OpNode("pow", "aten.pow.Tensor_Tensor", [x, c], [y], {})],
                constants=[c], constant_values={"c": [2.0]})
    out = check_hand_made(ir, {}, [torch.randn(2, 4)], ["aten.pow.Tensor_Scalar"], ["scalar_operand"])
    assert out.nodes[0].attrs["exponent"] == 2.0


def test_div_to_mul():
    out = check_module(lambda: Fn(lambda s, x: x / 4.0), (torch.randn(2, 3, 4),), ["aten.mul.Tensor"], ["div_to_mul"])
    assert out.nodes[0].attrs["other"] == 0.25


def test_cast():
    out = check_module(lambda: Fn(lambda s, x: x.to(torch.float16).relu()), (torch.randn(2, 3, 4),),
                       ["aten._to_copy.default", "aten.relu.default"], ["cast"])
    assert out.nodes[0].attrs == {"dtype": {"dtype": "float16"}}


def test_rsqrt_module():
    check_module(lambda: Fn(lambda s, x: torch.reciprocal(torch.sqrt(x.abs()))), (torch.randn(2, 3, 4),),
                 ["aten.abs.default", "aten.rsqrt.default"], ["rsqrt"])


def test_rsqrt_hand_made():
    x, s, r = t("x", [2, 4]), t("s", [2, 4]), t("r", [2, 4])
    ir = NPU_IR("rsqrt", [x], [r], [], [
        OpNode("sqrt", "aten.sqrt.default", [x], [s], {}),
        OpNode("reciprocal", "aten.reciprocal.default", [s], [r], {}),
    ])
    check_hand_made(ir, {}, [torch.rand(2, 4) + 0.5], ["aten.rsqrt.default"], ["rsqrt"])


def test_silu_both_orders():
    def fn(s, x):
        return x * torch.sigmoid(x) + torch.sigmoid(x) * x

    check_module(lambda: Fn(fn), (torch.randn(2, 3, 4),),
                 ["aten.silu.default", "aten.silu.default", "aten.add.Tensor"], ["silu", "silu_swapped"])


def test_global_avg_pool():
    out = check_module(lambda: Fn(lambda s, x: F.adaptive_avg_pool2d(x, 1)), (torch.randn(1, 2, 4, 4),),
                       ["aten.mean.dim"], ["global_avg_pool"])
    assert out.nodes[0].attrs["dim"] == [-2, -1] and out.nodes[0].attrs["keepdim"] is True


def test_mean_dims():
    out = check_module(lambda: Fn(lambda s, x: x.mean(dim=(2, 1), keepdim=True)), (torch.randn(2, 3, 4),),
                       ["aten.mean.dim"], ["mean_dims"])
    assert out.nodes[0].attrs["dim"] == [-2, -1]


# -- GEMM ------------------------------------------------------------------------------------------------

def test_linear():
    out = check_module(lambda: nn.Linear(4, 5), (torch.randn(2, 3, 4),), ["GEMM"], ["linear"])
    assert out.nodes[0].attrs["trans_b"] is True and len(out.nodes[0].inputs) == 3


def test_addmm():
    def factory():
        return Fn(lambda s, x: torch.addmm(s.b, x, s.w), w=nn.Parameter(torch.randn(4, 5)),
                  b=nn.Parameter(torch.randn(5)))

    out = check_module(factory, (torch.randn(3, 4),), ["GEMM"], ["addmm"])
    assert out.nodes[0].attrs["trans_b"] is False


def test_matmul_weight_and_bias_module():
    def factory():
        return Fn(lambda s, x: x @ s.w + s.b, w=nn.Parameter(torch.randn(4, 5)), b=nn.Parameter(torch.randn(5)))

    out = check_module(factory, (torch.randn(2, 3, 4),), ["GEMM"], ["matmul_weight", "gemm_bias"])
    assert len(out.nodes[0].inputs) == 3


def test_gemm_bias_first():
    def factory():
        return Fn(lambda s, x: s.b + x @ s.w, w=nn.Parameter(torch.randn(4, 5)), b=nn.Parameter(torch.randn(5)))

    check_module(factory, (torch.randn(2, 3, 4),), ["GEMM"], ["matmul_weight", "gemm_bias_first"])


def test_matmul_weight_plus_bias_hand_made():
    x, w, b = t("x", [3, 4]), t("w", [4, 5]), t("b", [5])
    mm, y = t("mm", [3, 5]), t("y", [3, 5])
    ir = NPU_IR("matmul_add", [x], [y], [w, b], [
        OpNode("matmul", "aten.matmul.default", [x, w], [mm], {}),
        OpNode("add", "aten.add.Tensor", [mm, b], [y], {}),
    ])
    torch.manual_seed(0)
    weights = {"w": torch.randn(4, 5), "b": torch.randn(5)}
    check_hand_made(ir, weights, [torch.randn(3, 4)], ["GEMM"], ["matmul_weight", "gemm_bias"])


def test_gemm_flattened():
    def factory():
        return Fn(lambda s, x: (x.reshape(6, 4) @ s.w).reshape(2, 3, 5), w=nn.Parameter(torch.randn(4, 5)))

    out = check_module(factory, (torch.randn(2, 3, 4),), ["GEMM"], ["matmul_weight", "gemm_flattened"])
    assert out.nodes[0].inputs[0].shape == [2, 3, 4]


def test_gemm_transposed_weight():
    out = check_module(lambda: Fn(lambda s, x: F.linear(x, s.w.t()), w=nn.Parameter(torch.randn(4, 5))),
                       (torch.randn(2, 3, 4),), ["GEMM"], ["transpose_to_permute", "linear", "gemm_transposed_weight"])
    assert out.nodes[0].attrs["trans_b"] is False


# -- LLM -------------------------------------------------------------------------------------------------

class Qkv(nn.Module):
    def __init__(self, v_bias: bool = True):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8, bias=v_bias)

    def forward(self, x):
        return [proj(x).view(2, 3, 2, 4) for proj in (self.q, self.k, self.v)]


class PackedQkv(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(8, 24)

    def forward(self, x):
        return [part.view(2, 3, 2, 4) for part in self.c_attn(x).split(8, dim=-1)]


RESHAPES = ["aten.reshape.default"] * 3


def test_qkv_proj():
    out = check_module(Qkv, (torch.randn(2, 3, 8),), ["QKV_PROJ", *RESHAPES], ["linear", "qkv_proj"])
    attrs = out.nodes[0].attrs
    assert attrs["packed"] is False and attrs["has_bias"] is True and attrs["num_heads"] == 2
    assert attrs["head_dim"] == 4


def test_qkv_proj_with_one_projection_without_bias_flags_each():
    """Whisper's k_proj has no bias: one QKV_PROJ still, with a bias flag per projection."""
    out = check_module(lambda: Qkv(v_bias=False), (torch.randn(2, 3, 8),), ["QKV_PROJ", *RESHAPES],
                       ["linear", "qkv_proj"])
    qkv = out.nodes[0]
    assert qkv.attrs["has_bias"] == [True, True, False]
    assert [t.name for t in qkv.inputs[4:]] == ["p_q_bias", "p_k_bias"]


class ScaledQuery(nn.Module):
    """Whisper's attention: the query projection scaled before the head split."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8, bias=False), nn.Linear(8, 8)

    def forward(self, x):
        heads = [proj(x) for proj in (self.q, self.k, self.v)]
        q, k, v = [t.view(2, 3, 2, 4).transpose(1, 2) for t in (heads[0] * 0.5, heads[1], heads[2])]
        return F.scaled_dot_product_attention(q, k, v, scale=1.0).transpose(1, 2).reshape(2, 3, 8)


def test_scaled_query_becomes_the_attention_scale_and_qkv_fuses():
    out = check_module(ScaledQuery, (torch.randn(2, 3, 8),), ["QKV_PROJ", "ATTENTION"],
                       ["attention_scaled_query", "qkv_proj", "qkv_heads_first", "heads_round_trip",
                        "attention_fused", "attention_merge_heads"])
    assert out.nodes[1].attrs["scale"] == 0.5 and out.nodes[1].attrs["merge_heads"] is True
    assert out.nodes[0].attrs["heads_first"] is True and out.nodes[0].attrs["has_bias"] == [True, False, True]


def test_qkv_proj_packed():
    out = check_module(PackedQkv, (torch.randn(2, 3, 8),), ["QKV_PROJ", *RESHAPES], ["qkv_proj_packed"])
    assert out.nodes[0].attrs["packed"] is True and out.nodes[0].attrs["splits"] == [8, 8, 8]


def test_rms_norm():
    def factory():
        return Fn(lambda s, x: s.w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)),
                  w=nn.Parameter(torch.randn(4)))

    out = check_module(factory, (torch.randn(2, 3, 4),), ["RMS_NORM"], ["rms_norm"])
    assert out.nodes[0].attrs["eps"] == pytest.approx(1e-6)


def test_silu_gate_both_orders():
    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    check_module(lambda: Fn(lambda s, a, b: F.silu(a) * b + b * F.silu(a)), (x, y),
                 ["SILU_GATE", "SILU_GATE", "aten.add.Tensor"], ["silu_gate", "silu_gate_swapped"])


def _rotate_half(x):
    return torch.cat((-x[..., 2:], x[..., :2]), dim=-1)


def test_rope():
    args = (torch.randn(1, 2, 3, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))
    check_module(lambda: Fn(lambda s, x, cos, sin: x * cos + _rotate_half(x) * sin), args, ["ROPE"], ["rope"])


def test_kv_update():
    args = (torch.randn(1, 4, 2), torch.tensor([1, 2]), torch.randn(1, 2, 2))
    out = check_module(lambda: Fn(lambda s, cache, pos, new: torch.index_copy(cache, 1, pos, new)), args,
                       ["KV_UPDATE"], ["kv_update"])
    assert out.nodes[0].attrs["dim"] == 1


# -- attention -------------------------------------------------------------------------------------------

def _sdpa(s, q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


QKV_ARGS = (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))


def test_sdpa():
    check_module(lambda: Fn(_sdpa), QKV_ARGS, ["ATTENTION"], ["sdpa", "attention_fused"])


def test_sdpa_without_the_fused_attention_keeps_score_and_output():
    check_module(lambda: Fn(_sdpa), QKV_ARGS, ["ATTN_SCORE", "ATTN_OUTPUT"], ["sdpa"],
                 NormalizeOptions(disabled_rules={"attention_fused"}))


def _attention_returning_probabilities(s, q, k, v):
    p = torch.softmax(q @ k.transpose(-1, -2) * 0.5, -1)
    return p @ v, p


def test_attention_whose_probabilities_are_read_stays_two_ops():
    out = check_module(lambda: Fn(_attention_returning_probabilities), QKV_ARGS, ["ATTN_SCORE", "ATTN_OUTPUT"],
                       ["attention_score", "attention_output"])
    assert "attention_fused" not in applied(out)


def test_disable_attention_keeps_sdpa():
    out = check_module(lambda: Fn(_sdpa), QKV_ARGS, ["aten.scaled_dot_product_attention.default"], [],
                       NormalizeOptions(disable={"attention"}))
    assert "sdpa" not in applied(out)


def test_unknown_family_is_a_value_error_naming_the_families():
    with pytest.raises(ValueError, match="bogus") as info:
        NormalizeOptions(disable={"bogus"})
    for family in FAMILIES:
        assert family in str(info.value)


def _eager_attention(s, q, k, v, mask):
    p = torch.softmax(q @ k.transpose(-1, -2) * 0.5 + mask, -1)
    return (p @ v).transpose(1, 2).reshape(1, 3, 8)


def test_attention_score_output_merge_heads():
    out = check_module(lambda: Fn(_eager_attention), (*QKV_ARGS, torch.randn(1, 1, 3, 3)), ["ATTENTION"],
                       ["attention_score", "attention_output", "attention_fused", "attention_merge_heads"])
    attention = out.nodes[0]
    assert attention.attrs == {"scale": 0.5, "causal": False, "merge_heads": True}
    assert [t.name for t in attention.inputs] == [t.name for t in out.graph_inputs]  # q, k, v, mask


def test_attention_score_output_merge_heads_unfused():
    out = check_module(lambda: Fn(_eager_attention), (*QKV_ARGS, torch.randn(1, 1, 3, 3)),
                       ["ATTN_SCORE", "ATTN_OUTPUT"],
                       ["attention_score", "attention_output", "attention_merge_heads"],
                       NormalizeOptions(disabled_rules={"attention_fused"}))
    assert out.nodes[0].attrs["scale"] == 0.5 and len(out.nodes[0].inputs) == 3
    assert out.nodes[1].attrs["merge_heads"] is True


def test_attention_nan_guard_hand_made():
    q, k, v = t("q", [1, 2, 3, 4]), t("k", [1, 2, 3, 4]), t("v", [1, 2, 3, 4])
    kt, s, p = t("kt", [1, 2, 4, 3]), t("s", [1, 2, 3, 3]), t("p", [1, 2, 3, 3])
    nan, zero, g, o = t("nan", [1, 2, 3, 3], "bool"), t("zero", []), t("g", [1, 2, 3, 3]), t("o", [1, 2, 3, 4])
    ir = NPU_IR("nan_guard", [q, k, v], [o], [], [
        OpNode("kt", "aten.permute.default", [k], [kt], {"dims": [0, 1, 3, 2]}),
        OpNode("s", "aten.matmul.default", [q, kt], [s], {}),
        OpNode("p", "aten.softmax.int", [s], [p], {"dim": -1}),
        OpNode("nan", "aten.isnan.default", [p], [nan], {}),
        OpNode("g", "aten.where.self", [nan, zero, p], [g], {}),
        OpNode("o", "aten.matmul.default", [g, v], [o], {}),
    ], constants=[zero], constant_values={"zero": 0.0})
    out = check_hand_made(ir, {}, [torch.randn(1, 2, 3, 4) for _ in range(3)], ["ATTENTION"],
                          ["attention_score", "attention_nan_guard", "attention_output", "attention_fused"])
    assert out.nodes[0].attrs["scale"] == 1.0 and out.nodes[0].attrs["merge_heads"] is False


# -- the fused decode layer: head-major QKV_PROJ, ROPE_QK, ATTENTION, GATE_UP, residual GEMM, CSE ----------------

def _repeat_kv(t, groups):
    b, h, n, d = t.shape
    return t[:, :, None, :, :].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


class RopeAttention(nn.Module):
    """A Llama attention block without its output projection: q, k, v split into heads, RoPE, GQA."""

    def __init__(self, bias: bool = False, return_key: bool = False):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16, bias), nn.Linear(16, 8, bias), nn.Linear(16, 8, bias)
        self.return_key = return_key

    def forward(self, x, cos, sin):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 4).transpose(1, 2)
        k = self.k(x).view(b, n, 2, 4).transpose(1, 2)
        v = self.v(x).view(b, n, 2, 4).transpose(1, 2)
        key = k
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), is_causal=True)
        y = y.transpose(1, 2).reshape(b, n, 16)
        return (y, key) if self.return_key else y


ROPE_ARGS = (torch.randn(2, 3, 16), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))


@pytest.mark.parametrize("bias", [False, True])
def test_qkv_heads_first_rope_qk_and_fused_attention(bias):
    out = check_module(lambda: RopeAttention(bias), ROPE_ARGS, ["QKV_PROJ", "ROPE_QK", "ATTENTION"],
                       ["qkv_proj", "qkv_heads_first", "heads_round_trip", "rope", "rope_qk", "sdpa",
                        "attention_fused", "attention_merge_heads"])
    qkv, rope, attention = out.nodes
    assert qkv.attrs["heads_first"] is True and qkv.attrs["has_bias"] is bias
    assert [list(t.shape) for t in qkv.outputs] == [[2, 4, 3, 4], [2, 2, 3, 4], [2, 2, 3, 4]]
    assert [t.name for t in rope.inputs[:2]] == [t.name for t in qkv.outputs[:2]]
    assert [t.name for t in attention.inputs[:3]] == [*(t.name for t in rope.outputs), qkv.outputs[2].name]
    assert attention.attrs == {"scale": 0.5, "causal": True, "merge_heads": True}


def test_qkv_stays_token_major_when_a_head_split_key_is_an_output():
    """A returned key (a cache handed back) must keep its permute: head-major outputs would need one back."""
    out = check_module(lambda: RopeAttention(return_key=True), ROPE_ARGS,
                       ["QKV_PROJ", *["aten.reshape.default", "aten.permute.default"] * 3, "ROPE_QK", "ATTENTION"],
                       ["qkv_proj", "rope_qk", "attention_fused"])
    assert "qkv_heads_first" not in applied(out)


def test_qkv_stays_token_major_when_a_projection_is_not_split_into_heads():
    out = check_module(Qkv, (torch.randn(2, 3, 8),), ["QKV_PROJ", *RESHAPES], ["qkv_proj"])
    assert "heads_first" not in out.nodes[0].attrs and "qkv_heads_first" not in applied(out)


class GatedMlp(nn.Module):
    def __init__(self, gate_bias: bool = False, up_bias: bool = False, residual_first: bool = True):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(8, 12, gate_bias), nn.Linear(8, 12, up_bias), nn.Linear(12, 8)
        self.residual_first = residual_first

    def forward(self, x):
        y = self.down(F.silu(self.gate(x)) * self.up(x))
        return x + y if self.residual_first else y + x


def test_gate_up_and_residual_gemm():
    out = check_module(GatedMlp, (torch.randn(2, 3, 8),), ["GATE_UP", "GEMM"],
                       ["silu_gate", "gate_up", "gemm_residual_swapped"])
    gate_up, down = out.nodes
    assert gate_up.attrs == {"trans_b": True, "has_bias": False}
    assert [t.name for t in gate_up.inputs] == ["x", "p_gate_weight", "p_up_weight"]
    assert down.attrs["has_residual"] is True and down.attrs["has_bias"] is True
    assert [t.name for t in down.inputs] == ["mul", "p_down_weight", "p_down_bias", "x"]


def test_gate_up_with_biases_and_residual_after_the_gemm():
    out = check_module(lambda: GatedMlp(True, True, residual_first=False), (torch.randn(2, 3, 8),),
                       ["GATE_UP", "GEMM"], ["gate_up", "gemm_residual"])
    gate_up = out.nodes[0]
    assert gate_up.attrs["has_bias"] is True
    assert [t.name for t in gate_up.inputs] == ["x", "p_gate_weight", "p_up_weight", "p_gate_bias", "p_up_bias"]


def test_gate_up_refused_when_only_one_projection_has_a_bias():
    out = check_module(lambda: GatedMlp(True, False), (torch.randn(2, 3, 8),), ["GEMM", "GEMM", "SILU_GATE", "GEMM"],
                       ["silu_gate", "gemm_residual_swapped"])
    assert ("gate_up", "silu_gate", "one projection has a bias and the other not") in rejected(out)


def test_residual_gemm_refused_for_a_broadcast_operand():
    factory = lambda: Fn(lambda s, x, r: s.fc(x) + r, fc=nn.Linear(8, 8))  # noqa: E731
    out = check_module(factory, (torch.randn(2, 3, 8), torch.randn(8)), ["GEMM", "aten.add.Tensor"], ["linear"])
    assert any(r[0] == "gemm_residual" and "broadcast" in r[2] for r in rejected(out))


def test_residual_gemm_refused_for_an_operand_computed_from_weights_alone():
    """A program computes it once, at bind time, and holds it as a weight: it is a bias, not a residual."""
    factory = lambda: Fn(lambda s, x: s.fc(x) + s.pos.exp(), fc=nn.Linear(8, 8),  # noqa: E731
                         pos=nn.Parameter(torch.randn(2, 3, 8)))
    out = check_module(factory, (torch.randn(2, 3, 8),), ["GEMM", "aten.exp.default", "aten.add.Tensor"], ["linear"])
    assert any(r[0] == "gemm_residual" and "weights and constants alone" in r[2] for r in rejected(out))


def test_common_subexpression_of_index_arithmetic():
    def fn(s, x, pos):
        return x.index_select(1, pos + 1) * x.index_select(1, pos + 1)

    out = check_module(lambda: Fn(fn), (torch.randn(2, 5), torch.tensor([0, 2])),
                       ["aten.add.Tensor", "aten.index_select.default", "aten.index_select.default",
                        "aten.mul.Tensor"], ["common_subexpression"])
    first, second = out.nodes[1:3]
    assert first.inputs[1].name == second.inputs[1].name == out.nodes[0].outputs[0].name


# -- conv, norm, embedding, softmax, activations ---------------------------------------------------------------

def test_conv_batch_norm_activation():
    out = check_module(lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU()),
                       (torch.randn(1, 2, 6, 6),), ["CONV"], ["conv", "conv_batch_norm", "conv_activation"])
    attrs = out.nodes[0].attrs
    assert attrs["activation"] == "relu" and attrs["bn_eps"] == pytest.approx(1e-5)


def test_conv_relu6():
    out = check_module(lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU6()), (torch.randn(1, 2, 6, 6),),
                       ["CONV"], ["conv", "conv_activation"])
    assert out.nodes[0].attrs["activation"] == "relu6"


class ConvBnReadTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


def test_conv_batch_norm_rejected_when_conv_output_is_read_elsewhere():
    out = check_module(ConvBnReadTwice, (torch.randn(1, 2, 6, 6),),
                       ["CONV", "BATCH_NORM", "aten.add.Tensor"], ["conv"])
    reasons = [r for r in rejected(out) if r[0] == "conv_batch_norm"]
    assert reasons and "also read outside the pattern" in reasons[0][2]


def test_layer_norm():
    check_module(lambda: nn.LayerNorm(4), (torch.randn(2, 3, 4),), ["LAYER_NORM"], ["layer_norm"])


def test_embedding():
    check_module(lambda: nn.Embedding(10, 4), (torch.tensor([[1, 2, 3]]),), ["EMBEDDING"], ["embedding"])


def _gathered_rows_ir(origin: str | None) -> NPU_IR:
    """The ONNX importer's Gather on a table: reshape(index_select(table, reshape(ids mod 10, [-1]), 0)), its
    remainder made by the Gather converter (``origin``) or by the model itself (None)."""
    ids, table = t("ids", [1, 3], "int64"), t("table", [10, 4])
    wrapped, flat = t("wrapped", [1, 3], "int64"), t("flat", [3], "int64")
    rows, y = t("rows", [3, 4]), t("y", [1, 3, 4])
    return NPU_IR("gather", [ids], [y], [table], [
        OpNode("remainder", "aten.remainder.Scalar", [ids], [wrapped], {"other": 10},
               provenance=Provenance(["remainder"], origin=origin)),
        OpNode("flat", "aten.reshape.default", [wrapped], [flat], {"shape": [3]}),
        OpNode("index_select", "aten.index_select.default", [table, flat], [rows], {"dim": 0}),
        OpNode("y", "aten.reshape.default", [rows], [y], {"shape": [1, 3, 4]}),
    ])


def test_gathered_rows_with_wrapped_ids_hand_made():
    torch.manual_seed(0)
    ir = _gathered_rows_ir("onnx:Gather torch_ir.frontends.onnx.converters.indexing.Gather")
    out = check_hand_made(ir, {"table": torch.randn(10, 4)}, [torch.tensor([[1, -2, 9]])], ["EMBEDDING"],
                          ["gathered_rows", "embedding_wrapped_ids"])
    assert [i.name for i in out.nodes[0].inputs] == ["table", "ids"]
    assert out.nodes[0].attrs == {"negative_wraps": True}  # ONNX Gather's ids: [-rows, rows)


def test_a_remainder_not_from_onnx_gather_stays_before_the_embedding():
    """A model's own ``ids % rows`` wraps every id, past the table too; EMBEDDING's negative_wraps would refuse
    those, so only the remainder the ONNX Gather converter adds is folded into the lookup."""
    torch.manual_seed(0)
    out = check_hand_made(_gathered_rows_ir(None), {"table": torch.randn(10, 4)}, [torch.tensor([[1, -2, 19]])],
                          ["aten.remainder.Scalar", "EMBEDDING"], ["gathered_rows"])
    assert out.nodes[1].attrs == {}


def test_softmax():
    out = check_module(lambda: nn.Softmax(-1), (torch.randn(2, 3, 4),), ["SOFTMAX"], ["softmax"])
    assert any(r[0] == "attention_score" and r[2] for r in rejected(out))


def test_gemm_activation():
    out = check_module(lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU()), (torch.randn(2, 3, 4),), ["GEMM"],
                       ["linear", "gemm_activation"])
    assert out.nodes[0].attrs["activation"] == "gelu"


# -- what GPT-2 and the ONNX exporter spell out --------------------------------------------------------------

class NewGelu(nn.Module):
    """GPT-2's MLP: the tanh approximation of GELU written as a formula after the up projection."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x):
        h = self.fc(x)
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))


def test_gelu_tanh_formula_becomes_gelu_and_joins_the_gemm():
    out = check_module(NewGelu, (torch.randn(2, 3, 8),), ["GEMM"], ["gelu_tanh", "gemm_activation"])
    assert out.nodes[0].attrs["activation"] == "gelu_tanh"


def test_gelu_formula_with_another_constant_stays():
    def almost(s, x):
        return 0.5 * x * (1.0 + torch.tanh(0.8 * (x + 0.044715 * torch.pow(x, 3.0))))

    out = check_module(lambda: Fn(almost), (torch.randn(2, 8),), ["aten.mul.Tensor", "aten.pow.Tensor_Scalar",
                                                                 "aten.mul.Tensor", "aten.add.Tensor",
                                                                 "aten.mul.Tensor", "aten.tanh.default",
                                                                 "aten.add.Tensor", "aten.mul.Tensor"], [])
    assert "aten.gelu.default" not in ops(out)


def test_boolean_and_or_become_logical_ops():
    check_module(lambda: Fn(lambda s, a, b: (a & b) | ~a), (torch.rand(2, 3) > 0.5, torch.rand(2, 3) > 0.5),
                 ["aten.logical_and.default", "aten.bitwise_not.default", "aten.logical_or.default"], ["logical"])


def test_where_with_a_constant_value_takes_it_as_a_scalar_hand_made():
    cond, x, k, y = t("cond", [2, 3], "bool"), t("x", [2, 3]), t("k", []), t("y", [2, 3])
    ir = NPU_IR("where", [cond, x], [y], [], [OpNode("where", "aten.where.self", [cond, x, k], [y])],
                constants=[k], constant_values={"k": -3.0e38})
    out = check_hand_made(ir, {}, [torch.rand(2, 3) > 0.5, torch.randn(2, 3)], ["aten.where.ScalarOther"],
                          ["where_scalar"])
    assert out.nodes[0].attrs == {"other": -3.0e38}


def test_one_picked_row_becomes_select_hand_made():
    x, i, rows, y = t("x", [2, 5, 4]), t("i", [1], "int64"), t("rows", [2, 1, 4]), t("y", [2, 4])
    ir = NPU_IR("pick", [x], [y], [], [
        OpNode("pick", "aten.index_select.default", [x, i], [rows], {"dim": 1}),
        OpNode("y", "aten.reshape.default", [rows], [y], {"shape": [2, 4]}),
    ], constants=[i], constant_values={"i": [3]})
    out = check_hand_made(ir, {}, [torch.randn(2, 5, 4)], ["aten.select.int"], ["picked_row"])
    assert out.nodes[0].attrs == {"dim": 1, "index": 3}


# -- the kernel library's canonical forms (issue: real models compile whole) ------------------------------

def test_constant_pad_becomes_pad_hand_made():
    x, y = t("x", [2, 3, 4]), t("y", [2, 3, 7])
    ir = NPU_IR("pad", [x], [y], [], [
        OpNode("pad", "aten.constant_pad_nd.default", [x], [y], {"pad": [1, 2], "value": 0.5})])
    out = check_hand_made(ir, {}, [torch.randn(2, 3, 4)], ["aten.pad.default"], ["constant_pad"])
    assert out.nodes[0].attrs == {"pad": [1, 2], "mode": "constant", "value": 0.5}


def test_split_and_chunk_become_split_with_sizes():
    out = check_module(lambda: Fn(lambda s, x: [t * 2 for t in torch.split(x, 3, dim=1)] + [x.chunk(2, -1)[1] + 1]),
                       (torch.randn(2, 7, 4),),
                       ["aten.split_with_sizes.default", *["aten.mul.Tensor"] * 3, "aten.split_with_sizes.default",
                        "aten.add.Tensor"], ["split"])
    assert [n.attrs for n in out.nodes if n.op_type == "aten.split_with_sizes.default"] == [
        {"split_sizes": [3, 3, 1], "dim": 1}, {"split_sizes": [2, 2], "dim": 2}]


def test_stack_becomes_reshapes_and_cat():
    check_module(lambda: Fn(lambda s, x: torch.stack([x, x * 2], -1) + 1), (torch.randn(2, 3),),
                 ["aten.mul.Tensor", "aten.reshape.default", "aten.reshape.default", "aten.cat.default",
                  "aten.add.Tensor"], ["stack"])


def test_concat_becomes_cat_hand_made():
    a, b, y = t("a", [2, 3]), t("b", [2, 2]), t("y", [2, 5])
    ir = NPU_IR("concat", [a, b], [y], [], [
        OpNode("concat", "aten.concat.default", [a, b], [y], {"tensors": [0, 1], "dim": 1})])
    check_hand_made(ir, {}, [torch.randn(2, 3), torch.randn(2, 2)], ["aten.cat.default"], ["concat"])


def test_reshape_as_and_expand_as_become_reshape_and_expand():
    out = check_module(lambda: Fn(lambda s, x, y: x.reshape_as(y) + x.sum(0, keepdim=True).expand_as(x).reshape_as(y)),
                       (torch.randn(4, 6), torch.randn(2, 12)),
                       ["aten.reshape.default", "aten.sum.dim_IntList", "aten.expand.default", "aten.reshape.default",
                        "aten.add.Tensor"], ["as_other"])
    assert all(len(n.inputs) == 1 for n in out.nodes[:4])  # y's values are not read


def test_layer_norm_without_affine_becomes_layer_norm():
    out = check_module(lambda: nn.LayerNorm(6, elementwise_affine=False), (torch.randn(2, 3, 6),), ["LAYER_NORM"],
                       ["layer_norm"])
    assert len(out.nodes[0].inputs) == 1


def test_max_and_min_of_two_tensors_become_maximum_and_minimum():
    check_module(lambda: Fn(lambda s, x, y: torch.max(x, y) + torch.min(x, y)), (torch.randn(2, 3), torch.randn(2, 3)),
                 ["aten.maximum.default", "aten.minimum.default", "aten.add.Tensor"], ["extreme"])


def test_like_constructors_become_full_and_small_ones_fold():
    def likes(s, x):
        return x * torch.full_like(x, 2.0) + torch.ones_like(x).fill_(3.0) + torch.zeros_like(x)

    big = check_module(lambda: Fn(likes), (torch.randn(200, 100),),  # over the folding limit: fill kernels
                       ["aten.full.default", "aten.mul.Tensor", "aten.full.default", "aten.add.Tensor",
                        "aten.full.default", "aten.add.Tensor"], ["like_to_full"])
    assert all("x" not in [i.name for i in n.inputs] for n in big.nodes if n.op_type == "aten.full.default")
    small = check_module(lambda: Fn(likes), (torch.randn(2, 3),),
                         ["aten.mul.Tensor", "aten.add.Tensor", "aten.add.Tensor"], ["like_to_full", "fold_constants"])
    assert len(small.constants) == 3


def test_scalar_tensor_folds_or_becomes_a_fill_for_inf():
    y = t("y", [2, 3])
    s1, s2, x = t("s1", []), t("s2", []), t("x", [2, 3])
    mid = t("mid", [2, 3])
    ir = NPU_IR("scalars", [x], [y], [], [
        OpNode("s1", "aten.scalar_tensor.default", [], [s1], {"s": 2.0, "dtype": {"dtype": "float32"}}),
        OpNode("s2", "aten.scalar_tensor.default", [], [s2], {"s": {"float": "-inf"}, "dtype": {"dtype": "float32"}}),
        OpNode("mid", "aten.mul.Tensor", [x, s1], [mid]),
        OpNode("y", "aten.maximum.default", [mid, s2], [y]),
    ])
    out = check_hand_made(ir, {}, [torch.randn(2, 3)], ["aten.full.default", "aten.mul.Tensor",
                                                        "aten.maximum.default"],
                          ["scalar_tensor_to_full", "fold_constants"])
    assert out.nodes[0].attrs["fill_value"] == {"float": "-inf"} and out.nodes[1].attrs == {"other": 2.0}


def test_local_response_norm_becomes_lrn():
    out = check_module(lambda: nn.LocalResponseNorm(3, alpha=0.01), (torch.randn(1, 6, 4, 4),), ["LRN"], ["lrn"])
    assert out.nodes[0].attrs == {"size": 3, "alpha": 0.01, "beta": 0.75, "k": 1.0}


def test_even_local_response_norm_window_stays_as_it_is_hand_made():
    """An even window pads asymmetrically; the rule takes only torch's split of the padding."""
    x = t("x", [1, 4, 3, 3])
    sq, v, p, pool, back, y = (t(n, s) for n, s in [("sq", [1, 4, 3, 3]), ("v", [1, 1, 4, 3, 3]),
                                                     ("p", [1, 1, 7, 3, 3]), ("pool", [1, 1, 4, 3, 3]),
                                                     ("back", [1, 4, 3, 3]), ("y", [1, 4, 3, 3])])
    a, k, d = t("a", [1, 4, 3, 3]), t("k", [1, 4, 3, 3]), t("d", [1, 4, 3, 3])
    ir = NPU_IR("lrn4", [x], [y], [], [
        OpNode("sq", "aten.mul.Tensor", [x, x], [sq]),
        OpNode("v", "aten.reshape.default", [sq], [v], {"shape": [1, 1, 4, 3, 3]}),
        OpNode("p", "aten.pad.default", [v], [p], {"pad": [0, 0, 0, 0, 1, 2]}),  # ONNX's split for size 4
        OpNode("pool", "aten.avg_pool3d.default", [p], [pool], {"kernel_size": [4, 1, 1], "stride": [1, 1, 1]}),
        OpNode("back", "aten.reshape.default", [pool], [back], {"shape": [1, 4, 3, 3]}),
        OpNode("a", "aten.mul.Tensor", [back], [a], {"other": 0.01}),
        OpNode("k", "aten.add.Tensor", [a], [k], {"other": 1.0}),
        OpNode("d", "aten.pow.Tensor_Scalar", [k], [d], {"exponent": 0.75}),
        OpNode("y", "aten.div.Tensor", [x, d], [y]),
    ])
    out = normalize(ir)
    assert "LRN" not in ops(out) and "aten.avg_pool3d.default" in ops(out)


class PreActivation(nn.Module):
    """DenseNet's order: a batch norm after a concatenation, where no CONV can absorb it."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x):
        return torch.relu(self.bn(torch.cat([x, x * 2], 1)))


def test_batch_norm_no_conv_absorbs_becomes_batch_norm():
    out = check_module(PreActivation, (torch.randn(1, 3, 4, 4),),
                       ["aten.mul.Tensor", "aten.cat.default", "BATCH_NORM", "aten.relu.default"], ["batch_norm"])
    assert out.nodes[2].attrs == {"eps": 1e-5}


@pytest.mark.parametrize(("kernel", "padding", "expected"), [
    ((3, 3), "same", ["CONV"]), ((3, 4), "same", ["aten.pad.default", "CONV"]), ((3, 4), "valid", ["CONV"])])
def test_conv_with_string_padding(kernel, padding, expected):
    out = check_module(lambda: nn.Conv2d(3, 4, kernel, padding=padding, dilation=1), (torch.randn(1, 3, 6, 7),),
                       expected, ["conv"])
    conv = out.nodes[-1]
    assert conv.outputs[0].shape == ([1, 4, 6, 7] if padding == "same" else [1, 4, 4, 4])


def test_every_rule_has_a_test():
    # Order-independent: each rule's name must appear among the applied-rule lists of this file (or of the rule
    # tests beside it: test_quantized_rules.py).
    source = "".join(p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("test_*rules.py"))
    missing = [r.name for r in ALL_RULES if f'"{r.name}"' not in source]
    assert not missing, f"rules without a test here: {missing}"


# -- renaming, tensor table ------------------------------------------------------------------------------

def test_prefixes_rename_nodes_and_intermediates_only():
    factory = lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2), nn.Softmax(-1))  # noqa: E731
    x = torch.randn(2, 3, 4)
    meta, real = build_pair(factory)
    ir = torch_ir.extract_ir(meta, (x,))
    plain = normalize(ir)
    out = normalize(ir, NormalizeOptions(node_prefix="layer_", tensor_prefix="t"))
    assert [n.name for n in out.nodes] == [f"layer_{i}" for i in range(len(out.nodes))]
    assert ops(out) == ops(plain) == ["GEMM", "GEMM", "SOFTMAX"]
    assert [i.name for i in out.graph_inputs] == [i.name for i in ir.graph_inputs]
    assert [o.name for o in out.graph_outputs] == [o.name for o in ir.graph_outputs]
    assert [w.name for w in out.weights] == [w.name for w in ir.weights]
    outputs = {o.name for o in out.graph_outputs}
    inner = [o.name for n in out.nodes for o in n.outputs if o.name not in outputs]
    assert inner == [f"t{i}" for i in range(len(inner))] and inner
    check_integrity(out)
    same_numbers(ir, out, real.state_dict(), (x,))


class ConvGemm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.emb = nn.Embedding(10, 8)
        self.fc = nn.Linear(8, 8)

    def forward(self, img, ids):
        return self.conv(img).relu(), self.fc(self.emb(ids))


def test_qconfig_precedence_roles_and_layouts_survive_save(tmp_path):
    args = (torch.randn(1, 3, 6, 6), torch.tensor([[1, 2, 3]]))
    meta, real = build_pair(ConvGemm)
    ir = torch_ir.extract_ir(meta, args)
    plain = normalize(ir)
    assert ops(plain) == ["CONV", "EMBEDDING", "GEMM"]
    conv_w = plain.nodes[0].inputs[1].name
    qc = QConfig(default=8, by_role={"kv": 4, "activation": 6, "output": 3}, by_op_type={"GEMM": 4},
                 by_name={plain.nodes[2].inputs[1].name: 16, conv_w: 2})
    out = normalize(ir, NormalizeOptions(qconfig=qc))
    path = tmp_path / "ir.json"
    out.save(str(path))
    for graph in (out, torch_ir.load_ir(path)):
        conv, emb, gemm = graph.nodes
        assert ops(graph) == ["CONV", "EMBEDDING", "GEMM"]
        # name beats op type: the GEMM weight is named 16, the GEMM bias by op type 4
        assert gemm.inputs[1].bits == 16 and gemm.inputs[2].bits == 4
        assert conv.inputs[1].bits == 2
        # op type beats role: the GEMM's output is a graph output (role 3) produced by a GEMM (4)
        assert gemm.outputs[0].role == "output" and gemm.outputs[0].bits == 4
        # role beats default: the embedding's rows are an activation the GEMM reads (not its weight)
        assert gemm.inputs[0].bits == 6 and gemm.inputs[0].role == "activation"
        assert conv.inputs[2].bits == 8 and conv.inputs[2].role == "weight"  # default
        assert emb.inputs[1].dtype == "int64" and emb.inputs[1].bits is None  # ids: no width
        assert emb.inputs[0].role == "embedding" and emb.inputs[1].role == "input"
        assert conv.inputs[0].role == "input" and conv.outputs[0].role == "output"
        assert conv.inputs[0].layout == "NCHW" and conv.outputs[0].layout == "NCHW"
        assert gemm.inputs[0].layout == "[B,T,H]" and gemm.outputs[0].layout == "[B,T,H]"
        assert conv.outputs[0].bits == 3  # CONV has no op-type width: the output role's
    same_numbers(ir, out, real.state_dict(), args)


@pytest.mark.slow
def test_attention_layouts_and_kv_role_on_llama_kv(tmp_path):
    from npu_tools.zoo import build_pair as zoo_pair
    from npu_tools.zoo import get_model

    entry = get_model("llama_kv")
    if not entry.available():
        pytest.skip("transformers is not installed")
    meta, _ = zoo_pair(entry)
    args, kwargs = entry.example_inputs()
    ir = torch_ir.extract_ir(meta, args, example_kwargs=kwargs, dynamic_shapes=entry.dynamic_shapes)
    out = normalize(ir, NormalizeOptions(qconfig=QConfig(default=8, by_role={"kv": 4})))
    check_integrity(out)
    path = tmp_path / "llama.json"
    out.save(str(path))
    for graph in (out, torch_ir.load_ir(path)):
        updates = [n for n in graph.nodes if n.op_type == "KV_UPDATE"]
        attentions = [n for n in graph.nodes if n.op_type == "ATTENTION"]
        assert updates and attentions
        for n in updates:
            assert n.inputs[0].role == "kv" and n.inputs[0].bits == 4
        for n in attentions:
            assert [t.layout for t in n.inputs[:3]] == ["[B,H,T,D]"] * 3 and n.outputs[0].layout == "[B,T,H]"
            assert n.inputs[1].role == "kv" and n.inputs[2].role == "kv"
        kv = [w for w in graph.weights if w.role == "kv"]
        assert kv and all(w.bits == 4 for w in kv)
