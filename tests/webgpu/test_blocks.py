"""GGUF block-quantized weights on the WebGPU backend (``webgpu/contraction/blocks.py``, ``qgemv.py``): GEMM,
GATE_UP and QKV_PROJ over q8_0, q4_0, q5_0, q4_K and q6_K blocks read where they lie, at decode rows (the block GEMV)
and prefill rows (the tiled kernel), against llama.cpp's own Python dequantization (``gguf.quants``) and a
float64 product; a small model compiled with block-quantized weights against the CPU backend on the dequantized
floats; and the refusal of any other kernel given block bytes.

Random blocks as ``tests/gguf/test_blocks.py`` makes them: random bytes, finite fp16 scales written over theirs."""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as ref_dequantize

import npu_compiler
import torch_ir
from npu_compiler import CompileOptions
from npu_runtime import Device, Executor, NPUBuffer, load_weights
from npu_runtime.backends.webgpu.contraction import GEMV_ROWS
from npu_runtime.device import RuntimeInputError, new_tensor
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.quant.spec import BLOCK_BYTES, BLOCK_CODES, BLOCKS, QuantSpec

from .kernels import needs_gpu

pytestmark = needs_gpu

GROUP = {"q8_0": 32, "q4_0": 32, "q5_0": 32, "q4_K": 32, "q6_K": 16}  # elements sharing a scale (and a min)
SCALE_OFFSETS = {"q8_0": (0,), "q4_0": (0,), "q5_0": (0,), "q4_K": (0, 2), "q6_K": (208,)}
EPS32 = float(np.finfo(np.float32).eps) / 2  # unit roundoff


def random_blocks(block: str, n: int, k: int, seed: int, spread: int = 8, scale: float = 1.0) -> np.ndarray:
    """uint8 [n, k / elements · bytes]: random codes, fp16 scales of magnitudes ``scale`` · 2^-spread .. 2^spread
    (signed; subnormals among them where that range reaches below fp16's normals)."""
    rng = np.random.default_rng(seed)
    count = n * k // BLOCKS[block]
    raw = rng.integers(0, 256, size=(count, BLOCK_BYTES[block]), dtype=np.uint8)
    for off in SCALE_OFFSETS[block]:
        exponents = rng.integers(-spread, spread + 1, count)
        scales = (scale * rng.standard_normal(count) * np.exp2(exponents)).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(count, 2)
    return raw.reshape(n, -1)


def dequantized(raw: np.ndarray, block: str) -> np.ndarray:
    return ref_dequantize(raw, gguf.GGMLQuantizationType[block.upper()]).astype(np.float64)


