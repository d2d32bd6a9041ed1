"""The same GGUF files decoded by llama.cpp and by the toolkit, alternating, beside the streaming-read floor.

    .venv/bin/python bench/llm/gguf_vs_llamacpp.py bench/llm/llamacpp/models/0.5b/qwen2.5-0.5b-{f32,bf16,q8_0}.gguf

llama.cpp runs in its own environment (``bench/llm/llamacpp/setup.sh``; ``--llamacpp-python``), one
``decode.py`` pass per file and round; the toolkit (``npu_tools.lm_source.load_lm`` of the file, ``Generator``)
runs in this process, each file loaded and compiled once. Rounds alternate the two on each file so that a
neighbour's load falls on both alike; medians over the rounds. The floor (the file's weight bytes per token over
the C stream-read bandwidth of ``bench/gemv/bandwidth.py``) is measured before and after, the faster kept.

Block-quantized files (q8_0, q4_*) are dequantized to float on load for now (issue 29: the block kernels are not
wired into the LLM programs yet), so the toolkit's row for them is a float decode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gemv"))


def llamacpp(python: str, path: Path, args: argparse.Namespace) -> dict:
    """One llama.cpp pass of ``decode.py`` (its own venv): {weight_bytes, decode ms/token, prefill ms/token}."""
    cmd = [python, str(ROOT / "bench/llm/llamacpp/decode.py"), str(path), "--threads", str(args.threads),
           "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens), "--repeats", "1",
           "--floor-python", "none"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    row = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    return {"weight_bytes": row["weight_bytes"], "decode": statistics.median(row["decode"]),
            "prefill": statistics.median(row["prefill"])}


class Ours:
    """A GGUF file loaded, compiled and bound once; ``run()`` one timed generation (ms/token)."""

    def __init__(self, path: Path, args: argparse.Namespace):
        from npu_runtime import Device, load_weights
        from npu_runtime.generate import Generator
        from npu_tools.lm_source import load_lm

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the dequantize-on-load warning: said in the docstring
            lm = load_lm(path, max_cache_len=args.prompt + args.new_tokens + 8, chunk=args.prompt)
        device = Device()
        self.dtype = lm.dtype
        self.generator = Generator(lm.programs.prefill, lm.programs.decode,
                                   load_weights(lm.weights, lm.programs.prefill, device), device)
        vocab = lm.programs.decode.output_specs[0].shape[-1]
        g = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(min(1000, vocab - 1), vocab, (args.prompt,), generator=g).tolist()
        self.new = args.new_tokens
        self.run()  # warm-up

    def run(self) -> dict:
        r = self.generator.generate(self.prompt, self.new + 1)
        return {"decode": statistics.median(r.decode_s) * 1000, "prefill": r.prefill_s * 1000 / len(self.prompt)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--llamacpp-python", default=str(ROOT / "bench/llm/llamacpp/.venv/bin/python"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from bandwidth import measure_stream_bandwidth

    floor = measure_stream_bandwidth(threads=args.threads, reps=10).gbs
    ours = {}
    for f in args.files:
        t = time.perf_counter()
        ours[f] = Ours(f, args)
        print(f"{f.name}: loaded and compiled in {time.perf_counter() - t:.0f} s ({ours[f].dtype})", file=sys.stderr)
    times: dict[Path, dict[str, list]] = {f: {"ours": [], "llama": []} for f in args.files}
    weight_bytes = {}
    for _ in range(args.rounds):
        for f in args.files:
            theirs = llamacpp(args.llamacpp_python, f, args)
            weight_bytes[f] = theirs["weight_bytes"]
            times[f]["llama"].append(theirs)
            times[f]["ours"].append(ours[f].run())
    floor = max(floor, measure_stream_bandwidth(threads=args.threads, reps=10).gbs)
    print(f"floor {floor:.1f} GB/s (C stream read, {args.threads} threads); {args.rounds} alternating rounds, "
          f"prompt {args.prompt}, {args.new_tokens} new tokens; medians")
    print("| file | weight MB/token | floor ms | llama.cpp decode ms | ours decode ms | ours / llama.cpp | "
          "ours / floor | llama.cpp prefill ms/token | ours prefill ms/token |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in args.files:
        med = {who: {k: statistics.median(r[k] for r in runs) for k in ("decode", "prefill")}
               for who, runs in times[f].items()}
        floor_ms = weight_bytes[f] / floor / 1e6
        ours_ms, llama_ms = med["ours"]["decode"], med["llama"]["decode"]
        print(f"| {f.name} | {weight_bytes[f] / 1e6:.0f} | {floor_ms:.1f} | {llama_ms:.1f} | {ours_ms:.1f} | "
              f"{ours_ms / llama_ms:.2f} | {ours_ms / floor_ms:.2f} | {med['llama']['prefill']:.2f} | "
              f"{med['ours']['prefill']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
