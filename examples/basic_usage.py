"""Basic usage: extract an MLP's IR on the meta device, save it, load it, run it, verify it.

    python examples/basic_usage.py [output_dir]
"""

import sys
import tempfile
from pathlib import Path

import torch

import torch_ir


class MLP(torch.nn.Module):
    def __init__(self, d_in: int = 32, d_hidden: int = 64, d_out: int = 10):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, d_in) -> (B, d_out)
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def main(out_dir: Path) -> bool:
    # 1. Build on the meta device and extract: no weight is ever allocated.
    with torch.device("meta"):
        meta_model = MLP()
    ir = torch_ir.extract_ir(meta_model.eval(), (torch.randn(4, 32),), model_name="mlp")
    print(ir)

    # 2. Save and load: JSON, checked field by field on load.
    path = out_dir / "mlp_ir.json"
    ir.save(path)
    ir = torch_ir.load_ir(path)

    # 3. Execute with real weights and compare with PyTorch eager.
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 32)
    (y,) = torch_ir.IRExecutor(ir, model.state_dict()).run([x])
    print(f"max |IR - eager| = {(y - model(x)).abs().max().item():.2e}")

    # 4. The verifier does the same and reports per output (and per node when they differ).
    ok, report = torch_ir.verify_ir_with_state_dict(
        ir=ir, state_dict=model.state_dict(), original_model=model, test_inputs=(x,))
    print(report)
    print(f"Verification: {'PASSED' if ok else 'FAILED'}")
    return ok


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp)
        sys.exit(0 if main(out) else 1)
