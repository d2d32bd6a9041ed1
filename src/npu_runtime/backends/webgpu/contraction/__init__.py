"""WGSL generators of the contraction kernels: GEMM, GATE_UP, QKV_PROJ, CONV (with its residual add), and the ATen
matrix products (mm, bmm, matmul, baddbmm).

Every one of them is the same batched product ``C[b, m, n] = sum_k A(b, m, k) · B(b, n, k)`` with its own
operand loads (``Load``: WGSL functions of (b, row, k), layout-aware) and epilogue (bias, folded batch norm,
residual, activation, the output's index mapping), run by one of two kernels:

* the *tiled* kernel: a workgroup of 8x8 invocations computes a 64x64 tile of C, 8x8 outputs per invocation,
  staging 16-deep slices of A and B through workgroup memory as vec4s, double-buffered (one barrier per
  slice); any M, N, K (the edges load zeros);
* the *GEMV* kernel, when C has at most ``GEMV_ROWS`` rows and B is the same for every batch (one-token LLM
  decode): a workgroup of 32 invocations computes 8 outputs n, the invocations splitting K, reading B's rows
  coalesced (two bfloat16/float16 values per u32 word where the layout allows), then a tree reduction in
  workgroup memory.

A weight in GGUF blocks (q8_0, q4_0, q5_0, q4_K, q6_K; ``blocks``) is read where it lies: the GEMV rows run the block
GEMV (``qgemv``), the tiled kernel's loads decode it element by element.

A convolution is an implicit GEMM over NHWC (M = output pixels, N = output channels of a group, K = kernel
window x input channels of the group, channels fastest, so A's loads are contiguous), batched over groups; a
1x1 convolution of stride 1 is a plain GEMM over the NHWC pixels; depthwise and other narrow-group
convolutions run a direct kernel (one invocation per output). Floating tensors accumulate in f32 (rounded
once, at the store), integer ones in i32.

The pieces live in ``operands`` (offsets, operand loads, the ``Contraction`` and what the generators share),
``tiled`` and ``gemv`` (the two kernels; ``kernel.run`` picks one), and the generators by family in ``linear``
(GEMM, GATE_UP, QKV_PROJ), ``products`` (the ATen matrix products) and ``convolution``; the kernel table names
them from this package (``gpu("contraction", "gemm")``).
"""

from .convolution import DIRECT_CONV_CHANNELS, conv
from .gemv import GEMV_OUTS, GEMV_RADIX, GEMV_ROWS, GEMV_THREADS
from .kernel import run
from .linear import gate_up, gemm, qkv_proj
from .operands import Contraction, Load
from .products import baddbmm, matmul
from .qcontraction import qconv, qgemm
from .tiled import TILING, Tiling

__all__ = ["DIRECT_CONV_CHANNELS", "GEMV_OUTS", "GEMV_RADIX", "GEMV_ROWS", "GEMV_THREADS", "TILING", "Contraction",
           "Load", "Tiling", "baddbmm", "conv", "gate_up", "gemm", "matmul", "qconv", "qgemm",
           "qkv_proj", "run"]
