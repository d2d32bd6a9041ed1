"""torch-ir compile --buckets and torch-ir run on the one file it writes, as a user types them (issue 31)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from npu_program.dynamic import DynamicProgram
from npu_tools.cli import main
from npu_tools.zoo.runner import resolve_spec


def extract_mhsa(tmp_path):
    """The zoo's causal attention (symbolic seq) as an IR file and its seeded weights."""
    ir, weights = tmp_path / "mhsa.json", tmp_path / "mhsa.safetensors"
    assert main(["extract", "mhsa", "-o", str(ir), "--save-weights", str(weights)]) == 0
    return ir, weights


def run_against_eager(tmp_path, program, weights, seq: int, seed: int) -> None:
    """``torch-ir run`` on an input of ``seq`` tokens, its outputs checked against eager."""
    x = torch.randn(2, seq, 32, generator=torch.Generator().manual_seed(seed))
    np.save(tmp_path / "x.npy", x.numpy())
    out = tmp_path / "out.npz"
    assert main(["run", str(program), "--weights", str(weights), "--input", f"x={tmp_path / 'x.npy'}",
                 "-o", str(out)]) == 0
    with torch.no_grad():
        expected = resolve_spec("mhsa").build("cpu")(x).numpy()
    np.testing.assert_allclose(np.load(out)["output"], expected, rtol=1e-4, atol=1e-5)


def test_compile_buckets_then_run_at_a_length_between_edges(tmp_path, capsys):
    ir, weights = extract_mhsa(tmp_path)
    program = tmp_path / "mhsa.npubin"
    assert main(["compile", str(ir), "--buckets", "seq=8,16,32", "--weights", str(weights),
                 "-o", str(program)]) == 0
    captured = capsys.readouterr()
    assert "variant 3/3: seq=32" in captured.err
    assert "3 variants" in captured.out and "seq 2..32: padded (x[1]=0)" in captured.out  # causal: padding is safe
    assert isinstance(DynamicProgram.load(program), DynamicProgram)
    run_against_eager(tmp_path, program, weights, seq=11, seed=0)
    assert "bucket seq=16" in capsys.readouterr().out


def test_an_onnx_file_compiles_per_bucket(tmp_path, capsys):
    pytest.importorskip("transformers")
    from tests.dynamic.models import vit_onnx

    path = vit_onnx(tmp_path / "vit.onnx")
    out = tmp_path / "vit.npubin"
    assert main(["compile", str(path), "--buckets", "batch=1,2,4", "-o", str(out)]) == 0
    assert "batch 1..4: padded (pixel_values[0]=0)" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--buckets", "seq=8,x"], "--buckets 'seq=8,x': expected SYMBOL=S1,S2,..."),
    (["--buckets", "seq=8", "seq=16"], "--buckets seq= is given twice"),
    (["--range", "seq=8:32"], "--range: used only with --buckets"),
    (["--buckets", "seq=8,16", "--range", "seq=8-16"], "--range 'seq=8-16': expected SYMBOL=LO:HI"),
    (["--buckets", "seq=8,16", "--pad-value", "x=zero"], "--pad-value 'x=zero': expected INPUT=VALUE"),
    (["--buckets", "seq=8,16", "--range", "seq=2:64"], "do not cover seq 2..64 asked for: the largest bucket is 16"),
    (["--buckets", "seq=8,128"], "bucket seq=128 is outside the range the model was exported for"),
])
def test_bad_flags_get_one_clear_error_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "p.npubin"
    assert main(["compile", "mhsa", "-o", str(out), *argv]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_compile_upper_bound_then_run(tmp_path, capsys):
    ir, weights = extract_mhsa(tmp_path)
    program = tmp_path / "mhsa.npubin"
    assert main(["compile", str(ir), "--upper-bound", "--range", "seq=4:48", "-o", str(program)]) == 0
    assert "one program planned for the upper bound (seq=48)" in capsys.readouterr().out
    run_against_eager(tmp_path, program, weights, seq=13, seed=1)
    assert "sized at seq=13" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--upper-bound", "--buckets", "seq=8"], "give one of them"),
    (["--upper-bound", "--no-padding"], "an upper-bound program is never padded"),
    (["--upper-bound", "--range", "seq=1:64"], "not inside the range the model was exported for (2..64)"),
])
def test_bad_upper_bound_flags(tmp_path, capsys, argv, message):
    assert main(["compile", "mhsa", "-o", str(tmp_path / "p.npubin"), *argv]) != 0
    assert message in capsys.readouterr().err


def test_an_onnx_file_without_buckets_is_sent_to_import_onnx(tmp_path, capsys):
    (tmp_path / "m.onnx").write_bytes(b"")
    assert main(["compile", str(tmp_path / "m.onnx")]) != 0
    assert "static program, import it first (torch-ir" in capsys.readouterr().err


def test_cost_takes_a_dynamic_program_bucket_by_bucket(tmp_path, capsys):
    from npu_compiler.costmodel import cost_program, load_hardware
    from npu_program.npubin_dynamic import load_program

    program = tmp_path / "mhsa.npubin"
    assert main(["compile", "mhsa", "--buckets", "seq=8,32", "-o", str(program)]) == 0
    capsys.readouterr()
    assert main(["cost", str(program), "--hw", "edge_4tops", "--dtype", "fp32", "-o", str(tmp_path / "cost")]) == 0
    out = capsys.readouterr().out
    assert "== bucket seq8" in out and "== bucket seq32" in out
    hw = load_hardware("edge_4tops")
    for variant in load_program(program).variants:  # each bucket's report is the cost model's on that variant
        expected = cost_program(variant.program, hw, dtype="fp32")
        rows = (tmp_path / "cost" / f"seq{variant.sizes['seq']}" / "cost.csv").read_text().splitlines()
        assert len(rows) - 1 >= len(expected.rows) and f"{expected.total_cycles:,}" in out
