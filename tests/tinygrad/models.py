"""tinygrad test models: seed 001's a*b+c, an MLP, a CNN, a llama-style block and a tiny llama.

Plain tinygrad, written the way its own examples are (``extra/models/llama.py``): callables whose
layers are attributes, so ``get_state_dict`` names every weight.
"""

from __future__ import annotations

import numpy as np
from tinygrad.dtype import _to_np_dtype
from tinygrad.nn import BatchNorm, Conv2d, Embedding, Linear, RMSNorm
from tinygrad.nn.state import get_state_dict
from tinygrad.tensor import Tensor


def realize_weights(model: object, seed: int = 0) -> object:
    """Give every weight seeded numpy values (BatchNorm statistics other than 0 and 1 included).

    Users need not do this (the importer realizes lazily initialized weights itself); the tests use it
    where they want values that do not depend on tinygrad's RNG, or non-trivial running statistics.
    """
    rng = np.random.default_rng(seed)
    for key, t in get_state_dict(model).items():
        if key.endswith("running_var"):  # a variance: positive
            value = rng.uniform(0.5, 1.5, t.shape)
        else:
            value = rng.standard_normal(t.shape) * 0.3
        t.replace(Tensor(np.asarray(value, dtype=_to_np_dtype(t.dtype)))).realize()
    return model


def add_mul(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Seed 001's first test graph."""
    return a * b + c


class MLP:
    def __init__(self, sizes: tuple[int, ...] = (16, 32, 32, 10)):
        self.layers = [Linear(i, o) for i, o in zip(sizes, sizes[1:])]

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return self.layers[-1](x)


class CNN:
    """Conv2d, BatchNorm (inference statistics), max and average pooling, a Linear head."""

    def __init__(self):
        self.conv1, self.bn1 = Conv2d(3, 8, 3, padding=1), BatchNorm(8)
        self.conv2 = Conv2d(8, 8, 3, stride=2, padding=1, groups=2)
        self.head = Linear(8, 10)

    def __call__(self, x: Tensor) -> Tensor:  # x: (B, 3, 8, 8)
        x = self.bn1(self.conv1(x)).relu().max_pool2d(2)  # (B, 8, 4, 4)
        x = self.conv2(x).relu().avg_pool2d(2)  # (B, 8, 1, 1)
        return self.head(x.flatten(1))


def rotary_tables(head_dim: int, max_len: int, theta: float = 10000.0, *,
                  halves: bool = False) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, as realized tensors: (max_len, head_dim // 2), one angle per
    channel pair; with ``halves``, (max_len, head_dim), the angles repeated for both halves (HF's tables)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    angles = np.outer(np.arange(max_len, dtype=np.float32), freqs)
    if halves:
        angles = np.concatenate([angles, angles], axis=-1)
    return Tensor(np.cos(angles).astype(np.float32)).realize(), Tensor(np.sin(angles).astype(np.float32)).realize()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs of x (B, T, H, D) by the angles of its positions; cos/sin are (T, D/2).

    tinygrad's own llama (``extra/models/llama.py``) does this as a complex multiply of (x0, x1) pairs."""
    b, t, h, d = x.shape
    pairs = x.reshape(b, t, h, d // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos.reshape(1, t, 1, d // 2), sin.reshape(1, t, 1, d // 2)
    return Tensor.stack(x0 * c - x1 * s, x0 * s + x1 * c, dim=-1).reshape(b, t, h, d)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return (-x[..., half:]).cat(x[..., :half], dim=-1)


def apply_rotary_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's form: x·cos + rotate_half(x)·sin for x (B, T, H, D); cos/sin are (T, D), halves repeated."""
    t, d = x.shape[1], x.shape[-1]
    return x * cos.reshape(1, t, 1, d) + rotate_half(x) * sin.reshape(1, t, 1, d)


ROTARY = {"pairs": apply_rotary, "half": apply_rotary_half}


class Attention:
    """Grouped-query causal self-attention with rotary embeddings (``rope``: "pairs" or "half", see ROTARY)."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, rope: str = "pairs"):
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.rope = rope
        self.wq = Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = Linear(n_heads * self.head_dim, dim, bias=False)

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, _ = x.shape
        q = self.wq(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.wk(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.wv(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        rotate = ROTARY[self.rope]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, hd)
        out = q.scaled_dot_product_attention(k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward:
    """SiLU-gated MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int):
        self.w1, self.w2, self.w3 = Linear(dim, hidden, bias=False), Linear(hidden, dim, bias=False), \
            Linear(dim, hidden, bias=False)

    def __call__(self, x: Tensor) -> Tensor:
        return self.w2(self.w1(x).silu() * self.w3(x))


class LlamaBlock:
    def __init__(self, dim: int = 32, n_heads: int = 4, n_kv_heads: int = 2, hidden: int = 64, max_len: int = 16,
                 rope: str = "pairs"):
        self.attention = Attention(dim, n_heads, n_kv_heads, rope)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm, self.ffn_norm = RMSNorm(dim, eps=1e-5), RMSNorm(dim, eps=1e-5)
        self.max_len = max_len

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class TinyLlama:
    """Token embedding, several llama blocks, a final RMSNorm and an output projection.

    ``rope="pairs"`` rotates channel pairs as tinygrad's own llama does; ``rope="half"`` rotates halves
    as HF's llama does. ``start_pos`` offsets the positions (tinygrad llama's argument, without its KV
    cache: the tokens attend to each other only).
    """

    def __init__(self, vocab: int = 64, dim: int = 32, n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2,
                 hidden: int = 64, max_len: int = 16, rope: str = "pairs"):
        self.tok_embeddings = Embedding(vocab, dim)
        self.layers = [LlamaBlock(dim, n_heads, n_kv_heads, hidden, max_len, rope) for _ in range(n_layers)]
        self.norm = RMSNorm(dim, eps=1e-5)
        self.output = Linear(dim, vocab, bias=False)
        self.cos, self.sin = rotary_tables(dim // n_heads, max_len, halves=rope == "half")

    def __call__(self, tokens: Tensor, start_pos: int = 0) -> Tensor:
        t = tokens.shape[1]
        cos, sin = self.cos[start_pos:start_pos + t], self.sin[start_pos:start_pos + t]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def mlp_factory() -> tuple[MLP, list[Tensor]]:
    """For ``torch-ir import-tinygrad tests.tinygrad.models:mlp_factory``."""
    return realize_weights(MLP((4, 8, 2))), [Tensor(np.ones((3, 4), dtype=np.float32))]


LLAMA_CONFIG = dict(vocab=32, dim=16, n_layers=2, n_heads=4, n_kv_heads=2, hidden=32, max_len=16)


def tiny_llama_factory() -> tuple[TinyLlama, list[Tensor]]:
    """For ``torch-ir import-tinygrad tests.tinygrad.models:tiny_llama_factory`` (docs/tinygrad.md's end to end)."""
    model = realize_weights(TinyLlama(**LLAMA_CONFIG, rope="half"), seed=3)
    return model, [Tensor(np.array([[1, 5, 9, 2, 7]], dtype=np.int32))]
