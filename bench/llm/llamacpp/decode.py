"""llama.cpp's prefill and decode ms/token on GGUF files, beside this machine's streaming-read floor.

Run in this folder's venv (``setup.sh``; files from ``make_models.py``)::

    bench/llm/llamacpp/.venv/bin/python bench/llm/llamacpp/decode.py bench/llm/llamacpp/models/0.5b/*.gguf
    bench/llm/llamacpp/.venv/bin/python bench/llm/llamacpp/decode.py FILE.gguf --logits-out logits.npz

Per file, in one process: the model loaded by llama-cpp-python (``n_threads`` = ``n_threads_batch`` =
``--threads``, context ``--prompt`` + ``--new-tokens``, the binding's defaults otherwise: f16 KV cache, mmap,
flash attention off unless ``--flash-attn``),
then one untimed warm-up pass and ``--repeats`` timed passes, each on an emptied KV cache: a prefill of
``--prompt`` seeded token ids in one batch, then ``--new-tokens`` single-token decode steps (greedy: the
argmax of the previous logits, outside the timed call). Per pass: prefill ms/token = prefill time / P, decode
ms/token = decode time / N; the table gives their median and p10–p90 over passes.

The floor: a decode step reads every weight byte once (each tensor whole; ``token_embd`` one row unless the
LM head is tied to it, when the head reads it whole), counted from the GGUF's own tensor table, divided by
the machine's streaming-read bandwidth — ``measure_stream_bandwidth`` of ``bench/gemv/bandwidth.py`` (the
toolkit's compiled plain read loop, all threads and one, and ``torch.mv``; the best), measured in the same run
by the toolkit's Python (``--floor-python``, default ``.venv/bin/python`` at the repository root), since this
venv does not install the toolkit; before and after the files, the faster of the two. ratio = llama.cpp
decode ms / floor ms (1.0 = at the memory floor).

``--logits-out`` writes an ``.npz`` per file (``<out stem>-<type>.npz`` with several files) holding ``tokens``
(the P prompt ids then the N decoded ids) and ``logits`` (N + 1 rows of float32: after the prompt, then after
each decoded token) from the first timed pass: a KLD comparison feeds the toolkit the same ids.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FLOOR_SCRIPT = (
    "import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; from bandwidth import measure_stream_bandwidth; "
    "b = measure_stream_bandwidth(reps=int(sys.argv[3]), threads=int(sys.argv[4])); print(json.dumps(b.__dict__))"
)


def decode_weight_bytes(path: Path) -> tuple[int, str]:
    """(bytes one decode step reads, the file's type name) from the GGUF tensor table (see the docstring)."""
    import gguf

    reader = gguf.GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    total = sum(sizes.values())
    if "output.weight" in sizes and "token_embd.weight" in sizes:  # untied: the lookup reads one row
        emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
        rows = int(emb.shape[-1])  # GGUF lists dims innermost first: (hidden, vocab)
        total -= sizes["token_embd.weight"] - sizes["token_embd.weight"] // rows
    field = reader.get_field("general.file_type")
    ftype = gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name if field else "?"
    return total, ftype


def measure_floor(python: str, threads: int, reps: int) -> dict[str, float]:
    """``measure_stream_bandwidth`` run by the toolkit's interpreter (it imports ``npu_runtime``)."""
    cmd = [python, "-c", FLOOR_SCRIPT, str(ROOT / "src"), str(ROOT / "bench" / "gemv"), str(reps), str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@dataclass
class Pass:
    prefill_s: float
    decode_s: float
    tokens: list[int]
    logits: list[np.ndarray]


def last_logits(llm) -> np.ndarray:
    """The last evaluated position's logits (the binding keeps ``scores`` only with ``logits_all``)."""
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))


def one_pass(llm, prompt: list[int], new_tokens: int, keep_logits: bool) -> Pass:
    """A prefill of ``prompt`` and ``new_tokens`` greedy decode steps on an emptied KV cache."""
    llm.reset()  # n_tokens = 0: the next eval drops the cache from position 0
    start = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - start
    logits = [last_logits(llm).copy()] if keep_logits else []
    tokens = list(prompt)
    decode = 0.0
    for _ in range(new_tokens):
        token = int(np.argmax(last_logits(llm)))
        tokens.append(token)
        start = time.perf_counter()
        llm.eval([token])
        decode += time.perf_counter() - start
        if keep_logits:
            logits.append(last_logits(llm).copy())
    return Pass(prefill, decode, tokens, logits)


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return statistics.median(values), deciles[0], deciles[-1]


