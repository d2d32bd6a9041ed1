"""The int8 KV cache (``compile_lm(..., kv_bits=8)``) against the float cache: cache bytes, decode ms/token at a long
context, and the KLD of the next-token distributions, in one process, alternating.

    .venv/bin/python bench/llm/kv_cache.py                          # context 1024 of a 2048-position cache
    .venv/bin/python bench/llm/kv_cache.py --context 1536 --dtype bfloat16 --repeats 3

The model is a Qwen2 config with Qwen2.5-0.5B's attention shape (14 query heads, 2 key/value heads, head_dim 64)
and a few layers, seeded random weights scaled by ``--weight-scale`` (at the init's std 0.02 the distributions are
nearly uniform and the KLD says nothing); nothing is downloaded. Decode at a long context is where the cache
matters: each step reads all live keys and values, so an int8 cache reads about a quarter (fp32) or half (bf16) of
the bytes.
The KLD is teacher-forced: the int8 programs see the float cache's greedy tokens. Timings on a shared machine are
indicative: compare the two columns of one run only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def build(dtype: torch.dtype, layers: int, cache: int, scale: float = 3.0):
    from transformers import AutoModelForCausalLM, Qwen2Config

    import torch_ir
    from torch_ir.frontends.hf import extract_lm
    from torch_ir.weights import module_state

    config = Qwen2Config(vocab_size=2048, hidden_size=896, intermediate_size=1024, num_hidden_layers=layers,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=cache,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    with torch_ir.build_on_meta():
        meta = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    weights = {k: v * scale if k.endswith((".weight", ".bias")) and "norm" not in k else v
               for k, v in module_state(real).items()}
    return extract_lm(meta, cache), weights


def generator(ir, weights, kv_bits: int | None, chunk: int):
    from npu_compiler.llm import compile_lm
    from npu_runtime import Device, load_weights
    from npu_runtime.generate import Generator

    programs = compile_lm(ir, chunk=chunk, kv_bits=kv_bits)
    device = Device()
    gen = Generator(programs.prefill, programs.decode, load_weights(weights, programs.prefill, device), device)
    return programs, gen


def attention_kernels(context: int, cache: int, repeats: int = 200) -> dict[str, float]:
    """Median µs of one decode step's attention over a cache of ``cache`` positions, ``context`` of them live: the
    float kernel (``cpu_transformer.Attention``) over fp32 k/v, the int8 one (``cpu_kvcache.KvqAttention``) over
    codes and scales; alternating calls, the same mask."""
    from npu_program.program import Dispatch, TensorSpec
    from npu_runtime.backends.cpu_kvcache import KvqAttention
    from npu_runtime.backends.cpu_transformer import Attention
    from torch_ir.ops.npu_kvcache import quantize_kv

    q, k, v = torch.randn(1, 14, 1, 64), torch.randn(1, 2, cache, 64), torch.randn(1, 2, cache, 64)
    (kc, ks), (vc, vs) = quantize_kv(k), quantize_kv(v)
    mask = (torch.arange(cache) < context).view(1, 1, 1, cache)
    out = torch.empty(1, 1, 14 * 64)
    specs = {"q": TensorSpec("q", [1, 14, 1, 64], "float32"), "k": TensorSpec("k", [1, 2, cache, 64], "float32"),
             "v": TensorSpec("v", [1, 2, cache, 64], "float32"), "m": TensorSpec("m", [1, 1, 1, cache], "bool"),
             "kc": TensorSpec("kc", [1, 2, cache, 64], "int8"), "ks": TensorSpec("ks", [1, 2, cache], "float32"),
             "vc": TensorSpec("vc", [1, 2, cache, 64], "int8"), "vs": TensorSpec("vs", [1, 2, cache], "float32"),
             "y": TensorSpec("y", [1, 1, 14 * 64], "float32")}
    params = {"scale": 0.125, "causal": False, "merge_heads": True}
    plain = Attention(Dispatch("ATTENTION", "a", ["q", "k", "v", "m"], ["y"], params), specs)
    quant = KvqAttention(Dispatch("KVQ_ATTENTION", "a", ["q", "kc", "ks", "vc", "vs", "m"], ["y"], params), specs)
    runs = {"float": (plain, [q, k, v, mask]), "int8": (quant, [q, kc, ks, vc, vs, mask])}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (kernel, inputs) in runs.items():
            t = time.perf_counter()
            kernel.run(inputs, [out])
            times[name].append((time.perf_counter() - t) * 1e6)
    return {name: statistics.median(ts) for name, ts in times.items()}


def kld(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p = torch.log_softmax(torch.as_tensor(p_logits, dtype=torch.float64), -1)
    q = torch.log_softmax(torch.as_tensor(q_logits, dtype=torch.float64), -1)
    return float((p.exp() * (p - q)).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens before decoding (default: 1024)")
    ap.add_argument("--cache", type=int, default=2048, help="KV cache positions (default: 2048)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--kld-steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--weight-scale", type=float, default=3.0,
                    help="the random weights (std 0.02) times this (default 3: peaked distributions, attention "
                         "logits of a plausible size; at 10 the attention logits are huge and any key error flips "
                         "which position wins)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    # first, before any program runs: measured after them, the same calls were 70x slower on the 2-core machine
    kernels = {live: attention_kernels(live, args.cache) for live in (args.context, args.cache)}
    ir, weights = build(dtype, args.layers, args.cache, args.weight_scale)
    runs = {name: generator(ir, weights, bits, 64) for name, bits in (("float", None), ("int8", 8))}
    prompt = torch.randint(4, 2048, (args.context,), generator=torch.Generator().manual_seed(1)).tolist()
    times: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.repeats):  # alternating, so both see the same machine
        for name, (_, gen) in runs.items():
            result = gen.generate(prompt, args.new_tokens)
            times[name].append(result.ms_per_token)
            tokens[name] = result.tokens
    ref = runs["float"][1].generate(prompt, args.kld_steps, keep_logits=True)
    started = time.perf_counter()
    klds = [kld(ref.logits[i], runs["int8"][1].generate(prompt + ref.tokens[:i], 1, keep_logits=True).logits[0])
            for i in range(args.kld_steps)]
    print(f"model: Qwen2 {args.layers} layers, 14/2 heads x 64, {args.dtype}, weights x{args.weight_scale:g}; "
          f"cache {args.cache} positions; "
          f"context {args.context}; {args.repeats} alternating repeats of {args.new_tokens} tokens")
    print(f"{'cache':<6} {'bytes':>12} {'decode ms/token (median)':>26} {'runs':>30}")
    for name, (programs, _) in runs.items():
        ms = times[name]
        print(f"{name:<6} {programs.decode.state_bytes:>12,} {statistics.median(ms):>26.2f} "
              f"{', '.join(f'{m:.2f}' for m in ms):>30}")
    same = sum(a == b for a, b in zip(tokens["float"], tokens["int8"]))
    for live, us in kernels.items():
        print(f"one attention step, 14/2 heads x 64, {live} of {args.cache} positions live (fp32 q): float "
              f"{us['float']:.0f} µs, int8 {us['int8']:.0f} µs (medians of 200, alternating)")
    print(f"KLD(float || int8) over {args.kld_steps} teacher-forced steps: mean {np.mean(klds):.2e}, "
          f"max {max(klds):.2e}; free-running greedy tokens equal: {same}/{args.new_tokens} "
          f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
