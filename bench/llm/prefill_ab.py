"""A prefill's int8-activation paths on one GGUF file, alternated in one process: what each costs in the model.

    .venv/bin/python bench/llm/prefill_ab.py bench/llm/llamacpp/models/1.5b/qwen2.5-1.5b-q4_K_M.gguf --rounds 8

The file is loaded with llama.cpp's int8 activations (``load_lm(int8_activations=True)``) and bound once; each round
prefills the same prompt once per arm, the arms in a rotating order (a neighbour's load then falls on all alike):

* ``integer, GGUF layout``: the integer kernel forced (``cpu_blocks.INT8_PREFILL = "native"``), Q8_0/Q6_K weights on
  their GGUF-layout kernel (``cpu_blocks.INT8_GROUPS = False``);
* ``integer, groups``: the same with Q8_0/Q6_K decoded 16 rows at a time into the copies' prefill kernel
  (``QGemv.groups``; where no part of the file takes it, this is the arm above);
* ``float, rounded x``: the float path on the int8-rounded x (``INT8_PREFILL = "rounded"``);
* ``as shipped``: the per-shape policy's choice between the integer kernel and the float path (``_INT8_PATHS``).

Printed: prefill ms/token per arm, median [min-max] over the rounds, every run on torch's threads (not the runtime's
adaptive choice of one thread or all, whose tries of one thread would fall on some arms). Timings on a shared
machine still spread between identical rounds; compare arms of one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

#: arm -> (cpu_blocks.INT8_PREFILL, cpu_blocks.INT8_GROUPS)
ARMS = {"integer, GGUF layout": ("native", False), "integer, groups": ("native", True),
        "float, rounded x": ("rounded", True), "as shipped": (None, True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="a GGUF file with block weights")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (one prefill run)")
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds (one run of each arm each)")
    args = parser.parse_args(argv)
    from npu_runtime import Device, load_weights
    from npu_runtime.backends import cpu_blocks
    from npu_runtime.backends.cpu import CPUBackend
    from npu_runtime.generate import Generator
    from npu_tools.lm_source import load_lm

    lm = load_lm(args.file, max_cache_len=args.prompt + 8, chunk=args.prompt, int8_activations=True)
    # torch's threads for every run: left adaptive (npu_runtime.threads.RunThreads), the program's fifth to eighth
    # runs would try one thread, at twice the time, on whichever arms they fell
    device = Device(CPUBackend(threads=torch.get_num_threads()))
    run = Generator(lm.programs.prefill, lm.programs.decode, load_weights(lm.weights, lm.programs.prefill, device),
                    device)
    vocab = lm.programs.decode.output_specs[0].shape[-1]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(min(1000, vocab - 1), vocab, (args.prompt,), generator=g).tolist()
    names, times = list(ARMS), {name: [] for name in ARMS}
    saved = cpu_blocks.INT8_PREFILL, cpu_blocks.INT8_GROUPS
    try:
        for r in range(args.rounds + 1):  # round 0 warms every arm up
            for name in names[r % len(names):] + names[:r % len(names)]:
                cpu_blocks.INT8_PREFILL, cpu_blocks.INT8_GROUPS = ARMS[name]
                result = run.generate(prompt, 1)
                if r:
                    times[name].append(result.prefill_s * 1000 / len(prompt))
    finally:
        cpu_blocks.INT8_PREFILL, cpu_blocks.INT8_GROUPS = saved
    print(f"# {args.file.name}: prefill of {args.prompt} tokens with int8 activations, {torch.get_num_threads()} "
          f"threads, {args.rounds} alternated rounds; ms/token, median [min-max]\n")
    print("| arm | prefill ms/token |\n|---|---:|")
    for name, v in times.items():
        print(f"| {name} | {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}] |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
