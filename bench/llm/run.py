"""LLM prefill and decode: our compiled programs (CPU backend) against Hugging Face eager ``generate``.

    .venv/bin/python bench/llm/run.py                                  # Qwen2.5-0.5B, fp32 and bf16
    .venv/bin/python bench/llm/run.py --models qwen2.5-0.5b,qwen2.5-1.5b --new-tokens 24
    .venv/bin/python bench/llm/run.py --table-only                     # seed 004's dispatch table, no timing

The models are Qwen2.5-0.5B and Qwen2.5-1.5B as their ``config.json`` describes them (written out below)
with seeded random weights; nothing is downloaded. For each model and dtype, in one process:

* **ours**: the model built on the meta device, extracted with a static KV cache (``extract_lm``),
  compiled into a prefill program of ``--prompt`` tokens and a one-token decode program (``compile_lm``),
  run by ``npu_runtime.Generator`` on the weights of the eager model (shared, not copied);
* **HF eager**: ``model.generate`` with its default (dynamic) cache, greedy, timed per step by a logits
  processor (the first call ends prefill, each later one ends a decode step);
* **floor**: the weight bytes one decode step must read (every weight a decode dispatch reads; of an
  embedding table, one row) divided by this machine's streaming read bandwidth, measured in the same run
  (``measure_stream_bandwidth`` of ``bench/gemv/bandwidth.py``). No decoder can beat it on this machine:
  decode is a GEMV per weight matrix, and a GEMV reads each weight once.

Both generate the same number of greedy tokens from the same prompt; the tokens are compared (equal in
fp32; in bf16 the first step where they differ, if any, is reported: bf16 rounding differs between our
kernels and PyTorch's). Reported: prefill ms, decode ms/token (median), tokens/s, × the floor,
dispatches/token and per layer, and the runtime's host overhead per dispatch (the dispatch loop and the
copies with every kernel skipped, ``npu_runtime.profile.host_overhead``). Targets (issue 14): decode
fp32 ≤ 1.15× the floor, bf16 ≤ 1.5× its floor, ≤ 14 dispatches per layer, prefill no slower than eager.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemv"))  # bandwidth.py, shared with bench/gemv

from bandwidth import measure_stream_bandwidth  # noqa: E402

import torch_ir  # noqa: E402
from npu_compiler.llm import compile_lm, fusion_table, run_dispatches, unfused_options  # noqa: E402
from npu_runtime import Device, load_weights  # noqa: E402
from npu_runtime.generate import Generator  # noqa: E402
from npu_runtime.profile import host_overhead  # noqa: E402
from torch_ir.frontends.hf import extract_lm  # noqa: E402
from torch_ir.weights import module_state  # noqa: E402

# From the models' config.json (Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-1.5B).
CONFIGS = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=True, use_sliding_window=False, bos_token_id=151643, eos_token_id=151643)
TARGETS = {"float32": 1.15, "bfloat16": 1.5}
MAX_DISPATCHES_PER_LAYER = 14


def config(name: str, dtype: torch.dtype) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**CONFIGS[name], **COMMON, dtype=dtype)


def build(name: str, dtype: torch.dtype, seed: int = 0) -> tuple[Any, Any]:
    """(eager model with seeded random weights, the same model on the meta device)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    real = AutoModelForCausalLM.from_config(config(name, dtype), attn_implementation="sdpa", dtype=dtype).eval()
    with torch_ir.build_on_meta():
        meta = AutoModelForCausalLM.from_config(config(name, dtype), attn_implementation="sdpa", dtype=dtype).eval()
    return real, meta


