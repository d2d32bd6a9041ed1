"""One weight-key matcher: the IR (``match_weights``) and a compiled program (``load_weights``) find a weight
under the same names, tied weights included, in both directions of the alias map."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

import npu_compiler
import torch_ir
from npu_runtime import Device, Executor, load_weights
from npu_runtime.device import RuntimeInputError
from torch_ir.errors import WeightsMismatchError
from torch_ir.weights import find_weight_key, reverse_aliases, tied_keys, weight_key_candidates

from .helpers import assert_outputs_close, build_pair

ALIASES = {"emb.weight": ["head.weight", "out.weight"]}


@pytest.mark.parametrize(("key", "available", "found"), [
    ("emb.weight", {"emb.weight", "head.weight"}, "emb.weight"),  # its own key first
    ("emb.weight", {"head.weight"}, "head.weight"),  # stored under an alias
    ("head.weight", {"emb.weight"}, "emb.weight"),  # an alias's slot, stored under the key (the reverse map)
    ("head.weight", {"out.weight"}, "out.weight"),  # ... or under another alias of the same tensor
    ("head.weight", {"p_w", "emb.weight"}, "emb.weight"),  # state-dict names before the graph name
    ("fc.weight", {"p_w"}, "p_w"),  # the graph name last
    ("fc.weight", {"emb.weight", "head.weight"}, None),  # another tensor's names are not this one's
])
def test_find_weight_key(key, available, found):
    assert find_weight_key(key, "p_w", ALIASES, available) == found
    assert find_weight_key(key, "p_w", ALIASES, available, reverse_aliases(ALIASES)) == found


def test_candidates_and_tied_keys():
    assert reverse_aliases(ALIASES) == {"head.weight": "emb.weight", "out.weight": "emb.weight"}
    assert weight_key_candidates("out.weight", "p_w", ALIASES) == ["out.weight", "emb.weight", "head.weight", "p_w"]
    assert weight_key_candidates("fc.weight", None, ALIASES) == ["fc.weight"]
    assert tied_keys("head.weight", ALIASES) == {"emb.weight", "head.weight", "out.weight"}
    assert tied_keys("fc.weight", ALIASES) == {"fc.weight"}


# -- the IR and the program agree ---------------------------------------------------------------------


class Tied(torch.nn.Module):
    """An embedding whose table is also the output projection (tied input/output embeddings)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


@pytest.fixture(scope="module")
def tied():
    """(ir, program, real model): one weight, the table, keyed ``emb.weight`` with ``head.weight`` tied to it."""
    meta, real = build_pair(Tied)
    ir = torch_ir.extract_ir(meta, (torch.tensor([[1, 2, 3]]),), model_name="tied")
    assert ir.weight_aliases == {"emb.weight": ["head.weight"]}
    program = npu_compiler.compile(ir)
    assert program.metadata["weight_aliases"] == {"emb.weight": ["head.weight"]}
    return ir, program, real


def keyed_by(ir, program, key: str):
    """The IR and the program with their one weight keyed ``key`` (the IR of a frontend that named the tied
    tensor by its other name: the slot's key is then an alias, found through the reverse map)."""
    (slot,) = program.weight_keys
    (name,) = [w.name for w in ir.weights]
    return (dataclasses.replace(ir, weight_name_mapping={**ir.weight_name_mapping, name: key}),
            dataclasses.replace(program, weight_keys={slot: key}))


def run(program, weights, ids: torch.Tensor) -> torch.Tensor:
    (name,) = [s.name for s in program.input_specs]
    outs = Executor(program, Device()).run({name: ids.numpy()}, weights=weights)
    return torch.from_numpy(outs[program.output_specs[0].name].to_numpy())


def test_a_tied_weight_stored_under_the_other_name_loads_in_the_runtime(tied, tmp_path):
    ir, program, real = tied
    path = tmp_path / "tied.safetensors"
    torch_ir.save_weights(real.state_dict(), path)  # the tied tensor stored once, as emb.weight
    ids = torch.tensor([[3, 4, 5]])
    expected = real(ids)
    for key in ("emb.weight", "head.weight"):
        ir_k, program_k = keyed_by(ir, program, key)
        weights = load_weights(path, program_k)  # "head.weight": missing before the runtime used the reverse map
        assert weights.unused == []
        assert_outputs_close([run(program_k, weights, ids)], expected)
        assert_outputs_close(torch_ir.IRExecutor(ir_k, path).run([ids]), expected)


def _stored(names: tuple[str, ...], table: torch.Tensor) -> dict[str, torch.Tensor]:
    """The table under each of ``names``, each copy told apart by an offset (so the name read can be seen)."""
    return {n: table + 100.0 * i for i, n in enumerate(names)}


NAMES = ("emb.weight", "head.weight", "p_emb_weight", "other.weight")


@pytest.mark.parametrize("key", ["emb.weight", "head.weight"])
@pytest.mark.parametrize("names", [c for r in range(1, 4) for c in itertools.combinations(NAMES, r)], ids="+".join)
def test_ir_and_program_find_the_same_weight(tied, key, names):
    ir, program, real = tied
    ir_k, program_k = keyed_by(ir, program, key)
    state = _stored(names, real.emb.weight.detach())
    (slot,) = program.weight_keys
    found = find_weight_key(key, slot, ir.weight_aliases, state)
    try:
        ir_tensor = torch_ir.match_weights(ir_k, state, strict=False)[slot]
    except WeightsMismatchError:
        ir_tensor = None
    try:
        weights = load_weights(state, program_k)
        program_tensor = torch.from_numpy(weights[slot].to_numpy())
    except RuntimeInputError:
        program_tensor = weights = None
    if found is None:
        assert ir_tensor is None and program_tensor is None
        return
    np.testing.assert_array_equal(ir_tensor.numpy(), state[found].numpy())
    np.testing.assert_array_equal(program_tensor.numpy(), state[found].numpy())
    # the names a weight accounts for are the same too: tied names are used, others are not
    assert set(weights.unused) == set(state) - tied_keys(found, ir.weight_aliases)
    strict_ok = not set(weights.unused)
    try:
        torch_ir.match_weights(ir_k, state, strict=True)
        assert strict_ok
    except WeightsMismatchError as e:
        assert not strict_ok and all(n in str(e) for n in weights.unused)
