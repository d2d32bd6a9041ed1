"""Quantization accuracy figures, reproducibly: a Qwen2-shaped LLM at w4a16 g128 and w8a16 (next-token KLD and top-1
agreement against float, llama.cpp's method, with and without an int8 KV cache), and a mixed-precision search on a
seeded ResNet-18 costed on a hardware description (the accuracy/latency table and its Pareto front).

    .venv/bin/python bench/quant/accuracy.py [--layers 2] [--hidden 896] [--windows 32] [--size 64]
        [--base w8a8] [--ladder float] [--hw edge_4tops] [--target-sqnr 30] [-o DIR]

Seeded random weights (nothing is downloaded); the Qwen2 shape is Qwen2.5-0.5B's per layer (hidden 896, 14 heads,
2 KV heads, MLP 4864) with fewer layers and a 32k vocabulary so the reference executor runs it in seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def qwen2(layers: int, hidden: int, cache: int):
    from transformers import AutoModelForCausalLM, Qwen2Config

    import torch_ir
    from torch_ir.frontends.hf import extract_lm

    config = Qwen2Config(vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 16 // 3 // 64 * 64 + 64,
                         num_hidden_layers=layers, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=cache, tie_word_embeddings=True)
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch_ir.build_on_meta():
        meta = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return real, extract_lm(meta, cache)


def llm_table(args: argparse.Namespace) -> list[str]:
    from npu_compiler.passes import normalize
    from npu_compiler.quantize import get_preset, quantize
    from npu_compiler.quantize.report import compare_quantized
    from torch_ir.weights import module_state

    real, ir = qwen2(args.layers, args.hidden, args.tokens)
    float_ir = normalize(ir)
    state = dict(module_state(real))
    for w in float_ir.weights:  # the static KV cache starts empty: a checkpoint never holds it
        key = float_ir.weight_name_mapping.get(w.name, w.name)
        if w.name in float_ir.mutations and key not in state:
            state[key] = torch.zeros([int(d) for d in w.shape])
    g = torch.Generator().manual_seed(1)

    def window(n: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.randint(10, 32000, (1, n), generator=g), "cache_position": torch.arange(n)}

    # the IR's logits are the last position's: one next-token distribution per window
    evals = [window(args.tokens) for _ in range(args.windows)]
    calib = [window(args.tokens) for _ in range(4)]
    lines = ["| preset | KV cache | mean KLD | p99 KLD | top-1 agreement | output SQNR dB | seconds |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for preset, kv in (("w8a16", None), ("w4a16", None), ("w4a16", 8)):
        t = time.perf_counter()
        config = replace(get_preset(preset), kv_bits=kv)
        qir, qw = quantize(float_ir, state, config, calibration=calib if kv else None)
        report = compare_quantized(float_ir, state, qir, qw, evals, logits=float_ir.graph_outputs[0].name)
        tok = report.tokens
        lines.append(f"| {preset}{' g128' if preset == 'w4a16' else ''} | {'int8' if kv else 'float'} | "
                     f"{tok.mean_kld:.5f} | {tok.p99_kld:.5f} | {tok.top1_pct:.1f} % | {report.output_sqnr_db:.1f} | "
                     f"{time.perf_counter() - t:.0f} |")
    return lines


def resnet18(size: int):
    """transformers' ResNet-18 (basic blocks 2-2-2-2, widths 64-512), seeded, batch norms with statistics that are
    not the identity; (real model, its weight-free IR)."""
    from transformers import ResNetConfig, ResNetForImageClassification

    import torch_ir

    config = ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                          embedding_size=64, num_labels=100)
    torch.manual_seed(0)
    real = ResNetForImageClassification(config).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in real.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)
    with torch_ir.build_on_meta():
        meta = ResNetForImageClassification(config).eval()
    return real, torch_ir.extract_ir(meta, (torch.zeros(1, 3, size, size),), model_name="resnet18")


def mixed_table(args: argparse.Namespace) -> list[str]:
    from npu_compiler.passes import normalize
    from npu_compiler.quantize import get_preset, quantize
    from npu_compiler.quantize.report import Target, propose_mixed_precision, write_report
    from torch_ir.weights import module_state

    real, ir = resnet18(args.size)
    float_ir = normalize(ir)
    g = torch.Generator().manual_seed(2)
    calib = [(torch.randn(1, 3, args.size, args.size, generator=g),) for _ in range(8)]
    evals = [(torch.randn(1, 3, args.size, args.size, generator=g),) for _ in range(4)]
    report = propose_mixed_precision(float_ir, module_state(real), get_preset(args.base), calib, evals,
                                     target=Target(min_sqnr_db=args.target_sqnr), quantize_fn=quantize,
                                     hardware=args.hw, ladder=tuple(None if p == "float" else p
                                                                    for p in args.ladder.split(",")),
                                     rank="noise")
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        write_report(report, args.output)
    lines = [f"ResNet-18 ({args.size}x{args.size}) from {args.base}, layers widened through {args.ladder} (most "
             f"noise first) until the output SQNR >= {args.target_sqnr} dB, costed on {args.hw}:", "",
             "| step | kind | widened | output SQNR dB | cycles | DRAM bytes | latency ms | Pareto |",
             "|---:|---|---|---:|---:|---:|---:|---|"]
    for a in report.assignments:
        row = a.row()
        lines.append(f"| {row['step']} | {row['kind']} | {row['widened']} | {row['output_sqnr_db']:.1f} | "
                     f"{row['cycles']} | {row['dram_bytes']} | {row['latency_ms']:.3f} | "
                     f"{'yes' if row['pareto'] else ''} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--tokens", type=int, default=16, help="tokens per evaluation window")
    p.add_argument("--windows", type=int, default=32, help="evaluation windows (next-token distributions)")
    p.add_argument("--size", type=int, default=64, help="the ResNet-18's input size")
    p.add_argument("--base", default="w8a8", help="the mixed-precision search's starting preset")
    p.add_argument("--ladder", default="float", help="what a layer is widened through, narrowest first")
    p.add_argument("--hw", default="edge_4tops")
    p.add_argument("--target-sqnr", type=float, default=30.0)
    p.add_argument("--skip-llm", action="store_true")
    p.add_argument("-o", "--output", type=Path, help="also write the mixed-precision report files here")
    args = p.parse_args()
    if not args.skip_llm:
        print("\n".join(llm_table(args)), flush=True)
        print()
    print("\n".join(mixed_table(args)))


if __name__ == "__main__":
    main()
