"""ResNet-18 (transformers, seeded random weights): weight-free extraction, statistics, Mermaid, verification.

    python examples/resnet_example.py [output_dir]
"""

import sys
import tempfile
from pathlib import Path

import torch
from transformers import ResNetConfig, ResNetForImageClassification

import torch_ir
from torch_ir.report import ir_statistics, markdown_report

CONFIG = ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], num_labels=1000)


def main(out_dir: Path) -> bool:
    with torch.device("meta"):
        meta_model = ResNetForImageClassification(CONFIG).eval()
    image = torch.randn(1, 3, 224, 224)
    ir = torch_ir.extract_ir(meta_model, (), model_name="resnet18", example_kwargs={"pixel_values": image})
    stats = ir_statistics(ir)
    print(stats)
    ir.save(out_dir / "resnet18.json")

    torch.manual_seed(0)
    model = ResNetForImageClassification(CONFIG).eval()
    ok, report = torch_ir.verify_ir(ir, model.state_dict(), model, (), test_kwargs={"pixel_values": image})
    print(report)
    (out_dir / "resnet18.md").write_text(markdown_report(ir, stats, report))
    print(f"wrote {out_dir / 'resnet18.json'} and {out_dir / 'resnet18.md'}")
    print(f"Verification: {'PASSED' if ok else 'FAILED'}")
    return ok


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp)
        sys.exit(0 if main(out) else 1)
