"""Models with symbolic dimensions for the dynamic-program tests: extracted on the meta device with
``torch.export.Dim`` ranges, and their eager twins with seeded weights."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import transformers
from torch.export import Dim

import torch_ir
from torch_ir.ir import NPU_IR

BERT = transformers.BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=128, max_position_embeddings=512, attn_implementation="eager")
VIT = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                             image_size=32, patch_size=8, num_labels=10)


def bert(seq: tuple[int, int] = (8, 512), batch: tuple[int, int] = (1, 8)) -> tuple[torch.nn.Module, NPU_IR]:
    """(eager BertModel with seeded weights, its IR with symbolic ``batch`` and ``seq``)."""
    with torch.device("meta"):
        meta = transformers.BertModel(BERT).eval()
    dims = {0: Dim("batch", min=batch[0], max=batch[1]), 1: Dim("seq", min=seq[0], max=seq[1])}
    example = {"input_ids": torch.zeros(2, 16, dtype=torch.long, device="meta"),
               "attention_mask": torch.ones(2, 16, dtype=torch.long, device="meta")}
    ir = torch_ir.extract_ir(meta, (), example_kwargs=example, model_name="bert_dynamic",
                             dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    torch.manual_seed(0)
    return transformers.BertModel(BERT).eval(), ir


def bert_inputs(batch: int, seq: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids and an attention mask with a few padded positions at the end of the second row."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1:
        mask[1, seq - min(3, seq - 1):] = 0
    return {"input_ids": torch.randint(1, BERT.vocab_size, (batch, seq), generator=g), "attention_mask": mask}


def vit() -> tuple[torch.nn.Module, NPU_IR]:
    """(eager ViT with seeded weights, its IR with a symbolic ``batch``)."""
    with torch.device("meta"):
        meta = transformers.ViTForImageClassification(VIT).eval()
    ir = torch_ir.extract_ir(meta, (), example_kwargs={"pixel_values": torch.zeros(2, 3, 32, 32, device="meta")},
                             model_name="vit_dynamic",
                             dynamic_shapes={"pixel_values": {0: Dim("batch", min=1, max=16)}})
    torch.manual_seed(1)
    return transformers.ViTForImageClassification(VIT).eval(), ir


def vit_onnx(path: Path) -> Path:
    """A ViT exported as a user exports one: the legacy exporter with a dynamic batch axis."""
    torch.manual_seed(2)
    model = transformers.ViTForImageClassification(VIT).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 3, 32, 32),), str(path), input_names=["pixel_values"],
                          output_names=["logits"], dynamo=False,
                          dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}})
    return path


class MeanPool(torch.nn.Module):
    """A mean over the sequence: padding the sequence changes it, so it must never be padded."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).mean(dim=1)


def mean_pool() -> tuple[torch.nn.Module, NPU_IR]:
    torch.manual_seed(3)
    model = MeanPool().eval()
    ir = torch_ir.extract_ir(model, (torch.randn(2, 8, 16),), allow_real_weights=True, model_name="mean_pool",
                             dynamic_shapes={"x": {1: Dim("seq", min=2, max=64)}})
    return model, ir
