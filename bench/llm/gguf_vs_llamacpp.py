"""The same GGUF files decoded by llama.cpp and by the toolkit, alternating, beside the streaming-read floor.

    .venv/bin/python bench/llm/gguf_vs_llamacpp.py bench/llm/llamacpp/models/0.5b/qwen2.5-0.5b-{f32,bf16,q8_0}.gguf

llama.cpp runs in its own environment (``bench/llm/llamacpp/setup.sh``; ``--llamacpp-python``), one
``decode.py`` pass per file and round; the toolkit (``npu_tools.lm_source.load_lm`` of the file, ``Generator``)
runs in this process. Files are taken one at a time (loaded, checked, timed, freed: a 1.5B f32 model and its
concatenated QKV/GATE_UP weights need ~11 GB); on each, rounds alternate the two runners so that a neighbour's
load falls on both alike; medians over the rounds. The floor (the file's weight bytes per token over the C
stream-read bandwidth of ``bench/gemv/bandwidth.py``) is measured before and after each file, the faster kept.

Correctness, per file (``--no-check`` skips it):

* **KLD against llama.cpp**: llama.cpp's prompt and greedy continuation (``decode.py --logits-out``) fed to the
  toolkit token by token (``Generator.forced_logits``); per step KL(llama.cpp ‖ ours) of the next-token
  distributions, mean and max over the ``--new-tokens`` + 1 steps;
* **greedy tokens against a float reference**: transformers running the file's weights dequantized to float32
  (``npu_tools.lm_gguf.gguf_model_parts``, bit-exact with gguf), greedy, ``--new-tokens`` steps from the same
  prompt; the number of leading tokens the toolkit's greedy tokens share with it (all of them for float32
  compute; a bf16 file computes in bf16, so its tokens leave the float32 ones once a rounding flips a near tie),
  and, beside it, how many llama.cpp's own greedy tokens share with it (the same test of llama.cpp).

``--unchained`` adds a row per runner of ours with its decode steps made dispatch by dispatch from Python (the CPU
backend's chains of native calls off, ``npu_runtime.backends.cpu_chain``), in the same rounds: what one C call per
run of native dispatches gains.

``--int8-activations`` adds a row per block-quantized file: ours with x rounded to int8 groups of 32 before each
block contraction (``load_lm(int8_activations=True)``), llama.cpp's own contract, in the same rounds. Its greedy
tokens are compared with the same float reference, which they leave as llama.cpp's do (its top-1 agreement with
llama.cpp is the telling column).

Block-quantized files (q8_0, q4_0, q4_K_M) run on their blocks (``npu_runtime.backends.cpu_blocks``), the Q5_0
tensors llama.cpp's quantizer puts in a q4_K_M file where rows are not whole 256-blocks included; tensors of other
block types (Q4_1, Q5_1, ...) are dequantized to float32 on load, said in the output.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gemv"))


def llamacpp(python: str, path: Path, args: argparse.Namespace, logits_out: Path | None = None) -> dict:
    """One llama.cpp pass of ``decode.py`` (its own venv): {weight_bytes, decode ms/token, prefill ms/token}."""
    cmd = [python, str(ROOT / "bench/llm/llamacpp/decode.py"), str(path), "--threads", str(args.threads),
           "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens), "--repeats", "1",
           "--floor-python", "none"]
    if logits_out is not None:
        cmd += ["--logits-out", str(logits_out)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    row = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    return {"weight_bytes": row["weight_bytes"], "decode": row["decode"][0], "prefill": row["prefill"][0]}


class Ours:
    """A GGUF file loaded, compiled and bound once; ``run()`` one timed generation (ms/token)."""

    def __init__(self, path: Path, args: argparse.Namespace, int8: bool = False):
        from npu_runtime import Device, load_weights
        from npu_runtime.backends.cpu import CPUBackend
        from npu_runtime.generate import Generator
        from npu_tools.lm_source import load_lm

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lm = load_lm(path, max_cache_len=args.prompt + args.new_tokens + 8, chunk=args.prompt,
                         int8_activations=int8)
        self.notes = sorted({str(w.message) for w in caught if "dequantized" in str(w.message)})
        # the same thread count as llama.cpp's, every run: left adaptive (npu_runtime.threads.RunThreads), a
        # program's fifth to eighth runs would try one thread, at twice the time, inside the timed rounds
        device = Device(CPUBackend(threads=args.threads))
        self.dtype = lm.dtype
        self.blocks = sorted({s.quant.block for s in lm.programs.decode.weight_specs if s.quant is not None})
        self.generator = Generator(lm.programs.prefill, lm.programs.decode,
                                   load_weights(lm.weights, lm.programs.prefill, device), device)
        vocab = lm.programs.decode.output_specs[0].shape[-1]
        g = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(min(1000, vocab - 1), vocab, (args.prompt,), generator=g).tolist()
        self.new = args.new_tokens
        self.run()  # warm-up

    def run(self, chained: bool = True) -> dict:
        """One timed generation, the decode steps' native dispatches made by one C call each run of them
        (``cpu_chain``) or, ``chained=False``, one by one from Python."""
        from npu_runtime.backends import cpu_chain

        previous = cpu_chain.set_enabled(chained)
        try:
            r = self.generator.generate(self.prompt, self.new + 1)
        finally:
            cpu_chain.set_enabled(previous)
        return {"decode": statistics.median(r.decode_s) * 1000, "prefill": r.prefill_s * 1000 / len(self.prompt)}


def kld(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(P ‖ Q) per row of two logit matrices, in float64."""
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


