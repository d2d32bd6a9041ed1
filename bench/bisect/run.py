"""Bisecting a 24-layer Qwen2-0.5B-shaped model with an injected fault: the stage table and the time.

    .venv/bin/python bench/bisect/run.py                 # fault: a wrong RMS_NORM epsilon in the rms_norm rule
    .venv/bin/python bench/bisect/run.py --fault kernel  # fault: the CPU RMS_NORM kernel off by 0.1
    .venv/bin/python bench/bisect/run.py --fault none    # no fault: every stage agrees

The model is transformers' Qwen2ForCausalLM with the Qwen2-0.5B config (hidden 896, 24 layers, 14/2 heads, FFN
4864, vocabulary 151,936, tied embeddings) and seeded random weights, on a short prompt (8 tokens). The issue asks
for the whole bisection under 2 minutes; the time of loading the subject (building the model, extracting it on
meta, the eager reference) is printed apart from the bisection's own. The WebGPU stage is left out (on a software
adapter its shaders alone take minutes for this model); the rule fault is found before any compiled stage runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch

from npu_compiler.passes import pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from npu_tools.debug.bisect import bisect  # noqa: E402
from npu_tools.debug.sources import subject_from_torch  # noqa: E402
from npu_tools.debug.stages import STAGE_NAMES  # noqa: E402

NORMALIZE = pipeline
RULES = {r.name: r for r in NORMALIZE.ALL_RULES}


def qwen2_0_5b(tokens: int = 8) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.initialization import no_init_weights

    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True, use_cache=False, attn_implementation="sdpa")
    with no_init_weights():  # transformers' own initialization of 0.5 B parameters takes twice as long as this
        model = Qwen2ForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02, generator=generator)
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    return model, (ids,)


def _wrong_epsilon(m):
    nodes = RULES["rms_norm"].replace(m)
    return None if nodes is None else [dataclasses.replace(n, attrs={**n.attrs, "eps": 0.5}) for n in nodes]


def inject(fault: str) -> None:
    """Break one thing in this process (as the tests do)."""
    if fault == "rule":
        bad = dataclasses.replace(RULES["rms_norm"], replace=_wrong_epsilon)
        NORMALIZE.STAGES = [(s, [bad if r.name == bad.name else r for r in rules]) for s, rules in NORMALIZE.STAGES]
        NORMALIZE.ALL_RULES = [bad if r.name == bad.name else r for r in NORMALIZE.ALL_RULES]
    elif fault == "kernel":
        from npu_program.kernels import KERNELS
        from npu_runtime.backends import cpu_kernels, cpu_transformer

        class OffRmsNorm(cpu_transformer.RmsNorm):
            def run(self, inputs, outputs):
                super().run(inputs, outputs)
                outputs[0].add_(0.1)

        cpu_kernels.OffRmsNorm = OffRmsNorm
        KERNELS["RMS_NORM"].impls["cpu"] = "npu_runtime.backends.cpu_kernels:OffRmsNorm"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", choices=("rule", "kernel", "none"), default="rule")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    started = time.perf_counter()
    model, inputs = qwen2_0_5b(args.tokens)
    subject = subject_from_torch(model, inputs, name="qwen2-0.5b-shaped")
    loaded = time.perf_counter() - started
    print(f"subject: {len(subject.ir.nodes)} extracted nodes, loaded in {loaded:.1f} s", file=sys.stderr)
    inject(args.fault)
    stages = [s for s in STAGE_NAMES if s != "compiled:webgpu"]
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        report = bisect(subject, stages=stages, out_dir=out)
        seconds = time.perf_counter() - t0
        print(report.summary())
    total = time.perf_counter() - started
    print()
    print("| fault | first bad stage | finding | load s | bisect s | total s |")
    print("|---|---|---|---:|---:|---:|")
    f = report.finding
    named = "none" if f is None else f"{f.kind}: " + (f.rule or f.kernel or f.converter or f.node or "?")
    print(f"| {args.fault} | {report.first_bad or '-'} | {named} | {loaded:.1f} | {seconds:.1f} | {total:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
