"""``bisect`` with ``--weights`` (issue 26, item 3): the weights reach the model, every report names them, a bad
file or a source with weights of its own is one line before any work, and a factory's error is shown whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from npu_tools.cli import main
from npu_tools.debug import sources
from npu_tools.debug.bisect import bisect
from torch_ir.errors import ExtractionError
from torch_ir.weights import module_state, save_weights

HERE = "tests.debug.test_bisect_weights"
SPEC = f"{HERE}:tied_factory"
IDS = torch.tensor([[1, 4, 9, 2, 7]])
CALLS = {"tied_factory": 0}
PRETRAINED: dict[str, Path] = {}  # the directory pretrained_factory loads, set by its test


class Tied(nn.Module):
    """An embedding whose weight the output head shares (saved once by save_weights) and a non-persistent buffer
    (which module_state saves and a state dict leaves out)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.tensor(0.5), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.norm(self.emb(ids)) * self.scale))


def tied_factory() -> tuple[nn.Module, tuple]:
    CALLS["tied_factory"] += 1
    return Tied().eval(), (IDS,)


def failing_factory() -> tuple[nn.Module, tuple]:
    try:
        raise ValueError("inner cause: the checkpoint server refused the download; " + "details " * 40 + "END")
    except ValueError as e:
        raise RuntimeError("outer") from e


def pretrained_factory() -> tuple[nn.Module, tuple]:
    """A factory that loads real weights itself, as most do: it cannot run under the meta device."""
    from transformers import BertModel

    return BertModel.from_pretrained(PRETRAINED["dir"], attn_implementation="eager").eval(), (IDS,)


@pytest.fixture
def trained(tmp_path: Path) -> tuple[nn.Module, Path]:
    """A Tied with other weights than the factory's seeded ones, and its weights file."""
    torch.manual_seed(123)
    model = Tied().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 2.0)  # not the factory's ones
    path = tmp_path / "tied.safetensors"
    save_weights(module_state(model), path)  # the tied weight once, the non-persistent buffer too
    return model, path


def capture_subjects(monkeypatch: pytest.MonkeyPatch) -> list:
    """The subjects bisect loads from here on (it imports load_subject when it runs)."""
    made = []
    real = sources.load_subject

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(sources, "load_subject", spy)
    return made


