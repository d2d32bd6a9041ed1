"""How ``normalize`` and ``compile`` scale with model depth, against extraction (issue 27, item 4).

    python bench/normalize/scaling.py                       # Llama-3-70B shape at 10, 20, 40, 80 layers
    python bench/normalize/scaling.py --layers 10,20 --repeat 1
    python bench/normalize/scaling.py --quick               # 2 and 4 layers, 1 repeat: checks the harness

The model is Llama-3-70B's config (hidden 8192, 64 heads, 8 KV heads, vocab 128256) with the layer count
changed, built on the meta device (no weight is allocated, nothing is downloaded) and called with
``input_ids`` of shape (1, 16), as in ``bench/extract``. Each layer count runs in a fresh subprocess, which
first extracts, normalizes and compiles a 1-layer model so that one-time costs (lazy imports, torch.export's
first trace) count against none of the timed steps. Then, ``--repeat`` times each: ``extract_ir`` of the
model, ``normalize`` of that IR, and ``compile`` of that IR (which normalizes again, as a user's call does);
the table shows medians.

Targets (printed at the end): on the 80-layer (Llama-3-70B) model, normalize no slower than extraction and
compile within 2x extraction; normalize time per node flat from the fewest to the most layers (within 1.5x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # this tree's packages, as bench/normalize/run.py

SEQ_LEN = 16
LLAMA3_70B = dict(hidden_size=8192, num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672,
                  vocab_size=128256, rope_theta=500000.0)
# Targets from issue 27 item 4; the run prints which are met.
MAX_NORMALIZE_RATIO, MAX_COMPILE_RATIO, MAX_PER_NODE_SPREAD = 1.0, 2.0, 1.5


# -- child: one layer count in this fresh process ------------------------------------------------------

def _build(layers: int):
    import torch
    import transformers

    # use_cache goes in the config, not in kwargs: torch.export would make a bool kwarg a graph input
    config = transformers.LlamaConfig(num_hidden_layers=layers, use_cache=False, **LLAMA3_70B)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()
    return model, {"input_ids": torch.zeros(1, SEQ_LEN, dtype=torch.long, device="meta")}


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def child(layers: int, repeat: int) -> dict:
    from npu_compiler import compile as npu_compile
    from npu_compiler.passes import normalize
    from torch_ir import extract_ir

    def steps(model, kwargs) -> dict:
        ir, extract_s = _timed(lambda: extract_ir(model, (), model_name=f"llama3-70b-{layers}l", example_kwargs=kwargs))
        npu, normalize_s = _timed(lambda: normalize(ir))
        _, compile_s = _timed(lambda: npu_compile(ir))
        return {"nodes": len(ir.nodes), "npu_nodes": len(npu.nodes), "extract_s": extract_s,
                "normalize_s": normalize_s, "compile_s": compile_s}

    steps(*_build(1))  # warm-up: imports and first-trace costs belong to no measured step
    model, kwargs = _build(layers)
    runs = [steps(model, kwargs) for _ in range(repeat)]
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


# -- parent: one subprocess per layer count, then the table -------------------------------------------

def measure(layers: int, repeat: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(layers), "--repeat", str(repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{layers} layers failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(rows: dict[int, dict], repeat: int) -> None:
    print(f"\nLlama-3-70B shape on meta, input_ids (1, {SEQ_LEN}); median of {repeat}; times in s")
    header = (f"{'layers':>6} {'nodes':>6} {'npu nodes':>9} {'extract':>8} {'normalize':>9} {'µs/node':>8} "
              f"{'compile':>8} {'norm/extr':>9} {'comp/extr':>9}")
    print(header)
    print("-" * len(header))
    for layers, r in rows.items():
        print(f"{layers:>6} {r['nodes']:>6.0f} {r['npu_nodes']:>9.0f} {r['extract_s']:>8.2f} {r['normalize_s']:>9.2f} "
              f"{_per_node(r):>8.0f} {r['compile_s']:>8.2f} {r['normalize_s'] / r['extract_s']:>9.2f} "
              f"{r['compile_s'] / r['extract_s']:>9.2f}")
    print()
    for line in targets(rows):
        print(line)


def _per_node(r: dict) -> float:
    return r["normalize_s"] / r["nodes"] * 1e6


def targets(rows: dict[int, dict]) -> list[str]:
    """One line per target, met or missed, judged on the deepest model measured (80 layers by default)."""
    deepest, shallowest = rows[max(rows)], rows[min(rows)]
    norm = deepest["normalize_s"] / deepest["extract_s"]
    comp = deepest["compile_s"] / deepest["extract_s"]
    spread = _per_node(deepest) / _per_node(shallowest)

    def line(ok: bool, text: str) -> str:
        return f"  [{'met' if ok else 'MISSED'}] {text}"

    return [
        f"targets ({max(rows)} layers):",
        line(norm <= MAX_NORMALIZE_RATIO, f"normalize / extract = {norm:.2f} <= {MAX_NORMALIZE_RATIO}"),
        line(comp <= MAX_COMPILE_RATIO, f"compile / extract = {comp:.2f} <= {MAX_COMPILE_RATIO}"),
        line(spread <= MAX_PER_NODE_SPREAD, f"normalize µs/node at {max(rows)} layers / at {min(rows)} layers = "
                                            f"{spread:.2f} <= {MAX_PER_NODE_SPREAD} (flat)"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="10,20,40,80", help="comma-separated layer counts")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per layer count (median shown)")
    parser.add_argument("--quick", action="store_true", help="2 and 4 layers, 1 repeat: checks the harness")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child is not None:
        print(json.dumps(child(args.child, args.repeat)))
        return
    layer_counts, repeat = ([2, 4], 1) if args.quick else (sorted(int(x) for x in args.layers.split(",")), args.repeat)
    rows = {}
    for layers in layer_counts:
        rows[layers] = measure(layers, repeat)
        print(f"  {layers} layers: extract {rows[layers]['extract_s']:.2f} s, normalize "
              f"{rows[layers]['normalize_s']:.2f} s, compile {rows[layers]['compile_s']:.2f} s",
              file=sys.stderr, flush=True)
    report(rows, repeat)


if __name__ == "__main__":
    main()
