"""``torch_ir.quant.numerics.int8_groups``: llama.cpp's int8 activation groups, against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_ir.quant.numerics import int8_groups


def test_int8_groups_round_each_group_to_its_own_int8_grid() -> None:
    x = torch.tensor([[127.0, 63.5, -0.5, 1.5] + [0.0] * 4, [0.0] * 8])  # groups of 4: dx = 1 and 0 (all zero)
    got = int8_groups(x, 4)
    assert got[0, :4].tolist() == [127.0, 64.0, -0.0, 2.0]  # ties to even: 63.5 -> 64, -0.5 -> -0, 1.5 -> 2
    assert got[0, 4:].tolist() == [0.0] * 4 and got[1].tolist() == [0.0] * 8
    rng = np.random.default_rng(0)
    y = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32))
    g = y.numpy().reshape(3, 2, 32)
    dx = np.abs(g).max(-1, keepdims=True) / np.float32(127)
    assert torch.equal(int8_groups(y, 32), torch.from_numpy((np.round(g / dx) * dx).reshape(3, 64)))
    with pytest.raises(ValueError, match="do not divide"):
        int8_groups(y, 48)