def bound(x: np.ndarray, w: np.ndarray, block: str) -> np.ndarray:
    """An fp32 error bound of x @ wᵀ [m, n] as the kernels sum it (the float64 reference's own error is far below).
    Each group adds a · Σ q x + b · Σ x, whose terms are at most 3 · g |x_k|, g the largest |w| of the group (a
    code of 0 gives b itself, and |a q| ≤ |w| + |b|). A sum of terms rounds to within (depth) · u · Σ |terms|
    (Higham): the GEMV (rows ≤ GEMV_ROWS) sums a group's codes, then its groups and a tree of partial sums,
    depth ≤ G + K / G + 8; the tiled kernel (prefill) sums along K, depth ≤ K + 8. Twice that, for slack."""
    (m, k), size = x.shape, GROUP[block]
    g = np.repeat(np.abs(w).reshape(w.shape[0], k // size, size).max(-1), size, axis=-1)
    depth = (size + k // size if m <= GEMV_ROWS else k) + 8
    return 2 * depth * EPS32 * 3 * (np.abs(x).astype(np.float64) @ g.T) + 1e-30


def run_one(kernel: str, x: np.ndarray, weights: dict[str, tuple[np.ndarray, str | None, list[int]]],
            outs: list[list[int]], params: dict[str, Any]) -> list[np.ndarray]:
    """A one-node program of ``kernel`` compiled for webgpu: input x, then ``weights`` (name: (data, block or None,
    logical shape)) in order; its outputs."""
    xm = TensorMeta("x", list(x.shape), "float32", role="input")
    wm = [TensorMeta(name, shape, "float32", role="weight",
                     quant=QuantSpec(dtype=BLOCK_CODES[b], block=b) if b else None)
          for name, (_, b, shape) in weights.items()]
    om = [TensorMeta(f"out{j}", shape, "float32") for j, shape in enumerate(outs)]
    ir = NPU_IR(model_name=f"block_{kernel}", graph_inputs=[xm], graph_outputs=om, weights=wm,
                nodes=[OpNode("k0", kernel, [xm, *wm], om, params)])
    program = npu_compiler.compile(ir, target="webgpu", options=CompileOptions(normalize=False, fuse=False,
                                                                                public_output_names=False))
    assert [d.kernel for d in program.dispatches] == [kernel]
    device = Device("webgpu")
    spec = program.input_specs[0]
    bound_weights = load_weights({name: data for name, (data, _, _) in weights.items()}, program, device)
    got = Executor(program, device).run({"x": NPUBuffer(new_tensor(device, spec, x), spec, device)},
                                        weights=bound_weights)
    return [got[s.name].to_numpy() for s in program.output_specs]


@pytest.mark.parametrize(("block", "m", "n", "k"), [
    ("q8_0", 1, 20, 96),  # N no multiple of the 8 outputs of a workgroup; odd blocks per row (2-byte aligned rows)
    ("q4_0", 3, 9, 160),
    ("q5_0", 3, 9, 160),  # 22-byte blocks: qh at addresses ≡ 2 and ≡ 0 (mod 4)
    ("q5_0", 6, 10, 96),  # prefill rows: the tiled kernel
    ("q4_K", 4, 16, 512),
    ("q6_K", 2, 11, 256),  # groups of 16; rows 2-byte aligned
    ("q4_K", 6, 10, 256),  # prefill rows: the tiled kernel
    ("q6_K", 5, 7, 512),
])
def test_gemm_blocks_with_bias_and_residual(block, m, n, k):
    rng = np.random.default_rng(m * n + k)
    raw = random_blocks(block, n, k, seed=k + n)
    w = dequantized(raw, block)
    assert np.isfinite(w).all()
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    (got,) = run_one("GEMM", x, {"w": (raw, block, [n, k]), "b": (bias, None, [n]), "r": (res, None, [m, n])},
                     [[m, n]], {"trans_b": True, "has_bias": True, "has_residual": True})
    want = x.astype(np.float64) @ w.T + bias + res
    assert np.all(np.abs(got - want) <= bound(x, w, block) + 4 * EPS32 * np.abs(want)), np.abs(got - want).max()


@pytest.mark.parametrize(("m", "blocks"), [(1, ("q4_K", "q6_K")), (2, ("q8_0", "q8_0")), (5, ("q4_0", "q4_K")),
                                         (1, ("q5_0", "q8_0"))])
def test_gate_up_blocks(m, blocks):
    k, n = 256, 12
    rng = np.random.default_rng(m)
    raws = [random_blocks(b, n, k, seed=10 * m + j, spread=2) for j, b in enumerate(blocks)]
    gate, up = (dequantized(r, b) for r, b in zip(raws, blocks))
    x = (rng.standard_normal((m, k)) * 0.05).astype(np.float32)
    (got,) = run_one("GATE_UP", x, {"g": (raws[0], blocks[0], [n, k]), "u": (raws[1], blocks[1], [n, k])},
                     [[m, n]], {"trans_b": True, "has_bias": False})
    g64, u64 = x.astype(np.float64) @ gate.T, x.astype(np.float64) @ up.T
    want = g64 / (1 + np.exp(-g64)) * u64
    # silu(g) · u: the errors of g and u scaled by the other factor (|silu'| < 1.1), and a few roundings of the result
    err = bound(x, gate, blocks[0]) * 1.1 * np.abs(u64) + bound(x, up, blocks[1]) * np.abs(g64 / (1 + np.exp(-g64)))
    assert np.all(np.abs(got - want) <= err * 1.01 + 8 * EPS32 * np.abs(want) + 1e-30), np.abs(got - want).max()


@pytest.mark.parametrize("m", [2, 6])
def test_qkv_proj_mixed_layouts_heads_first(m):
    """q and k in q4_K, v in q6_K (as a Q4_K_M file holds them), k and v narrower (grouped-query), with biases,
    stored head-major: the block GEMV reads all three at q6_K's 16-element groups."""
    k, widths, head = 256, (16, 8, 8), 4
    blocks = ("q4_K", "q4_K", "q6_K")
    rng = np.random.default_rng(m)
    raws = [random_blocks(b, w, k, seed=j, spread=2) for j, (b, w) in enumerate(zip(blocks, widths))]
    biases = [rng.standard_normal(w).astype(np.float32) for w in widths]
    x = rng.standard_normal((1, m, k)).astype(np.float32)
    weights = {f"w{j}": (raws[j], blocks[j], [widths[j], k]) for j in range(3)}
    weights.update({f"b{j}": (biases[j], None, [widths[j]]) for j in range(3)})
    outs = [[1, w // head, m, head] for w in widths]
    got = run_one("QKV_PROJ", x, weights, outs, {"splits": list(widths), "packed": False, "trans_b": True,
                                                  "has_bias": [True] * 3, "heads_first": True, "head_dim": head})
    for j in range(3):
        w = dequantized(raws[j], blocks[j])
        flat = x[0].astype(np.float64) @ w.T + biases[j]
        want = flat.reshape(m, widths[j] // head, head).transpose(1, 0, 2)[None]
        tol = bound(x[0], w, blocks[j]) + 4 * EPS32 * np.abs(flat)
        tol = tol.reshape(m, widths[j] // head, head).transpose(1, 0, 2)
        assert np.all(np.abs(got[j] - want) <= tol[None]), (j, np.abs(got[j] - want).max())


def test_a_kernel_that_cannot_read_blocks_is_refused_when_the_executor_is_built():
    """An embedding table in q8_0 blocks: the WebGPU EMBEDDING reads floats, so the executor refuses the program
    naming the tensor and the layout instead of reading the block bytes as floats."""
    table = TensorMeta("table", [10, 32], "float32", role="weight", quant=QuantSpec(dtype="int8", block="q8_0"))
    ids = TensorMeta("ids", [3], "int64", role="input")
    out = TensorMeta("out", [3, 32], "float32")
    ir = NPU_IR(model_name="embed", graph_inputs=[ids], graph_outputs=[out], weights=[table],
                nodes=[OpNode("k0", "EMBEDDING", [table, ids], [out], {})])
    program = npu_compiler.compile(ir, target="webgpu", options=CompileOptions(normalize=False, fuse=False))
    with pytest.raises(RuntimeInputError, match=r"'table'.*q8_0"):
        Executor(program, Device("webgpu"))


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(256, 64)
        self.down = torch.nn.Linear(64, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.up(x))) + x[..., :8]


@pytest.mark.parametrize("rows", [1, 7])
def test_compiled_model_with_block_weights_equals_the_cpu_on_their_floats(rows):
    """A module compiled with its Linear weights marked q4_K and q8_0 (GEMM, fused SiLU, fused residual) runs on
    WebGPU from the blocks; the same IR with float weights, the blocks dequantized, runs on the CPU backend."""
    with torch.device("meta"):
        meta = _MLP()
    ir = torch_ir.extract_ir(meta, (torch.empty(1, rows, 256, device="meta"),), model_name="mlp")
    floats = npu_compiler.compile(ir, target="cpu")
    layouts = {"p_up_weight": "q4_K", "p_down_weight": "q8_0"}
    for m in [*ir.weights, *(t for node in ir.nodes for t in node.inputs)]:
        if m.name in layouts:
            m.quant = QuantSpec(dtype=BLOCK_CODES[layouts[m.name]], block=layouts[m.name])
    program = npu_compiler.compile(ir, target="webgpu")
    assert [s.name for s in program.weight_specs if s.quant is not None] == list(layouts)
    torch.manual_seed(0)
    state = {k: v.detach() for k, v in _MLP().state_dict().items()}
    raw = {"up.weight": random_blocks("q4_K", 64, 256, seed=1, spread=2, scale=1e-3),
           "down.weight": random_blocks("q8_0", 8, 64, seed=2, spread=2, scale=1e-2)}
    values = {**state, **{key: torch.from_numpy(dequantized(r, b).astype(np.float32))
                          for (key, r), b in zip(raw.items(), ("q4_K", "q8_0"))}}
    x = torch.randn(1, rows, 256, generator=torch.Generator().manual_seed(rows)).numpy()
    cpu = Device("cpu")
    want = Executor(floats, cpu).run({"x": x}, weights=load_weights(values, floats, cpu))["output"].to_numpy()
    gpu = Device("webgpu")
    bound_weights = load_weights({**state, **{k: torch.from_numpy(v) for k, v in raw.items()}}, program, gpu)
    got = Executor(program, gpu).run({"x": x}, weights=bound_weights)["output"].to_numpy()
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