def reference_tokens(path: Path, prompt: list[int], new: int) -> list[int]:
    """Greedy tokens of transformers running the file's weights dequantized to float32."""
    from npu_tools.lm_gguf import gguf_model_parts

    model = gguf_model_parts(path)[1]("cpu")
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def check(path: Path, ours: Ours, args: argparse.Namespace) -> dict:
    """KLD of ours against llama.cpp's logits on llama.cpp's tokens, and greedy agreement with the float reference."""
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "logits.npz"
        llamacpp(args.llamacpp_python, path, args, logits_out=npz)
        data = np.load(npz)
        tokens, theirs = [int(t) for t in data["tokens"]], data["logits"]
    prompt = tokens[:args.prompt]
    mine = ours.generator.forced_logits(prompt, tokens[args.prompt:])
    per_step = kld(theirs, mine)
    greedy = ours.generator.generate(prompt, args.new_tokens).tokens
    reference = reference_tokens(path, prompt, args.new_tokens)
    return {"kld_mean": float(per_step.mean()), "kld_max": float(per_step.max()),
            "greedy_equal": _leading_equal(greedy, reference),
            "llamacpp_greedy_equal": _leading_equal(tokens[args.prompt:], reference),
            "top1_vs_llamacpp": float(np.mean(theirs.argmax(-1) == mine.argmax(-1)))}


