"""The kernel library's coverage of what real models use: each module here compiles into one program (no
node refused) whose dispatches include the kernel under test, and the program run with the module's seeded
weights equals PyTorch eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler import UnsupportedOpsError

from ..helpers import Fn
from .test_compile import check_against_eager, compile_pair, kernels


def _upsample(mode: str, **kw):
    return lambda: Fn(lambda s, x: s.conv(F.interpolate(x, mode=mode, **kw)), conv=nn.Conv2d(3, 4, 3, padding=1))


# name -> (factory, input shapes, a kernel the program must dispatch)
CASES = {
    "pad_constant": (lambda: Fn(lambda s, x: s.conv(F.pad(x, (1, 2, 0, 1), value=0.5)), conv=nn.Conv2d(3, 4, 3)),
                     [(1, 3, 8, 8)], "aten.pad.default"),
    "pad_reflect": (lambda: Fn(lambda s, x: s.conv(F.pad(x, (1, 1, 2, 2), mode="reflect")), conv=nn.Conv2d(3, 4, 3)),
                    [(1, 3, 8, 8)], "aten.pad.default"),
    "pad_replicate": (lambda: Fn(lambda s, x: F.pad(x, (2, 1), mode="replicate") * 2), [(2, 3, 8)],
                      "aten.pad.default"),
    "split_chunk_unbind": (lambda: Fn(lambda s, x: [t * 2 for t in torch.split(x, [1, 3], 1)]
                                      + [x.chunk(2, -1)[0] + 1] + [t - 1 for t in x.unbind(0)]),
                           [(2, 4, 6)], "aten.split_with_sizes.default"),
    "stack_unflatten": (lambda: Fn(lambda s, x: torch.stack([x, x * 2], 1).flatten(2).unflatten(2, (6, 4)) + 1),
                        [(2, 3, 8)], "aten.cat.default"),
    "roll_flip": (lambda: Fn(lambda s, x: torch.roll(x, (1, -2), (1, 2)) + x.flip(-1)), [(2, 5, 6)],
                  "aten.roll.default"),
    "upsample_nearest": (_upsample("nearest", scale_factor=2), [(1, 3, 5, 6)], "aten.upsample_nearest2d.vec"),
    "upsample_bilinear": (_upsample("bilinear", scale_factor=2, align_corners=False), [(1, 3, 5, 6)],
                          "aten.upsample_bilinear2d.vec"),
    "upsample_bilinear_corners": (_upsample("bilinear", size=(9, 11), align_corners=True), [(1, 3, 5, 6)],
                                  "aten.upsample_bilinear2d.vec"),
    "upsample_bicubic": (_upsample("bicubic", scale_factor=2), [(1, 3, 5, 6)], "aten.upsample_bicubic2d.vec"),
    "group_norm": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.SiLU()),
                   [(2, 3, 6, 6)], "aten.group_norm.default"),
    "batch_norm_pre_activation": (lambda: Fn(lambda s, x: s.conv(torch.relu(s.bn(torch.cat([x, x * 2], 1)))),
                                             bn=nn.BatchNorm2d(6), conv=nn.Conv2d(6, 4, 1)),
                                  [(1, 3, 5, 5)], "BATCH_NORM"),
    "local_response_norm": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.LocalResponseNorm(5, 1e-3)),
                            [(1, 3, 9, 9)], "LRN"),
    "softplus_floor_divide": (lambda: Fn(lambda s, x: F.softplus(x) + torch.floor_divide(x, 0.7)), [(3, 7)],
                              "aten.softplus.default"),
    "max_min": (lambda: Fn(lambda s, x: torch.max(x, x.flip(1)) + x.max(dim=1)[0].unsqueeze(1) + x.min(1).values.sum()),
                [(3, 7)], "aten.max.dim"),
    "adaptive_avg_pool1d": (lambda: Fn(lambda s, x: F.adaptive_avg_pool1d(x, 4) * 2), [(2, 3, 12)],
                            "aten.adaptive_avg_pool1d.default"),
    "conv_same_even_kernel": (lambda: nn.Conv2d(3, 4, (3, 4), padding="same"), [(1, 3, 6, 7)], "aten.pad.default"),
    "conv_valid": (lambda: nn.Conv2d(3, 4, 3, padding="valid"), [(1, 3, 6, 7)], "CONV"),
    "weight_norm": (lambda: nn.utils.parametrizations.weight_norm(nn.Linear(8, 4)), [(2, 8)],
                    "aten._weight_norm.default"),
    "to_dtype_and_likes": (lambda: Fn(lambda s, x: x.to(torch.float16).to(torch.float32) + torch.full_like(x, 2.0)
                                      * torch.zeros_like(x).fill_(1.0) + torch.scalar_tensor(3.0)), [(200, 100)],
                           "aten.full.default"),
    "topk_sort": (lambda: Fn(lambda s, x: [x.topk(3, dim=-1).values * 2, x.sort(dim=-1).values]), [(2, 3, 7)],
                  "aten.topk.default"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_whole_and_runs_equal_to_eager(name):
    factory, shapes, kernel = CASES[name]
    program, real = compile_pair(factory, *shapes)
    assert kernel in kernels(program), kernels(program)
    check_against_eager(program, real, *shapes)


class GridSample(nn.Module):
    def forward(self, x, grid):
        return F.grid_sample(x, grid, align_corners=False) * 2


def test_a_host_op_is_refused_with_its_reason():
    """grid_sample stays on the host: the strict compile names the node and why."""
    args = (torch.randn(1, 2, 4, 4, device="meta"), torch.randn(1, 3, 3, 2, device="meta"))
    ir = torch_ir.extract_ir(GridSample(), args)
    with pytest.raises(UnsupportedOpsError) as info:
        npu_compiler.compile(ir)
    [(_, op, reason)] = info.value.unsupported
    assert op == "aten.grid_sampler.default" and "stays on the host CPU" in reason
