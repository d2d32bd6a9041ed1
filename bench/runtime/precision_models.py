"""The models of ``precision.py``: built from configs with seeded weights (nothing downloaded), their inputs, their
ONNX files (float, and the per-channel QDQ model every int8 runner uses), and how a runner's output is compared
with the fp32 PyTorch model's.

ResNet-18 and ResNet-50 are ``run.py``'s (``run.build_models``: transformers ``ResNetForImageClassification``,
batch norms randomized) at 224x224, compared by their top-5 classes. BERT-base is transformers ``BertModel``
(12 layers, hidden 768, eager attention) at sequence 128 with the last eighth of the tokens masked out, compared by
its pooled output (``pooler_output``, 768 wide): max abs error and cosine. ``quick`` shrinks every input and BERT
itself, for the smoke test; the names stay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from qdq import export_for_quantization, quantize_qdq
from run import build_models

from torch_ir import extract_ir
from torch_ir.ir import NPU_IR

MODELS = ("resnet18", "resnet50", "bert")
IMAGE_SIZE = {False: 224, True: 32}  # quick -> height and width
BERT_SEQ = {False: 128, True: 16}
BERT_QUICK = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64)
CALIBRATION = {False: 8, True: 2}  # seeded random inputs quantize_static calibrates the activations on
TOP_K = 5
# An fp32 runner whose pooled output is further than this from PyTorch's computes something else: float32
# reassociation over 12 layers moves the cosine by ~1e-7, a wrong mask or weight by far more.
FP32_MIN_COSINE = 0.9999


class Logits(torch.nn.Module):
    """A ResNet classifier as one tensor in, one out (what extract_ir, the exporter and the runners see)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


class Pooled(torch.nn.Module):
    """BERT's pooled output (the [CLS] state through the pooler's dense + tanh), for ids and mask."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).pooler_output


@dataclass
class Model:
    """One benchmark model: the fp32 reference, the IR to compile, and the inputs by ONNX input name."""

    name: str
    kind: str  # "classes" (top-5 agreement) or "embedding" (max abs error and cosine)
    real: torch.nn.Module
    ir: NPU_IR
    feeds: dict[str, np.ndarray]  # the timed input, in the forward's argument order
    calibration: list[dict[str, np.ndarray]]
    shape: str  # for the report: "1x3x224x224", "seq 128"

    def reference(self) -> np.ndarray:
        with torch.no_grad():
            return self.real(*(torch.from_numpy(v) for v in self.feeds.values())).numpy()


def build(name: str, quick: bool) -> Model:
    return (_bert if name == "bert" else _resnet)(name, quick)


def _resnet(name: str, quick: bool) -> Model:
    meta, real = build_models(name)
    size = IMAGE_SIZE[quick]
    g = torch.Generator().manual_seed(2)
    image = lambda: {"pixel_values": torch.randn(1, 3, size, size, generator=g).numpy()}
    feeds = image()
    calibration = [image() for _ in range(CALIBRATION[quick])]
    ir = extract_ir(Logits(meta), (torch.empty(1, 3, size, size, device="meta"),), model_name=name)
    return Model(name, "classes", Logits(real).eval(), ir, feeds, calibration, f"1x3x{size}x{size}")


def _bert(name: str, quick: bool) -> Model:
    from transformers import BertConfig, BertModel

    config = BertConfig(attn_implementation="eager", **(BERT_QUICK if quick else {}))
    seq = BERT_SEQ[quick]
    with torch.device("meta"):
        meta = Pooled(BertModel(config).eval())
    torch.manual_seed(0)
    real = Pooled(BertModel(config).eval()).eval()
    g = torch.Generator().manual_seed(2)

    def tokens() -> dict[str, np.ndarray]:
        mask = torch.ones(1, seq, dtype=torch.long)
        mask[0, seq - seq // 8:] = 0  # padding at the end: the mask must reach the attention
        ids = torch.randint(3, config.vocab_size, (1, seq), generator=g)
        return {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}

    feeds = tokens()
    calibration = [tokens() for _ in range(CALIBRATION[quick])]
    # two tensors: export takes one tensor passed twice for one input used twice (the ids would read the mask)
    example = tuple(torch.zeros(1, seq, dtype=torch.long, device="meta") for _ in feeds)
    ir = extract_ir(meta, example, model_name=name)
    return Model(name, "embedding", real, ir, feeds, calibration, f"seq {seq}")


def onnx_files(model: Model, folder: Path) -> dict[str, Path]:
    """``{"fp32": float file, "int8": its per-channel QDQ model}``: the one float file every float peer runs and
    the one QDQ file every int8 runner runs (ours imports it)."""
    float_path, int8_path = folder / f"{model.name}.onnx", folder / f"{model.name}.qdq.onnx"
    args = tuple(torch.from_numpy(v) for v in model.feeds.values())
    onnx.save(export_for_quantization(model.real, args, list(model.feeds)), float_path)
    quantize_qdq(float_path, int8_path, model.calibration, activation="uint8", weights="int8")
    return {"fp32": float_path, "int8": int8_path}


def agreement(kind: str, reference: np.ndarray, output: np.ndarray) -> dict[str, float | int | str]:
    """How close ``output`` is to the fp32 PyTorch model's: the top-5 classes both have (ResNet) or the max abs
    error and cosine (BERT); ``text`` is the table's cell; ``fp32_ok``: close enough for an fp32 runner (the same
    top-5 in the same order, or ``FP32_MIN_COSINE``), a judgement the table makes for fp32 rows only."""
    got = np.asarray(output, dtype=np.float64).reshape(-1)
    want = np.asarray(reference, dtype=np.float64).reshape(-1)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return {"text": f"wrong output ({got.size} values, finite: {bool(np.all(np.isfinite(got)))})"}
    if kind == "classes":
        top: Callable[[np.ndarray], list[int]] = lambda v: np.argsort(-v, kind="stable")[:TOP_K].tolist()
        common = len(set(top(got)) & set(top(want)))
        same = top(got) == top(want)
        return {"top5_common": common, "top5_same_order": same, "fp32_ok": same,
                "text": f"{common}/{TOP_K}" + ("" if same or common < TOP_K else " (reordered)")}
    error = float(np.max(np.abs(got - want)))
    cosine = float(got @ want / max(np.linalg.norm(got) * np.linalg.norm(want), 1e-30))
    return {"max_abs_error": error, "cosine": cosine, "fp32_ok": cosine >= FP32_MIN_COSINE,
            "text": f"cos {cosine:.5f}, max {error:.1e}"}