def _leading_equal(tokens: list[int], reference: list[int]) -> int:
    """How many leading tokens of ``tokens`` equal the reference's."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def bench_file(path: Path, args: argparse.Namespace, floor_gbs: float) -> list[dict]:
    """Rows of one file: ours with float x, and (``--int8-activations``, a file with blocks) with int8 x, each
    timed in the same alternating rounds as llama.cpp."""
    from bandwidth import measure_stream_bandwidth

    start = time.perf_counter()
    variants = {"": Ours(path, args)}
    if args.int8_activations and variants[""].blocks:
        variants[" (int8 x)"] = Ours(path, args, int8=True)
    first = variants[""]
    print(f"{path.name}: loaded and compiled in {time.perf_counter() - start:.0f} s ({first.dtype}, blocks "
          f"{', '.join(first.blocks) or 'none'})", file=sys.stderr)
    for note in first.notes:
        print(f"  note: {note}", file=sys.stderr)
    rows = {v: {"file": path.name + v, "dtype": o.dtype, "blocks": o.blocks, "ours": [], "llama": []}
            for v, o in variants.items()}
    runs = [(v, o, True) for v, o in variants.items()]
    if args.unchained:  # the same runners, their decode steps made dispatch by dispatch
        runs += [(v, o, False) for v, o in variants.items()]
        rows.update({v + " unchained": {**rows[v], "file": rows[v]["file"] + ", unchained", "ours": [], "llama": []}
                     for v in variants})
    if args.check:
        for v, o in variants.items():
            rows[v]["check"] = check(path, o, args)
            print(f"  check{v}: {rows[v]['check']}", file=sys.stderr)
    for r in range(args.rounds):
        theirs = llamacpp(args.llamacpp_python, path, args)
        # our runners in a rotating order: the one that follows llama.cpp's process prefilled faster than the next
        for v, o, chained in runs[r % len(runs):] + runs[:r % len(runs)]:
            row = rows[v if chained else v + " unchained"]
            row["weight_bytes"] = theirs["weight_bytes"]
            row["llama"].append(theirs)
            row["ours"].append(o.run(chained))
    floor_gbs = max(floor_gbs, measure_stream_bandwidth(threads=args.threads, reps=10).gbs)
    for row in rows.values():
        row["floor_gbs"] = floor_gbs
    del variants, first
    gc.collect()
    return list(rows.values())


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"{args.threads} threads; {args.rounds} alternating rounds per file, prompt {args.prompt}, "
          f"{args.new_tokens} new tokens; medians [min-max]; floor = weight bytes / C stream-read bandwidth")
    # prefill on a shared 2-vCPU machine spreads 2-3x between identical rounds: the best of each beside the medians
    print("| file | weight MB/token | floor GB/s | floor ms | llama.cpp decode ms | ours decode ms | ours / llama.cpp "
          "| ours / floor | llama.cpp / floor | llama.cpp prefill ms/token | ours prefill ms/token "
          "| prefill ours / llama.cpp: medians, bests |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        floor_ms = r["weight_bytes"] / r["floor_gbs"] / 1e6
        cell = {who: {k: [x[k] for x in r[who]] for k in ("decode", "prefill")} for who in ("ours", "llama")}
        med = {who: {k: statistics.median(v) for k, v in c.items()} for who, c in cell.items()}
        ours_ms, llama_ms = med["ours"]["decode"], med["llama"]["decode"]
        span = {who: f"[{min(cell[who]['decode']):.1f}-{max(cell[who]['decode']):.1f}]" for who in cell}
        pre = {who: f"{med[who]['prefill']:.2f} [{min(cell[who]['prefill']):.2f}-{max(cell[who]['prefill']):.2f}]"
               for who in cell}
        best = min(cell["ours"]["prefill"]) / min(cell["llama"]["prefill"])
        print(f"| {r['file']} | {r['weight_bytes'] / 1e6:.0f} | {r['floor_gbs']:.1f} | {floor_ms:.1f} | "
              f"{llama_ms:.1f} {span['llama']} | {ours_ms:.1f} {span['ours']} | {ours_ms / llama_ms:.2f} | "
              f"{ours_ms / floor_ms:.2f} | {llama_ms / floor_ms:.2f} | {pre['llama']} | {pre['ours']} | "
              f"{med['ours']['prefill'] / med['llama']['prefill']:.2f}, {best:.2f} |")
    if any("check" in r for r in rows):
        print("\n| file | KLD vs llama.cpp, mean | max | top-1 = llama.cpp's | greedy tokens = float reference: ours "
              "| llama.cpp's |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            c = r.get("check")
            if c:
                print(f"| {r['file']} | {c['kld_mean']:.2e} | {c['kld_max']:.2e} | {c['top1_vs_llamacpp']:.0%} | "
                      f"{c['greedy_equal']}/{args.new_tokens} | {c['llamacpp_greedy_equal']}/{args.new_tokens} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the KLD and greedy-token checks")
    p.add_argument("--int8-activations", action="store_true",
                   help="also time (and check) ours with int8 activations on files with blocks, as llama.cpp runs")
    p.add_argument("--unchained", action="store_true",
                   help="also time ours with each decode dispatch made from Python (no cpu_chain), same rounds")
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
    p.add_argument("--llamacpp-python", default=str(ROOT / "bench/llm/llamacpp/.venv/bin/python"))
    args = p.parse_args()
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        p.error(f"no such file(s): {', '.join(missing)}")
    torch.set_num_threads(args.threads)
    from bandwidth import measure_stream_bandwidth

    rows = []
    for f in args.files:
        floor = measure_stream_bandwidth(threads=args.threads, reps=10).gbs
        rows += bench_file(f, args, floor)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    print_table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
