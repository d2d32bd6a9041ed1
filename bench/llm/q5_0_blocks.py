"""Decode ms/token of a GGUF file with its Q5_0 tensors kept as blocks against the same file with them dequantized to
float32 on load (what ``load_lm`` did before Q5_0 was a block layout), and with int8 activations; one process, the
generators alternating round by round in a rotating order, so that a neighbour's load falls on all alike.

    .venv/bin/python bench/llm/q5_0_blocks.py bench/llm/llamacpp/models/0.5b/qwen2.5-0.5b-q4_K_M.gguf --rounds 9

llama.cpp's "Q4_K_M" file of Qwen2.5-0.5B holds 132 Q5_0 tensors (rows of K = 896 are not whole 256-weight
super-blocks). The dequantized variant is loaded with ``q5_0`` taken out of ``torch_ir.quant.spec.BLOCKS`` for the
duration of ``load_lm`` (the table ``npu_tools.lm_gguf`` keeps blocks by). Prints a markdown table and whether the
float-x variants' greedy tokens agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch_ir.quant.spec as spec  # noqa: E402
from npu_runtime import Device, load_weights  # noqa: E402
from npu_runtime.generate import Generator  # noqa: E402
from npu_tools.lm_source import load_lm  # noqa: E402

VARIANTS = ("q5_0 dequantized to float32", "q5_0 blocks", "q5_0 blocks, int8 x")


def generator(path: Path, variant: str, cache: int) -> Generator:
    saved = dict(spec.BLOCKS)
    if variant == VARIANTS[0]:
        spec.BLOCKS.pop("q5_0")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the dequantized variant's warning names its Q5_0 tensors
            lm = load_lm(path, max_cache_len=cache, int8_activations=variant.endswith("int8 x"))
    finally:
        spec.BLOCKS.clear()
        spec.BLOCKS.update(saved)
    blocks = sorted({s.quant.block for s in lm.programs.decode.weight_specs if s.quant is not None})
    print(f"{variant}: blocks {', '.join(blocks)}", file=sys.stderr)
    device = Device()
    return Generator(lm.programs.prefill, lm.programs.decode, load_weights(lm.weights, lm.programs.prefill, device),
                     device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", type=Path)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    gens = {v: generator(args.file, v, args.prompt + args.new_tokens + 8) for v in VARIANTS}
    prompt = torch.randint(0, 500, (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
    tokens: dict[str, list[int]] = {}
    for r in range(args.rounds + 1):  # round 0 warms up
        for v in VARIANTS[r % 3:] + VARIANTS[:r % 3]:
            out = gens[v].generate(prompt, args.new_tokens + 1)
            tokens[v] = out.tokens
            if r:
                ms[v].append(statistics.median(out.decode_s) * 1000)
    print(f"{args.threads} threads, prompt {args.prompt}, {args.new_tokens} decode steps, {args.rounds} rounds; "
          "median decode ms/token [min-max]\n")
    print("| weights | decode ms/token |\n|---|---:|")
    for v in VARIANTS:
        print(f"| {v} | {statistics.median(ms[v]):.1f} [{min(ms[v]):.1f}-{max(ms[v]):.1f}] |")
    print(f"\nfloat-x greedy tokens equal: {tokens[VARIANTS[0]] == tokens[VARIANTS[1]]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
