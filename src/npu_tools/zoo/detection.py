"""Detection models: heads that build anchors and masks inside ``forward``, from the features' shapes.

``tiny_yolo`` is written like Ultralytics' YOLOv8/YOLO11 ``DetectionModel``: a small CSP backbone, an FPN/PAN
neck, and a ``Detect`` head whose strides are measured in ``__init__`` by running the model once (a plain
tensor attribute, read into Python by the bias initialization) and whose anchors are made from the feature
shapes on the first call and cached with that shape. On the meta device this needs ``build_on_meta`` (the
zoo builds with it): it keeps the strides' values, which extraction then writes into the IR where the head
reads them (``feats.new_full(size, stride[i])``). ``detr`` (in ``hf.py``) computes its pixel mask and sine
position embeddings in ``forward``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import ZooEntry, register
from .basic import _randomize_norm_stats


class ConvBNAct(nn.Module):
    """Conv (no bias), BatchNorm, SiLU: Ultralytics' ``Conv``."""

    def __init__(self, c_in: int, c_out: int, k: int = 3, s: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class C2f(nn.Module):
    """Split, a chain of residual bottlenecks, concatenate every stage: Ultralytics' ``C2f``."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = True):
        super().__init__()
        self.c = c_out // 2
        self.cv1 = ConvBNAct(c_in, 2 * self.c, 1)
        self.cv2 = ConvBNAct((2 + n) * self.c, c_out, 1)
        self.m = nn.ModuleList(nn.Sequential(ConvBNAct(self.c, self.c), ConvBNAct(self.c, self.c)) for _ in range(n))
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(y[-1] + m(y[-1]) if self.shortcut else m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools concatenated."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.cv1 = ConvBNAct(c_in, c_in // 2, 1)
        self.cv2 = ConvBNAct(c_in * 2, c_out, 1)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(self.pool(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class DFL(nn.Module):
    """Distribution focal loss integral: softmax over ``reg_max`` bins, then their expectation (a fixed 1x1 conv)."""

    def __init__(self, reg_max: int):
        super().__init__()
        self.reg_max = reg_max
        self.conv = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(reg_max, dtype=torch.float).view(1, reg_max, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.reg_max, a).transpose(2, 1).softmax(1)).view(b, 4, a)


def make_anchors(feats: list[torch.Tensor], strides: torch.Tensor, offset: float = 0.5):
    """Cell centres of every level, ``[N, 2]``, and each one's stride, ``[N, 1]`` (Ultralytics' ``make_anchors``)."""
    points, stride_rows = [], []
    dtype, device = feats[0].dtype, feats[0].device
    for i, feat in enumerate(feats):
        h, w = feat.shape[2:]
        sx = torch.arange(w, device=device, dtype=dtype) + offset
        sy = torch.arange(h, device=device, dtype=dtype) + offset
        sy, sx = torch.meshgrid(sy, sx, indexing="ij")
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_rows.append(feats[0].new_full((h * w, 1), strides[i]))  # a stride tensor as a fill value: .item()
    return torch.cat(points), torch.cat(stride_rows)


def dist2bbox(distance: torch.Tensor, anchors: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Distances to the four sides -> boxes as centre x, centre y, width, height."""
    lt, rb = distance.chunk(2, dim)
    x1y1, x2y2 = anchors - lt, anchors + rb
    return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)


