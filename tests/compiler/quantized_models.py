"""Hand-built normalized quantized IRs and their weights, for the compile, runtime, ``.npubin`` and bisect tests.

The scales are chosen from the float model the quantized one approximates (its weights and a calibration input),
as a quantizer would, so that the codes use their range rather than saturate: the tests then compare codes that
vary. Everything is computed here with torch, not with the code under test.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.quant.spec import QuantSpec


def _meta(name: str, shape: list[int], dtype: str, role: str | None = None, quant: QuantSpec | None = None
          ) -> TensorMeta:
    return TensorMeta(name, list(shape), dtype, role=role, quant=quant)


def _affine_u8(t: torch.Tensor) -> tuple[float, int]:
    """A per-tensor uint8 (scale, zero point) covering ``t``'s range (and 0)."""
    lo, hi = min(float(t.min()), 0.0), max(float(t.max()), 0.0)
    scale = (hi - lo) / 255 or 1.0
    return scale, int(round(-lo / scale))


def _q(t: torch.Tensor, scale: float, zp: int) -> torch.Tensor:
    return (torch.round(t / scale) + zp).clamp(0, 255).to(torch.uint8)


def qconv_model(seed: int = 0) -> tuple[NPU_IR, dict[str, torch.Tensor], torch.Tensor]:
    """QUANTIZE -> QCONV(relu, int32 bias) -> QCONV(stride 2) -> DEQUANTIZE -> GEMM: (ir, weights, input)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 3, 8, 8, generator=g)
    w1f, w2f = torch.randn(4, 3, 3, 3, generator=g) * 0.3, torch.randn(4, 4, 3, 3, generator=g) * 0.3
    b1f = torch.randn(4, generator=g) * 0.1
    gemm_w = torch.randn(5, 4, generator=g)
    xs, xzp = _affine_u8(x)
    w1s, w2s = w1f.abs().amax((1, 2, 3)) / 127, w2f.abs().amax((1, 2, 3)) / 127
    w1, w2 = torch.round(w1f / w1s.view(-1, 1, 1, 1)).to(torch.int8), torch.round(w2f / w2s.view(-1, 1, 1, 1)).to(
        torch.int8)
    h1 = F.relu(F.conv2d(x, w1f, b1f, padding=1))
    y1s, y1zp = _affine_u8(h1)
    y2s, y2zp = _affine_u8(F.conv2d(h1, w2f, stride=2, padding=1))
    weights = {
        "xs": torch.tensor(xs), "xzp": torch.tensor(xzp, dtype=torch.uint8),
        "w1": w1, "w1_s": w1s, "w1_zp": torch.zeros(4, dtype=torch.int8),
        "b1": torch.round(b1f / (xs * w1s)).to(torch.int32),
        "y1s": torch.tensor(y1s), "y1zp": torch.tensor(y1zp, dtype=torch.uint8),
        "w2": w2, "w2_s": w2s, "w2_zp": torch.zeros(4, dtype=torch.int8),
        "y2s": torch.tensor(y2s), "y2zp": torch.tensor(y2zp, dtype=torch.uint8), "gemm_w": gemm_w,
    }
    wm = {n: _meta(n, list(t.shape), str(t.dtype).removeprefix("torch."), "weight") for n, t in weights.items()}
    wm["w1"] = _meta("w1", [4, 3, 3, 3], "int8", "weight", QuantSpec("int8", "w1_s", "w1_zp", axis=0))
    wm["w2"] = _meta("w2", [4, 4, 3, 3], "int8", "weight", QuantSpec("int8", "w2_s", "w2_zp", axis=0))
    xin = _meta("x", [1, 3, 8, 8], "float32", "input")
    q0 = _meta("q0", [1, 3, 8, 8], "uint8", quant=QuantSpec("uint8", "xs", "xzp"))
    q1 = _meta("q1", [1, 4, 8, 8], "uint8", quant=QuantSpec("uint8", "y1s", "y1zp"))
    q2 = _meta("q2", [1, 4, 4, 4], "uint8", quant=QuantSpec("uint8", "y2s", "y2zp"))
    f = _meta("f", [1, 4, 4, 4], "float32")
    y = _meta("y", [1, 4, 4, 5], "float32", "output")
    conv = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1}
    nodes = [
        OpNode("quantize", "QUANTIZE", [xin, wm["xs"], wm["xzp"]], [q0], {"dtype": "uint8"}),
        OpNode("conv1", "QCONV", [q0, wm["w1"], wm["xs"], wm["xzp"], wm["w1_s"], wm["w1_zp"], wm["b1"], wm["y1s"],
                                  wm["y1zp"]], [q1],
               {**conv, "has_bias": True, "out_dtype": "uint8", "activation": "relu"}),
        OpNode("conv2", "QCONV", [q1, wm["w2"], wm["y1s"], wm["y1zp"], wm["w2_s"], wm["w2_zp"], wm["y2s"],
                                  wm["y2zp"]], [q2], {**conv, "stride": [2, 2], "out_dtype": "uint8"}),
        OpNode("dequantize", "DEQUANTIZE", [q2, wm["y2s"], wm["y2zp"]], [f], {"dtype": "uint8"}),
        OpNode("fc", "GEMM", [f, wm["gemm_w"]], [y], {"trans_b": True, "has_bias": False}),
    ]
    ir = NPU_IR("qconv_chain", [xin], [y], list(wm.values()), nodes)
    return ir, weights, x


def dqgemm_model(seed: int = 0) -> tuple[NPU_IR, dict[str, torch.Tensor], torch.Tensor]:
    """A w4a16-style linear layer: DQGEMM with int4 weights packed two per byte, per group of 16 along K."""
    g = torch.Generator().manual_seed(seed)
    n, k, group = 8, 32, 16
    wf = torch.randn(n, k, generator=g)
    scale = wf.view(n, k // group, group).abs().amax(-1) / 7  # [N, K / group]
    codes = torch.round(wf / scale.repeat_interleave(group, 1)).clamp(-8, 7).to(torch.int16)
    nib = codes & 0xF
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8)  # low nibble first, as ONNX packs
    weights = {"w": packed, "w_s": scale, "b": torch.randn(n, generator=g)}
    x = torch.randn(2, 5, k, generator=g)
    xin = _meta("x", [2, 5, k], "float32", "input")
    w = _meta("w", [n, k], "int4", "weight", QuantSpec("int4", "w_s", axis=1, group_size=group))
    ws, b = _meta("w_s", [n, k // group], "float32", "weight"), _meta("b", [n], "float32", "weight")
    h = _meta("h", [2, 5, n], "float32")
    y = _meta("y", [2, 5, n], "float32", "output")
    nodes = [OpNode("fc", "DQGEMM", [xin, w, ws, b], [h], {"w_dtype": "int4", "axis": 1, "group_size": group,
                                                             "has_bias": True, "activation": "gelu"}),
             OpNode("act", "aten.relu.default", [h], [y], {})]
    return NPU_IR("w4_linear", [xin], [y], [w, ws, b], nodes), weights, x
