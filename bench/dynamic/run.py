"""Serving a length distribution: shape buckets against one upper-bound program, measured on the CPU backend.

For a BERT encoder and sequence lengths drawn from a log-normal (the kind of traffic an encoder serves), one run
of each plan over the same requests, alternating request by request:

* ``static``: a program compiled for exactly each length and run once before the timing (what one compile per
  length, all of them loaded and warm, gives: the floor of the two plans below);
* ``buckets``: one DynamicProgram of seq buckets (the smallest that fits, padded);
* ``upper bound``: one program planned for the largest length, instantiated at each length (the first request
  at a length pays for making its kernels; ``--instances`` of them are kept).

It prints per plan the median and p10-p90 latency per request, the total, the activation memory, and for the
upper bound how many requests paid an instantiation. The cost model's side (arena, padded FLOPs, latency on a
described NPU) is ``torch-ir compile --report-dynamic``.

    .venv/bin/python bench/dynamic/run.py                    # small BERT, 200 requests
    .venv/bin/python bench/dynamic/run.py --hidden 768 --layers 12 --requests 100 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from npu_compiler import Buckets, UpperBound, compile  # noqa: E402
from npu_runtime import Executor, load_weights  # noqa: E402
from npu_runtime import dynamic as runtime_dynamic  # noqa: E402
from torch_ir.weights import module_state  # noqa: E402


def model_and_ir(hidden: int, layers: int, max_len: int):
    import transformers
    from torch.export import Dim

    import torch_ir

    config = transformers.BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                                     max_position_embeddings=max_len, attn_implementation="eager")
    with torch.device("meta"):
        meta = transformers.BertModel(config).eval()
    dims = {1: Dim("seq", min=1, max=max_len)}
    example = {k: torch.ones(1, 16, dtype=torch.long, device="meta") for k in ("input_ids", "attention_mask")}
    ir = torch_ir.extract_ir(meta, (), example_kwargs=example, dynamic_shapes={k: dims for k in example},
                             model_name="bert")
    torch.manual_seed(0)
    return transformers.BertModel(config).eval(), ir


def lengths(n: int, max_len: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(rng.lognormal(np.log(60), 0.8, n), 8, max_len).round()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--buckets", default="64,128,256,512")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--instances", type=int, default=8, help="upper-bound instances kept (MAX_INSTANCES)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    runtime_dynamic.MAX_INSTANCES = args.instances
    model, ir = model_and_ir(args.hidden, args.layers, args.max_len)
    state = module_state(model)
    served = lengths(args.requests, args.max_len, args.seed)
    buckets = [int(b) for b in args.buckets.split(",")]
    t0 = time.perf_counter()
    plans = {"buckets": compile(ir, dynamic=Buckets({"seq": buckets}, weights=state)),
             "upper bound": compile(ir, dynamic=UpperBound())}
    print(f"compiled both plans in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    static_programs: dict[int, object] = {}
    executors = {name: Executor(program) for name, program in plans.items()}
    weights = {name: load_weights(state, program) for name, program in plans.items()}
    times: dict[str, list[float]] = {"static": [], **{name: [] for name in plans}}
    static_exec: dict[int, Executor] = {}
    paid: list[bool] = []
    rng = np.random.default_rng(args.seed + 1)
    for i, n in enumerate(served):
        inputs = {"input_ids": rng.integers(1, 30522, (1, n)), "attention_mask": np.ones((1, n), np.int64)}
        if n not in static_exec:  # compiled and run once outside the timing: the floor, every program ready
            static_programs[n] = compile(ir, bind={"seq": n})
            static_exec[n] = Executor(static_programs[n])
            static_exec[n].run(inputs, weights=load_weights(state, static_programs[n]))
        paid.append((("seq", n),) not in executors["upper bound"].executors)  # an instance is made this run
        for name in (["static", *plans] if i % 2 == 0 else [*reversed(plans), "static"]):
            executor = static_exec[n] if name == "static" else executors[name]
            start = time.perf_counter()
            executor.run(inputs, weights=None if name == "static" else weights[name])
            times[name].append(time.perf_counter() - start)
    print(f"\nBERT hidden {args.hidden}, {args.layers} layers, {args.requests} requests, lengths 8..{args.max_len} "
          f"(log-normal, median {int(np.median(served))}), threads {torch.get_num_threads()}; buckets {buckets}\n")
    print(f"{'plan':<12} {'median ms':>10} {'p10-p90 ms':>16} {'total s':>8} {'activation bytes':>17}")
    memory = {"static": max(p.arena_bytes for p in static_programs.values()),
              **{name: program.arena_bytes for name, program in plans.items()}}
    for name, values in times.items():
        ms = sorted(v * 1e3 for v in values)
        p10, p90 = ms[len(ms) // 10], ms[(len(ms) * 9) // 10]
        print(f"{name:<12} {statistics.median(ms):>10.2f} {f'{p10:.2f}-{p90:.2f}':>16} {sum(values):>8.2f} "
              f"{memory[name]:>17}")
    cold = [t * 1e3 for t, p in zip(times["upper bound"], paid) if p]
    warm = [t * 1e3 for t, p in zip(times["upper bound"], paid) if not p]
    print(f"\nupper bound: {len(set(served))} distinct lengths, {args.instances} instances kept; {len(cold)} requests "
          f"made an instance (median {statistics.median(cold) if cold else 0:.2f} ms), {len(warm)} reused one "
          f"(median {statistics.median(warm) if warm else 0:.2f} ms)")
    print("static: its activation bytes are its largest program's arena (one program per length)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