def bench_file(path: Path, args: argparse.Namespace, logits_out: Path | None) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_threads=args.threads, n_threads_batch=args.threads,
                n_ctx=args.prompt + args.new_tokens + 1, n_batch=args.prompt, n_ubatch=args.prompt,
                flash_attn=args.flash_attn, seed=args.seed, verbose=False)
    rng = np.random.default_rng(args.seed)
    prompt = [int(t) for t in rng.integers(1000, llm.n_vocab(), size=args.prompt)]
    one_pass(llm, prompt, args.new_tokens, False)  # warm-up: pages mapped, thread pool and caches warm
    passes = [one_pass(llm, prompt, args.new_tokens, logits_out is not None and i == 0) for i in range(args.repeats)]
    if logits_out is not None:
        np.savez(logits_out, tokens=np.array(passes[0].tokens, dtype=np.int64), logits=np.stack(passes[0].logits))
    nbytes, ftype = decode_weight_bytes(path)
    del llm
    return dict(file=path.name, ftype=ftype, weight_bytes=nbytes,
                decode=spread([p.decode_s * 1e3 / args.new_tokens for p in passes]),
                prefill=spread([p.prefill_s * 1e3 / args.prompt for p in passes]))


def print_table(rows: list[dict], floor: dict[str, float], args: argparse.Namespace) -> None:
    gbs = floor["gbs"]
    print(f"\nfloor bandwidth {gbs:.2f} GB/s (c_read {floor['c_read']:.2f} with {floor['threads']} threads, "
          f"{floor['c_read_1']:.2f} with 1, torch.mv {floor['torch_mv']:.2f}); llama.cpp at {args.threads} threads, "
          f"prompt {args.prompt}, {args.new_tokens} new tokens, {args.repeats} passes (median [p10-p90])")
    print("| file | type | weight MB/token | floor ms | llama.cpp decode ms/token | ratio | prefill ms/token |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        floor_ms = r["weight_bytes"] / gbs / 1e6
        (d, d10, d90), (p, p10, p90) = r["decode"], r["prefill"]
        print(f"| {r['file']} | {r['ftype']} | {r['weight_bytes'] / 1e6:.1f} | {floor_ms:.2f} | "
              f"{d:.2f} [{d10:.2f}-{d90:.2f}] | {d / floor_ms:.2f} | {p:.2f} [{p10:.2f}-{p90:.2f}] |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="GGUF files")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128, help="prefill tokens P")
    parser.add_argument("--new-tokens", type=int, default=32, help="decode steps N")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes after the warm-up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flash-attn", action="store_true", help="llama.cpp's fused attention (binding default: off)")
    parser.add_argument("--logits-out", type=Path, help=".npz of tokens and next-token logits (see the docstring)")
    parser.add_argument("--floor-python", default=str(ROOT / ".venv" / "bin" / "python"),
                        help="the toolkit's interpreter, for the floor; 'none' skips it")
    parser.add_argument("--floor-reps", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the rows and the floor as JSON")
    args = parser.parse_args()
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing or min(args.threads, args.prompt, args.new_tokens, args.repeats) < 1:
        parser.error(f"missing files {missing}" if missing else "--threads/--prompt/--new-tokens/--repeats >= 1")
    # The floor before and after the files, the faster kept: a neighbour's load during one measurement would
    # otherwise set a floor below what llama.cpp itself reaches (a ratio under 1).
    floor = None if args.floor_python == "none" else measure_floor(args.floor_python, args.threads, args.floor_reps)
    rows = []
    for path in args.files:
        out = args.logits_out
        if out is not None and len(args.files) > 1:
            out = out.with_name(f"{out.stem}-{path.stem}.npz")
        rows.append(bench_file(path, args, out))
        print(json.dumps(rows[-1]), flush=True)
    if floor is not None:
        after = measure_floor(args.floor_python, args.threads, args.floor_reps)
        floor = max(floor, after, key=lambda f: f["gbs"])
        print_table(rows, floor, args)
    if args.json:
        args.json.write_text(json.dumps(dict(floor=floor, rows=rows, args={k: str(v) for k, v in vars(args).items()}),
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
