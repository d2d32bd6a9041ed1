"""Small hand-written models, each exercising one structure an NPU toolchain must handle."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812 - the usual spelling
from torch import nn
from torch.export import Dim

from . import ZooEntry, register


def _randomize_norm_stats(model: nn.Module) -> nn.Module:
    """Give batch norms non-trivial statistics, so that a wrong folding of them shows in the outputs."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model


class MLP(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 32, d_out: int = 8):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, d_out)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _conv_bn(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class ConvNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(_conv_bn(3, 8), nn.MaxPool2d(2), _conv_bn(8, 16), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class BasicBlock(nn.Module):
    """ResNet's basic block; a 1x1 projection on the shortcut when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.body = nn.Sequential(
            _conv_bn(c_in, c_out, stride), nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out)
        )
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResidualNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = _conv_bn(3, 8)
        self.blocks = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, stride=2))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


class TwoTower(nn.Module):
    """Image + token inputs; a dict of outputs, one of them integer (the predicted class)."""

    def __init__(self, vocab: int = 50, dim: int = 16, classes: int = 5):
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(3, dim, 4, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.text = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, image: torch.Tensor, tokens: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        img, txt = self.image(image), self.text(tokens)
        logits = self.head(torch.cat([img, txt], dim=-1)) * scale
        return {"logits": logits, "pred": logits.argmax(-1), "similarity": F.cosine_similarity(img, txt, dim=-1)}


class TinyUNet(nn.Module):
    """Encoder, bottleneck, decoder; the decoder concatenates the encoder's features (skip connection)."""

    def __init__(self, c_in: int = 3, classes: int = 2):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(c_in, 8, 3, padding=1), nn.ReLU())
        self.mid = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, classes, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.enc(x)
        up = self.up(self.mid(skip))
        return self.dec(torch.cat([up, skip], dim=1))


class SharedLinear(nn.Module):
    """The same Linear applied twice: one weight, two uses."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.relu(self.proj(x))) + x


class TiedLM(nn.Module):
    """Embedding and output head share one matrix (``head.weight is embed.weight``)."""

    def __init__(self, vocab: int = 50, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return self.head(h + self.mix(h))


class ManualSelfAttention(nn.Module):
    """Causal multi-head self-attention spelled out: matmul, scale, mask, softmax, matmul."""

    def __init__(self, dim: int = 32, heads: int = 4, max_len: int = 128):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        # A non-persistent buffer: not in the checkpoint, still needed to run the graph.
        self.register_buffer("causal", torch.ones(max_len, max_len, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        return self.norm(x + self.out(y))


class SDPABlock(nn.Module):
    """A pre-norm transformer block using F.scaled_dot_product_attention."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(y)
        return x + self.mlp(self.norm2(x))


def _randn(*shape: int):
    return lambda g: ((torch.randn(*shape, generator=g),), {})


def _two_tower_inputs(g: torch.Generator):
    image, tokens = torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 50, (2, 6), generator=g)
    return (image, tokens, torch.rand(2, 1, generator=g) + 0.5), {}


_BATCH = Dim("batch", min=1, max=64)
_SEQ = Dim("seq", min=2, max=64)

for _entry in (
    ZooEntry("mlp", "basic", "3-layer MLP (linear, relu, gelu) with a dynamic batch dimension", MLP, _randn(4, 16),
             dynamic_shapes={"x": {0: _BATCH}}),
    ZooEntry("convnet", "conv", "conv-bn-relu, max-pool, conv-bn-relu, global pool, linear",
             lambda: _randomize_norm_stats(ConvNet()), _randn(2, 3, 16, 16)),
    ZooEntry("residual", "residual", "ResNet-style basic blocks, identity and projection shortcuts",
             lambda: _randomize_norm_stats(ResidualNet()), _randn(2, 3, 16, 16)),
    ZooEntry("two_tower", "multi_io", "image + tokens + scale in; dict of logits, int pred, similarity out",
             TwoTower, _two_tower_inputs),
    ZooEntry("unet", "skip", "tiny U-Net: down, up (transposed conv), concat with the encoder's features",
             TinyUNet, _randn(2, 3, 16, 16)),
    ZooEntry("shared_linear", "shared", "one Linear applied twice", SharedLinear, _randn(4, 16)),
    ZooEntry("tied_lm", "shared", "embedding and output head share one weight",
             TiedLM, lambda g: ((torch.randint(0, 50, (2, 8), generator=g),), {})),
    ZooEntry("mhsa", "attention", "causal multi-head self-attention with matmul/softmax, dynamic sequence",
             ManualSelfAttention, _randn(2, 8, 32), dynamic_shapes={"x": {1: _SEQ}}),
    ZooEntry("sdpa_block", "attention", "pre-norm transformer block using F.scaled_dot_product_attention",
             SDPABlock, _randn(2, 8, 32)),
):
    register(_entry)
