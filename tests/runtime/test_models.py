"""Real models end to end: extract on meta -> compile -> .npubin -> load -> weights from safetensors -> run,
compared with PyTorch eager: top-5 classes (near-ties allowed to swap) and max abs error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import npu_compiler
import torch_ir
from npu_compiler.compiled_program import CompiledProgram
from npu_runtime import Device, Executor, load_weights
from torch_ir.verify import default_tolerance
from torch_ir.weights import module_state

from ..helpers import assert_topk_match, randomize_batch_norm

transformers = pytest.importorskip("transformers")


def end_to_end(factory: Callable[[], torch.nn.Module], inputs: dict[str, torch.Tensor], tmp_path, name: str,
               ) -> tuple[CompiledProgram, torch.Tensor, torch.Tensor]:
    """(program as loaded from disk, our logits, eager logits)."""
    with torch.device("meta"):
        meta = factory().eval()
    meta_inputs = {k: torch.empty_like(v, device="meta") for k, v in inputs.items()}
    ir = torch_ir.extract_ir(meta, (), example_kwargs=meta_inputs, model_name=name)
    npu_compiler.compile(ir).save(tmp_path / f"{name}.npubin")
    program = CompiledProgram.load(tmp_path / f"{name}.npubin")

    torch.manual_seed(0)
    real = randomize_batch_norm(factory().eval(), seed=1)
    torch_ir.save_weights(module_state(real), tmp_path / f"{name}.safetensors")
    device = Device()
    weights = load_weights(tmp_path / f"{name}.safetensors", program, device)
    outputs = Executor(program, device).run({k: v.numpy() for k, v in inputs.items()}, weights=weights)
    assert list(outputs) == ["output"]
    ours = torch.from_numpy(outputs["output"].to_numpy())
    with torch.no_grad():
        ref = real(**inputs).logits
    return program, ours, ref


def check_logits(ours: torch.Tensor, ref: torch.Tensor, *, scale: float = 1.0) -> None:
    """Max abs error within float32's tolerance scaled to the logits' magnitude; then the top-5 classes."""
    assert ours.shape == ref.shape and ours.dtype == ref.dtype == torch.float32
    rtol, atol = default_tolerance(torch.float32)
    bound = scale * (atol + rtol * float(ref.abs().max()))
    error = float((ours - ref).abs().max())
    assert error <= bound, f"max abs error {error:.3g} > {bound:.3g} (logits up to {float(ref.abs().max()):.3g})"
    assert_topk_match(ours, ref, k=5, atol=bound)


def image(seed: int = 0) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(seed))}


def resnet(**config: Any) -> Callable[[], torch.nn.Module]:
    cfg = transformers.ResNetConfig(embedding_size=64, num_labels=1000, **config)
    return lambda: transformers.ResNetForImageClassification(cfg)


def test_resnet18(tmp_path):
    factory = resnet(hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic")
    program, ours, ref = end_to_end(factory, image(), tmp_path, "resnet18")
    check_logits(ours, ref)
    # 20 convolutions: the stem, 2 per basic block x 8, and a 1x1 shortcut in stages 2-4. Each block's
    # last conv takes its residual add (and relu): 8 of the 20 CONVs; then max pool, mean, the GEMM.
    assert program.kernel_histogram() == {"CONV": 20, "GEMM": 1, "aten.max_pool2d.default": 1, "aten.mean.dim": 1}
    assert sum(bool(d.params.get("has_residual")) for d in program.dispatches) == 8
    assert program.dispatch_count == 23
    # identity blocks accumulate in place: stage 1's two blocks and the second block of stages 2-4
    assert sum(bool(d.params.get("inplace_residual")) for d in program.dispatches) >= 5
    assert program.memory.arena_bytes < program.memory.no_reuse_bytes


@pytest.mark.slow
def test_resnet50(tmp_path):
    factory = resnet(hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3], layer_type="bottleneck")
    program, ours, ref = end_to_end(factory, image(1), tmp_path, "resnet50")
    check_logits(ours, ref)
    # 53 convolutions: the stem, 3 per bottleneck x 16, and a 1x1 shortcut in each of the 4 stages;
    # 16 of them (each block's last) take the residual add: 53 CONV + pool + mean + GEMM.
    assert program.kernel_histogram() == {"CONV": 53, "GEMM": 1, "aten.max_pool2d.default": 1, "aten.mean.dim": 1}
    assert sum(bool(d.params.get("has_residual")) for d in program.dispatches) == 16
    assert program.dispatch_count == 56


def test_bert_masked_lm(tmp_path):
    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=512, attn_implementation="eager")
    gen = torch.Generator().manual_seed(2)
    mask = torch.ones(1, 16, dtype=torch.long)
    mask[0, 11:] = 0
    mask[0, 3] = 0
    inputs = {"input_ids": torch.randint(0, config.vocab_size, (1, 16), generator=gen), "attention_mask": mask}
    program, ours, ref = end_to_end(lambda: transformers.BertForMaskedLM(config), inputs, tmp_path, "bert")
    assert ours.shape == (1, 16, config.vocab_size)
    assert [(s.name, s.dtype) for s in program.input_specs] == [("input_ids", "int64"), ("attention_mask", "int64")]
    check_logits(ours, ref)


def test_vit(tmp_path):
    config = transformers.ViTConfig(hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
                                    intermediate_size=768, num_labels=1000, image_size=224,
                                    attn_implementation="eager")
    program, ours, ref = end_to_end(lambda: transformers.ViTForImageClassification(config), image(3), tmp_path,
                                    "vit")
    assert "CONV" in program.kernel_histogram()  # the patch embedding
    check_logits(ours, ref)