def test_weights_file_reaches_the_factory_model(trained, monkeypatch, tmp_path, capsys):
    model, path = trained
    subjects = capture_subjects(monkeypatch)
    out = tmp_path / "out"
    code = main(["bisect", SPEC, "--weights", str(path), "--stage", "extracted", "--stage", "compiled:cpu",
                 "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    (subject,) = subjects
    with torch.no_grad():
        expected = model(*subject.inputs)
        seeded = tied_factory()[0](*subject.inputs)
    (trusted,) = subject.run_trusted()
    torch.testing.assert_close(trusted, expected, rtol=0, atol=0)  # eager PyTorch ran on the file's weights
    assert not torch.allclose(trusted, seeded)  # and not on the factory's seeded ones
    assert torch.equal(subject.weights["emb.weight"], model.emb.weight.detach())  # so did the IR (stages agree)
    assert torch.equal(subject.weights["head.weight"], model.emb.weight.detach())  # the tied name, stored once

    where = os.path.abspath(path)
    data = json.loads((out / "report.json").read_text())
    assert data["weights"] == {"kind": "file", "text": where, "path": where, "seed": None}
    assert f"weights: {where}" in captured.out
    assert where in (out / "report.md").read_text() and where in (out / "report.html").read_text()


def test_missing_weights_file_is_one_line_before_any_work(capsys):
    calls = CALLS["tied_factory"]
    missing = "/nonexistent/tied.safetensors"
    assert main(["bisect", SPEC, "--weights", missing]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and missing in err and err.startswith("torch-ir bisect: error:"), err
    assert CALLS["tied_factory"] == calls  # the factory never ran


def test_weights_of_another_model_are_refused_naming_the_file(trained, tmp_path, capsys):
    model, _ = trained
    state = module_state(model)
    cases = {
        "shape": {**state, "emb.weight": torch.zeros(12, 8)},  # another vocabulary
        "missing": {k: v for k, v in state.items() if k != "norm.bias"},  # norm.bias would stay seeded
        "extra": {**state, "encoder.weight": torch.zeros(2)},  # a key the model has no place for
    }
    messages = {"shape": "size mismatch for emb.weight", "missing": "norm.bias", "extra": "encoder.weight"}
    for case, bad in cases.items():
        path = tmp_path / f"{case}.safetensors"
        save_weights(bad, path)
        assert main(["bisect", SPEC, "--weights", str(path), "--stage", "extracted"]) == 2, case
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(path) in err and messages[case] in err, err


def test_reports_name_the_weights_without_a_file():
    assert bisect(SPEC, stages=["extracted"], progress=False).to_dict()["weights"]["text"] == \
        "the factory's own weights"
    zoo = bisect("mlp", stages=["extracted"], progress=False)
    assert zoo.to_dict()["weights"] == {"kind": "seeded", "text": "seeded random weights (seed 0)", "path": None,
                                        "seed": 0}
    assert "weights: seeded random weights (seed 0)" in zoo.summary()


def test_weights_are_refused_for_sources_with_their_own(tmp_path, capsys):
    onnx_file = tmp_path / "model.onnx"  # never read: the flag is refused first
    for source in (str(onnx_file), "tinygrad:some.module:factory"):
        assert main(["bisect", source, "--weights", str(tmp_path / "w.safetensors")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--weights cannot be used with" in err, err
        assert "weights=" not in err  # the command line's vocabulary, not Python's


def test_factory_error_is_shown_whole(capsys):
    spec = f"{HERE}:failing_factory"
    with pytest.raises(ExtractionError) as info:
        sources.load_subject(spec)
    assert isinstance(info.value.__cause__, RuntimeError)  # a traceback shows the factory's frames
    assert main(["bisect", spec]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "raised RuntimeError('outer'), caused by ValueError('inner cause: the checkpoint server" in err
    assert "details " * 40 + "END')" in err  # the cause's whole message, not cut in the middle


def test_from_pretrained_factory_is_the_trusted_source(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(7)
    config = transformers.BertConfig(vocab_size=10, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=8)
    transformers.BertModel(config).save_pretrained(tmp_path / "bert")
    monkeypatch.setitem(PRETRAINED, "dir", tmp_path / "bert")
    subjects = capture_subjects(monkeypatch)
    report = bisect(f"{HERE}:pretrained_factory", stages=["extracted", "compiled:cpu"], progress=False)
    assert report.ok, report.summary()
    assert report.weights.text == "the factory's own weights"
    (subject,) = subjects
    reference = transformers.BertModel.from_pretrained(tmp_path / "bert", attn_implementation="eager").eval()
    with torch.no_grad():
        expected = reference(*subject.inputs).last_hidden_state
    torch.testing.assert_close(subject.run_trusted()[0], expected, rtol=0, atol=0)


def test_exception_chain_is_described_whole():
    from torch_ir.factory_spec import describe_exception

    class BadRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    try:
        try:
            raise KeyError("k")
        except KeyError:
            raise LookupError(2, "gone") from None  # the context suppressed: not shown
    except LookupError as e:
        assert describe_exception(e) == "LookupError(2, 'gone')"
    try:
        try:
            raise ValueError("line one\nline two")
        except ValueError:
            raise TypeError(BadRepr())  # noqa: B904 - raised while handling another: the context is shown
    except TypeError as e:
        assert describe_exception(e) == ("TypeError(<BadRepr whose repr() fails>), raised while handling "
                                         "ValueError('line one\\nline two')")
    looped = RuntimeError("a")
    looped.__cause__ = ValueError("b")
    looped.__cause__.__cause__ = looped  # a chain that loops ends where it repeats
    assert describe_exception(looped) == "RuntimeError('a'), caused by ValueError('b')"
    assert describe_exception(SystemExit(None)) == "SystemExit(None)"