class Detect(nn.Module):
    """Per level a box branch (``4 * reg_max`` logits) and a class branch; decoded boxes and class scores out.

    Anchors and strides are made from the feature shapes on the first call and cached with that shape, as
    Ultralytics' ``Detect`` does, the cache starting as class attributes (so that the first call adds instance
    attributes, which a trace's own restore does not undo); ``stride`` is a plain tensor attribute set by the
    model's ``__init__``.
    """

    shape = None
    anchors = torch.empty(0)
    strides = torch.empty(0)

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int = 8):
        super().__init__()
        self.nc, self.nl, self.reg_max = nc, len(channels), reg_max
        self.no = nc + 4 * reg_max
        self.stride = torch.zeros(self.nl)  # measured by the model's __init__
        c2, c3 = max(16, channels[0] // 4, 4 * reg_max), max(channels[0], min(nc, 32))
        self.cv2 = nn.ModuleList(nn.Sequential(ConvBNAct(c, c2), ConvBNAct(c2, c2), nn.Conv2d(c2, 4 * reg_max, 1))
                                 for c in channels)
        self.cv3 = nn.ModuleList(nn.Sequential(ConvBNAct(c, c3), ConvBNAct(c3, c3), nn.Conv2d(c3, nc, 1))
                                 for c in channels)
        self.dfl = DFL(reg_max)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        x = [torch.cat((self.cv2[i](f), self.cv3[i](f)), 1) for i, f in enumerate(feats)]
        if self.training:
            return x
        shape = x[0].shape
        if self.shape != shape:  # the first call, or another input size
            self.anchors, self.strides = (a.transpose(0, 1) for a in make_anchors(x, self.stride, 0.5))
            self.shape = shape
        b = shape[0]
        box, cls = torch.cat([xi.view(b, self.no, -1) for xi in x], 2).split((4 * self.reg_max, self.nc), 1)
        boxes = dist2bbox(self.dfl(box), self.anchors.unsqueeze(0)) * self.strides
        return torch.cat((boxes, cls.sigmoid()), 1)

    def bias_init(self) -> None:
        """Prior box and class biases; reads the strides into Python, as Ultralytics does."""
        for a, b, s in zip(self.cv2, self.cv3, self.stride):
            a[-1].bias.data[:] = 1.0
            b[-1].bias.data[: self.nc] = math.log(5 / self.nc / (640 / s) ** 2)


class TinyYOLO(nn.Module):
    """Backbone (P3/P4/P5 at strides 8/16/32), FPN + PAN neck, anchor-free ``Detect`` head: YOLOv8 in miniature."""

    def __init__(self, nc: int = 4, width: int = 8):
        super().__init__()
        w = width
        self.stem = nn.Sequential(ConvBNAct(3, w, 3, 2), ConvBNAct(w, 2 * w, 3, 2), C2f(2 * w, 2 * w))
        self.p3 = nn.Sequential(ConvBNAct(2 * w, 4 * w, 3, 2), C2f(4 * w, 4 * w))
        self.p4 = nn.Sequential(ConvBNAct(4 * w, 8 * w, 3, 2), C2f(8 * w, 8 * w))
        self.p5 = nn.Sequential(ConvBNAct(8 * w, 8 * w, 3, 2), C2f(8 * w, 8 * w), SPPF(8 * w, 8 * w))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.top4 = C2f(16 * w, 8 * w, shortcut=False)
        self.top3 = C2f(12 * w, 4 * w, shortcut=False)
        self.down3 = ConvBNAct(4 * w, 4 * w, 3, 2)
        self.out4 = C2f(12 * w, 8 * w, shortcut=False)
        self.down4 = ConvBNAct(8 * w, 8 * w, 3, 2)
        self.out5 = C2f(16 * w, 8 * w, shortcut=False)
        self.head = Detect(nc, (4 * w, 8 * w, 8 * w))
        # Strides measured as Ultralytics measures them: one pass on a 64x64 image (shapes only on meta).
        s = 64
        self.head.stride = torch.tensor([s / f.shape[-2] for f in self.features(torch.zeros(1, 3, s, s))])
        self.stride = self.head.stride
        self.head.bias_init()

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        t4 = self.top4(torch.cat([self.up(p5), p4], 1))
        t3 = self.top3(torch.cat([self.up(t4), p3], 1))
        o4 = self.out4(torch.cat([self.down3(t3), t4], 1))
        o5 = self.out5(torch.cat([self.down4(o4), p5], 1))
        return [t3, o4, o5]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


register(ZooEntry(
    "tiny_yolo", "detection",
    "YOLOv8-style detector: CSP backbone, FPN/PAN neck, Detect head making anchors and strides from feature "
    "shapes in forward (first call, cached)",
    lambda: _randomize_norm_stats(TinyYOLO()), lambda g: ((torch.randn(2, 3, 64, 64, generator=g),), {}),
))