def decode_weight_bytes(program: Any) -> int:
    """Bytes of weights one decode run reads: each weight once, whole, except a table that only EMBEDDING reads
    (one row of it; a table tied to the LM head is read whole by the head)."""
    specs = {w.name: w for w in program.weight_specs}
    whole = {n for d in program.dispatches if d.kernel != "EMBEDDING" for n in d.inputs if n in specs}
    rows = {n for d in program.dispatches if d.kernel == "EMBEDDING" for n in d.inputs if n in specs} - whole
    return sum(specs[n].nbytes for n in whole) + sum(specs[n].nbytes // specs[n].shape[0] for n in rows)


def hf_generate(model: Any, prompt: torch.Tensor, new_tokens: int) -> tuple[list[int], float, list[float]]:
    """(tokens, prefill seconds, seconds of each decode step) of eager ``generate``, timed by a logits processor."""
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            stamps.append(time.perf_counter())
            return scores

    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                             do_sample=False, logits_processor=LogitsProcessorList([Stamp()]), eos_token_id=None,
                             pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist(), stamps[0] - start, list(np.diff(stamps))


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def bench_one(name: str, dtype_name: str, args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    dtype = getattr(torch, dtype_name)
    t0 = time.perf_counter()
    real, meta = build(name, dtype)
    ir = extract_lm(meta, args.prompt + args.new_tokens, name=name)
    programs = compile_lm(ir, prefill_buckets=[args.prompt])  # the prompt is one run of its own bucket
    compile_s = time.perf_counter() - t0
    device = Device()
    generator = Generator(programs.prefill, programs.decode, load_weights(module_state(real), programs.prefill,
                                                                          device), device)
    prompt = torch.randint(0, 151000, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    generator.generate(prompt[0].tolist(), 3)  # warm up: first-use costs (kernel preparation, page faults)
    hf_generate(real, prompt, 3)
    # alternating repeats: a neighbour's load hits both alike; prefill is the median of the repeats, decode the
    # median of every step of every repeat
    ours_runs, hf_runs = [], []
    for _ in range(args.repeats):
        ours_runs.append(generator.generate(prompt[0].tolist(), args.new_tokens))
        hf_runs.append(hf_generate(real, prompt, args.new_tokens))
    ours = ours_runs[0]
    ours.prefill_s = statistics.median(r.prefill_s for r in ours_runs)
    ours.decode_s = [t for r in ours_runs for t in r.decode_s]
    hf_tokens = hf_runs[0][0]
    hf_prefill = statistics.median(r[1] for r in hf_runs)
    hf_steps = [t for r in hf_runs for t in r[2]]
    inputs = {"input_ids": np.array([[ours.tokens[-1]]]), "cache_position": np.array([args.prompt])}
    loop_us, run_us = host_overhead(generator.decode_exec, inputs, runs=50)
    weight_bytes = decode_weight_bytes(programs.decode)
    floor_ms = weight_bytes / bandwidth * 1e3
    n = run_dispatches(programs.decode)
    row = {
        "model": name, "dtype": dtype_name, "layers": programs.num_layers, "build_compile_s": round(compile_s, 1),
        "weight_gb_per_token": weight_bytes / 1e9, "floor_ms": floor_ms,
        "ours_prefill_ms": ours.prefill_s * 1e3, "hf_prefill_ms": hf_prefill * 1e3,
        "ours_ms_per_token": ours.ms_per_token, "hf_ms_per_token": statistics.median(hf_steps) * 1e3,
        "dispatches_per_token": n, "dispatches_per_layer": n / programs.num_layers,
        "host_us_per_dispatch": run_us / n, "first_token_difference": first_difference(ours.tokens, hf_tokens),
    }
    row["ours_x_floor"] = row["ours_ms_per_token"] / floor_ms
    row["hf_x_floor"] = row["hf_ms_per_token"] / floor_ms
    del generator, real, meta
    gc.collect()
    return row


def print_rows(rows: list[dict[str, Any]], bandwidth: float) -> None:
    print(f"\nstreaming read bandwidth of this machine: {bandwidth / 1e9:.1f} GB/s (the floor's denominator)\n")
    head = (f"{'model':<13} {'dtype':<8} {'floor':>7} | {'prefill ms':>17} | {'decode ms/token':>17} | "
            f"{'× floor':>11} | {'tok/s':>5} {'disp/tok':>8} {'/layer':>6} {'host µs':>7} {'tokens':>9}")
    print(head)
    print(f"{'':<13} {'':<8} {'ms/tok':>7} | {'ours':>8} {'HF':>8} | {'ours':>8} {'HF':>8} | {'ours':>5} {'HF':>5} |"
          f" {'ours':>5} {'':>8} {'':>6} {'/disp':>7} {'vs HF':>9}")
    print("-" * len(head))
    for r in rows:
        same = "equal" if r["first_token_difference"] is None else f"differ@{r['first_token_difference']}"
        print(f"{r['model']:<13} {r['dtype']:<8} {r['floor_ms']:>7.1f} | {r['ours_prefill_ms']:>8.1f} "
              f"{r['hf_prefill_ms']:>8.1f} | {r['ours_ms_per_token']:>8.1f} {r['hf_ms_per_token']:>8.1f} | "
              f"{r['ours_x_floor']:>5.2f} {r['hf_x_floor']:>5.2f} | {1e3 / r['ours_ms_per_token']:>5.1f} "
              f"{r['dispatches_per_token']:>8} {r['dispatches_per_layer']:>6.1f} {r['host_us_per_dispatch']:>7.1f} "
              f"{same:>9}")
    print()
    for r in rows:
        target = TARGETS[r["dtype"]]
        per_layer = r["dispatches_per_layer"]
        checks = [(f"decode ≤ {target:.2f}× floor", r["ours_x_floor"] <= target),
                  (f"≤ {MAX_DISPATCHES_PER_LAYER} dispatches/layer", per_layer <= MAX_DISPATCHES_PER_LAYER),
                  ("prefill no slower than HF", r["ours_prefill_ms"] <= r["hf_prefill_ms"])]
        verdicts = ", ".join(f"{label} {'MET' if ok else 'MISSED'}" for label, ok in checks)
        print(f"{r['model']} {r['dtype']}: {verdicts}")


def table_only(names: list[str], chunk: int) -> None:
    """Seed 004's per-phase dispatch table (unfused vs fused) for each model's shapes; nothing is timed."""
    for name in names:
        _, meta = build_meta_only(name)
        ir = extract_lm(meta, 256, name=name)
        print(f"\n{name} (prefill chunk {chunk}):")
        print(fusion_table(compile_lm(ir, prefill_buckets=[chunk], options=unfused_options(), fallback="cpu"),
                           compile_lm(ir, prefill_buckets=[chunk])))


def build_meta_only(name: str) -> tuple[None, Any]:
    from transformers import AutoModelForCausalLM

    with torch_ir.build_on_meta():
        return None, AutoModelForCausalLM.from_config(config(name, torch.float32), attn_implementation="sdpa").eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="qwen2.5-0.5b", help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens (one prefill run)")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens to generate (median decode time)")
    parser.add_argument("--repeats", type=int, default=3, help="generations of each runner, alternating (medians)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--table-only", action="store_true", help="only the dispatch table, unfused vs fused")
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(CONFIGS)}")
    if args.table_only:
        table_only(names, args.prompt)
        return 0
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; prompt {args.prompt} tokens, "
          f"{args.new_tokens} new tokens")
    bandwidth = measure_stream_bandwidth().gbs * 1e9
    rows = []
    for name in names:
        for dtype in args.dtypes.split(","):
            print(f"[{name} {dtype}] building, extracting, compiling, generating ...", flush=True)
            rows.append(bench_one(name, dtype, args, bandwidth))
    print_rows(rows, bandwidth)
    if args.json:
        Path(args.json).write_text(json.dumps({"bandwidth_gb_s": bandwidth / 1e9, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
