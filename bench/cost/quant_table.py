"""What quantization buys on a described NPU: ResNet-50 and a Qwen2.5-0.5B-shaped LLM costed at fp32, w8a8 and
w4a16 (``cost_program(precision=...)``), per model and precision: the weights stored, the DRAM bytes of one
inference (weights and activations), cycles and latency.

    .venv/bin/python bench/cost/quant_table.py                       # edge_4tops, both models
    .venv/bin/python bench/cost/quant_table.py --hw tpu_v1 --only resnet50 --precisions fp32 w8a8 w4a8

Both models are built weight-free on the meta device and compiled as float programs; each precision is the cost
model's by-role sizing of that float program (weights of contractions as int8 or int4 codes plus their scales,
activations int8 or float16; see ``npu_compiler.costmodel.precision``), not a program the quantizer made. ResNet-50:
transformers' ResNetForImageClassification with ResNet-50's configuration (torchvision's shapes: 25.6 M
parameters), batch 1 at 224 x 224. Qwen2.5-0.5B-shaped: transformers' Qwen2 with the published configuration
(hidden 896, 24 layers, 14 query and 2 key/value heads, FFN 4864, vocabulary 151,936, tied embeddings), a KV cache
of ``--cache`` positions, one decode step at ``--context`` live positions. A quantized precision the hardware has
no rate for (w4a16 on an NPU without fp16, say) prints its refusal in the row; a float one it lacks (fp32 on
edge_4tops) is costed at its slowest supported rate and flagged in the notes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402

import torch_ir  # noqa: E402
from npu_compiler import compile as compile_ir  # noqa: E402
from npu_compiler.costmodel import CostModelError, cost_program, load_hardware  # noqa: E402
from npu_compiler.costmodel.precision import PRECISIONS  # noqa: E402


def resnet50() -> object:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(embedding_size=64, num_labels=1000, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                          layer_type="bottleneck")
    with torch_ir.build_on_meta():
        model = ResNetForImageClassification(config).eval()
    ir = torch_ir.extract_ir(model, (torch.empty(1, 3, 224, 224, device="meta"),), model_name="resnet50")
    return compile_ir(ir)


def qwen25_05b(cache: int) -> object:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from npu_compiler.llm import compile_lm
    from torch_ir.frontends.hf import extract_lm

    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)
    with torch_ir.build_on_meta():
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return compile_lm(extract_lm(model, cache, name="qwen2.5-0.5b-shaped"), chunk=8).decode


def row(name: str, program: object, hw: object, precision: str, context: int | None) -> str:
    try:
        r = cost_program(program, hw, precision=precision, context=context)
    except CostModelError as err:
        return f"| {name} | {precision} | refused: {err} ||||||"
    return (f"| {name} | {precision} | {r.weights_stored / 1e6:,.2f} | {r.dram_bytes / 1e6:,.2f} "
            f"({r.weight_bytes / 1e6:,.2f} + {r.activation_bytes / 1e6:,.2f}) | {r.total_cycles:,} | "
            f"{r.latency_ms:,.3f} | {r.width_mix()} | {'; '.join(sorted({f for x in r.rows for f in x.flags}))} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hw", default="edge_4tops", help="a preset or a hardware file (default: edge_4tops)")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "w8a8", "w4a16"], choices=list(PRECISIONS))
    ap.add_argument("--only", choices=["resnet50", "qwen"], help="one model")
    ap.add_argument("--cache", type=int, default=512, help="the LLM's KV cache positions (default: 512)")
    ap.add_argument("--context", type=int, default=256, help="live positions of the decode step (default: 256)")
    args = ap.parse_args()
    hw = load_hardware(args.hw)
    rates = ", ".join(f"{w} {hw.mac_rate(w):g}" for w in ("int4", "int8", "int16", "fp16", "fp32"))
    print(f"hardware: {hw.name} ({hw.described_in}): {hw.rows}x{hw.cols} {hw.dataflow}, {hw.clock_mhz:g} MHz, "
          f"{hw.dram_bandwidth_gbps:g} GB/s; MACs per PE per cycle: {rates}\n")
    models = []
    t0 = time.perf_counter()
    if args.only in (None, "resnet50"):
        models.append(("ResNet-50 (1x3x224x224)", resnet50(), None))
    if args.only in (None, "qwen"):
        models.append((f"Qwen2.5-0.5B-shaped decode (context {args.context}/{args.cache})", qwen25_05b(args.cache),
                       args.context))
    print(f"built and compiled in {time.perf_counter() - t0:.0f} s\n")
    print("| model | precision | weights stored (MB) | DRAM MB (weights + activations) | cycles | ms | compute "
          "widths (dispatches, share of cycles) | notes |")
    print("|---|---|---|---|---|---|---|---|")
    for name, program, context in models:
        for precision in args.precisions:
            print(row(name, program, hw, precision, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
