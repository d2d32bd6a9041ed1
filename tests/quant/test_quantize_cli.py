"""``torch-ir quantize``: a model in, a quantized IR and its weights out; bad flags refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from npu_tools.cli import main
from torch_ir.executor import IRExecutor
from torch_ir.ir import load_ir


def _npz_dir(path, shape, n=4, dtype=np.float32):
    path.mkdir()
    for i in range(n):
        np.savez(path / f"{i:02d}.npz", x=np.random.default_rng(i).standard_normal(shape).astype(dtype))
    return path


def test_zoo_model_w8a8_with_npz_calibration_and_an_override(tmp_path, capsys):
    calib = _npz_dir(tmp_path / "cal", (2, 3, 16, 16))
    out = tmp_path / "q"
    assert main(["quantize", "convnet", "--preset", "w8a8", "--calibration", str(calib), "--samples", "3",
                 "--override", "head=float", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    ir, weights = load_ir(out / "convnet.quant.json"), load_file(out / "convnet.quant.safetensors")
    assert ir.metadata["quantize"]["preset"] == "w8a8"
    assert weights["features.0.0.weight"].dtype == torch.int8 and weights["head.weight"].dtype == torch.float32
    y = IRExecutor(ir, weights).run([torch.randn(2, 3, 16, 16)])[0]
    assert y.shape == (2, 10) and torch.isfinite(y).all()


def test_ir_file_with_weights_weight_only(tmp_path, capsys):
    ir_path, w_path = tmp_path / "mlp.json", tmp_path / "mlp.safetensors"
    assert main(["extract", "mlp", "-o", str(ir_path), "--save-weights", str(w_path)]) == 0
    assert main(["quantize", str(ir_path), "--weights", str(w_path), "--preset", "w4a16_g16", "-o",
                 str(tmp_path / "q")]) == 0
    ir = load_ir(tmp_path / "q" / "mlp.quant.json")
    assert {w.quant.dtype for w in ir.weights if w.quant} == {"uint4"}
    assert main(["quantize", str(ir_path), "--preset", "w8a16", "-o", str(tmp_path / "q2")]) == 2
    assert "give its weights with --weights FILE" in capsys.readouterr().err
    assert not (tmp_path / "q2").exists()


def test_unknown_preset_and_bad_override_are_one_line_errors(tmp_path, capsys):
    assert main(["quantize", "mlp", "--preset", "int3", "-o", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown quantization preset 'int3'" in err and "w4a16" in err
    assert main(["quantize", "mlp", "--preset", "w8a8", "-o", str(tmp_path / "q")]) == 2
    assert "--preset w8a8 quantizes activations: give --calibration DIR" in capsys.readouterr().err
    assert main(["quantize", "mlp", "--override", "head", "-o", str(tmp_path / "q")]) == 2
    assert "--override 'head': expected PATTERN=PRESET" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_calibration_of_the_wrong_shape_names_the_file_and_input(tmp_path, capsys):
    calib = _npz_dir(tmp_path / "cal", (2, 3, 8, 8), n=2)
    assert main(["quantize", "convnet", "--calibration", str(calib), "-o", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err
    assert "00.npz: input 'x' has shape [2, 3, 8, 8]" in err and "float32[2, 3, 16, 16]" in err
    assert not (tmp_path / "q").exists()  # nothing written on error


@pytest.mark.slow
def test_llm_checkpoint_calibrated_on_a_text(tmp_path, capsys):
    pytest.importorskip("transformers")
    from tests.llm.checkpoints import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "tiny")
    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. Hello world! " * 4)
    out = tmp_path / "q"
    assert main(["quantize", str(ckpt), "--preset", "w4a16", "--kv-bits", "8", "--calibration-text", str(text),
                 "--samples", "2", "--seq-len", "8", "--max-cache-len", "32", "-o", str(out)]) == 0
    ir, weights = load_ir(out / "tiny.quant.json"), load_file(out / "tiny.quant.safetensors")
    assert sum(n.op_type == "QUANTIZE" for n in ir.nodes) == 4  # the four cache writes
    ids = torch.tensor([[5, 6, 7, 8]])
    logits = IRExecutor(ir, weights).run({"input_ids": ids, "cache_position": torch.arange(4)})[0]
    assert logits.shape == (1, 1, 320) and torch.isfinite(logits).all()
    assert main(["quantize", "mlp", "--calibration-text", str(text), "-o", str(tmp_path / "q2")]) == 2
    assert "--calibration-text needs a Hugging Face checkpoint directory" in capsys.readouterr().err


def test_report_compares_with_float_and_proposes_mixed_precision(tmp_path, capsys):
    calib = _npz_dir(tmp_path / "cal", (2, 3, 16, 16))
    out, report = tmp_path / "q", tmp_path / "report"
    assert main(["quantize", "convnet", "--preset", "w4a8", "--calibration", str(calib), "--samples", "3", "-o",
                 str(out), "--report", str(report), "--target-sqnr", "45", "--hw", "edge_4tops"]) == 0
    printed = capsys.readouterr().out
    assert "SQNR" in printed and "report.html" in printed
    rows = (report / "accuracy.csv").read_text().splitlines()
    assert rows[0].startswith("index") or "sqnr" in rows[0].lower()
    assert any("conv" in r for r in rows[1:]), rows
    pareto = (report / "pareto.csv").read_text().splitlines()
    assert len(pareto) >= 3 and "cycles" in pareto[0], pareto  # the base and the assignments tried, costed
    assert "<html" in (report / "report.html").read_text().lower()


def test_report_flags_without_what_they_need_are_refused_before_any_work(tmp_path, capsys):
    assert main(["quantize", "mlp", "--preset", "w8a16", "--target-sqnr", "30", "-o", str(tmp_path / "q")]) == 2
    assert "--report DIR" in capsys.readouterr().err
    assert main(["quantize", "mlp", "--preset", "w8a16", "--report", str(tmp_path / "r"), "-o",
                 str(tmp_path / "q")]) == 2
    assert "--eval DIR" in capsys.readouterr().err
    assert not (tmp_path / "q").exists() and not (tmp_path / "r").exists()
