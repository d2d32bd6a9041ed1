"""Normalization on full-size configs: node counts before/after and the NPU op histogram per layer.

    .venv/bin/python bench/normalize/run.py            # Qwen2-0.5B-shaped and BERT-base-shaped, on meta

Models are built from transformers configs on the meta device (no weights), extracted with
``extract_ir`` and normalized; nodes are assigned to a layer by the layer index in the weight names
they read (``layers.7.``), and nodes that read no layer weight belong to the layer of the last one
that did (or to "embed" before the first layer).
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from npu_compiler.passes import normalize  # noqa: E402
from torch_ir import extract_ir  # noqa: E402
from torch_ir.ops.npu import NPU_OPS  # noqa: E402


def qwen2_0_5b():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True, use_cache=False)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config).eval()
    ids = torch.zeros(1, 128, dtype=torch.long)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def bert_base():
    from transformers import BertConfig, BertModel

    with torch.device("meta"):
        model = BertModel(BertConfig()).eval()
    ids = torch.zeros(1, 128, dtype=torch.long)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


_LAYER = re.compile(r"layers?[._](\d+)[._]")


def per_layer(ir) -> dict[str, Counter]:
    weights = {t.name for t in ir.weights}
    layers: dict[str, Counter] = {}
    current = "embed"
    for n in ir.nodes:
        found = [_LAYER.search(ir.weight_name_mapping.get(t.name, t.name)) for t in n.inputs if t.name in weights]
        if found and any(found):
            current = f"layer {int(next(f for f in found if f).group(1))}"
        elif found and current != "embed":
            current = "head"  # the final norm and the LM head read weights of no layer
        layers.setdefault(current, Counter())[n.op_type] += 1
    return layers


def main() -> None:
    for name, build in (("Qwen2-0.5B", qwen2_0_5b), ("BERT-base", bert_base)):
        model, kwargs = build()
        t0 = time.perf_counter()
        ir = extract_ir(model, (), model_name=name, example_kwargs=kwargs)
        t1 = time.perf_counter()
        npu = normalize(ir)
        t2 = time.perf_counter()
        print(f"\n## {name}: {len(ir.nodes)} nodes -> {len(npu.nodes)} nodes "
              f"(extract {t1 - t0:.1f} s, normalize {t2 - t1:.1f} s)\n")
        layers = per_layer(npu)
        before = per_layer(ir)
        ops = sorted({op for c in layers.values() for op in c if op in NPU_OPS})
        print("| part | nodes before | nodes after | " + " | ".join(ops) + " | other ops |")
        print("|---|---|---|" + "---|" * len(ops) + "---|")
        rows = list(layers.items())
        shown = rows[:3] + ([("...", None)] if len(rows) > 5 else []) + rows[-2:] if len(rows) > 5 else rows
        for part, counts in shown:
            if counts is None:
                print("| ... |" + " |" * (len(ops) + 3))
                continue
            other = sum(v for k, v in counts.items() if k not in NPU_OPS)
            cells = " | ".join(str(counts.get(op, 0)) for op in ops)
            n_before = sum(before.get(part, Counter()).values())
            print(f"| {part} | {n_before} | {sum(counts.values())} | {cells} | {other} |")
        same = len({tuple(sorted(c.items())) for p, c in layers.items() if p.startswith("layer")})
        print(f"\nall {sum(p.startswith('layer') for p in layers)} layers have the same op histogram: {same == 1}")
        print("NPU ops in total: " + ", ".join(f"{k} {v}" for k, v in npu.op_histogram().items() if k in NPU_OPS))


if __name__ == "__main__":
    main()
